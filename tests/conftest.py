"""Shared fixtures: a private registry, real clusters, and a process-table safety net.

Every test session gets its own registry folder (NBCLUSTER_RUNTIME_DIR), so tests never see
or stop a developer's clusters. Whatever a test starts is stopped by its fixture; at the end
of the session any supervisor or worker process this session spawned and left behind is
killed and reported as a failure of the session.

Lanes: the tests `tests/lanes.py` names (whole modules, or single tests) get those markers
here, in one place (registered, with what they mean, in pyproject.toml). `pytest -m "not
slow"` is the quick lane; a test marked `root` skips, saying why, when not run as root.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import _current
from nbcluster.cluster import registry
from nbcluster.cluster.handle import ClusterHandle
from tests.lanes import lanes, root_skip

# pandas' first import, once, before any cluster or client thread exists. In the
# minimum-versions lane (pandas 2.0.0) its first import inside a test once failed and passed
# on every rerun; the cause is not found. If it recurs, `to_pandas` now names it.
with contextlib.suppress(ImportError):  # the tests that need pandas say so
    import pandas  # noqa: F401
from tests.shell_helpers import load_shell
from tests.waiting import until

if TYPE_CHECKING:
    from tests.slurm_service import SlurmService

_SESSION_DIR: Path | None = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = root_skip(os.geteuid())
    for item in items:
        test = getattr(item, "originalname", None) or item.name
        for marker in lanes(item.path.stem, test):
            item.add_marker(marker)
        if skip is not None and item.get_closest_marker("root") is not None:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_DIR
    import tempfile

    _SESSION_DIR = Path(tempfile.mkdtemp(prefix="nbcluster-test-"))
    os.environ["NBCLUSTER_RUNTIME_DIR"] = str(_SESSION_DIR)
    # Run journals (`--resume`) go to the session's folder too, never a developer's data dir;
    # the variable reaches the kernels and CLIs tests start, dask.config.set this process.
    import dask.config

    os.environ["DASK_NBCLUSTER__JOURNAL__PATH"] = str(_SESSION_DIR / "journal")
    dask.config.set({"nbcluster.journal.path": str(_SESSION_DIR / "journal")})
    # The processes tests start (kernels, the CLI, Jupyter servers) import this checkout's
    # nbcluster too, as this process does (pyproject's `pythonpath`), not an installed copy.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)


def _stop_all(directory: Path) -> None:
    for handle in nbcluster.clusters(runtime_dir=directory):
        handle.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from nbcluster.cluster.launcher import discard_spare

    discard_spare()
    if _SESSION_DIR is not None:
        _stop_all(_SESSION_DIR)
    leftovers = [
        p for p in psutil.Process().children(recursive=True)
        if ("nbcluster" in " ".join(_cmdline(p)) or "multiprocessing" in " ".join(_cmdline(p)))
        and not _own_resource_tracker(p)
    ]  # fmt: skip
    names = [" ".join(_cmdline(p)[:6]) for p in leftovers]
    for p in leftovers:
        p.kill()
    if leftovers:
        print(f"\nnbcluster tests left {len(leftovers)} processes behind; killed them: {names}", file=sys.stderr)
        session.exitstatus = 1


def _own_resource_tracker(p: psutil.Process) -> bool:
    """multiprocessing's resource tracker of this pytest process: started by the first
    spawned child (an in-process LocalCluster's nanny), it lives until this process exits,
    by design. Not something a test left behind; a tracker of any other process is."""
    try:
        return p.ppid() == os.getpid() and "multiprocessing.resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A registry of this test's own; clusters left in it are stopped afterwards."""
    from nbcluster.cluster.launcher import discard_spare

    directory = tmp_path / "runtime"
    monkeypatch.setenv("NBCLUSTER_RUNTIME_DIR", str(directory))
    # No spare supervisor kept warm by an earlier test's `%load_ext`: like a fresh process.
    discard_spare()
    # The test starts like a fresh kernel, with no current cluster: a bare `%cluster stop`
    # must never reach the session's shared cluster.
    before, _current._current = _current._current, None
    yield registry.runtime_dir(directory)
    for name, handle in list(_current._handles.items()):
        if handle.directory == directory:
            _current.forget(name)
    _stop_all(directory)
    discard_spare()
    if before is not None and _current._alive(before):
        _current.use(before)  # e.g. the session's shared cluster is current again for later tests


@pytest.fixture(scope="session")
def _shared_cluster() -> Iterator[ClusterHandle]:
    handle = nbcluster.start(workers=2, threads=1, name="shared")
    yield handle
    _current.forget(handle.name)
    handle.stop()


@pytest.fixture
def cluster(_shared_cluster: ClusterHandle) -> ClusterHandle:
    """A shared 2-worker x 1-thread cluster, current for this process (and Dask's default
    client) during the test, whatever earlier tests made current. Do not scale or stop it."""
    return _current.use(_shared_cluster)


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmService]:
    """The session's real SLURM (tests/slurm_service.py): a machine runs one slurmctld at a time."""
    from tests.slurm_service import running

    with running() as service:
        yield service


@pytest.fixture
def shell(runtime_dir: Path) -> InteractiveShell:
    """An in-process IPython shell with nbcluster loaded, on this test's own registry.

    A test that runs cells on the shared cluster asks for `cluster` after `shell`."""
    return load_shell()


def _processes_of(directory: Path) -> list[psutil.Process]:
    """Processes (other than this one and its parents) that run with this test's registry."""
    skip = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            if proc.environ().get("NBCLUSTER_RUNTIME_DIR") == str(directory):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture
def no_leftovers(runtime_dir: Path) -> Iterator[Path]:
    """Fails the test if a process of the notebook's is still running a while after its kernel
    stopped (clusters stop within a second or two of their owner); kills any such process."""
    directory = Path(os.environ["NBCLUSTER_RUNTIME_DIR"])
    yield directory
    until(lambda: not _processes_of(directory), 15, interval=0.5)
    left = _processes_of(directory)
    names = []
    for proc in left:
        try:
            names.append(" ".join(proc.cmdline()[:4]))
            proc.kill()
        except psutil.Error:  # it ended meanwhile (a zombie has no command line)
            names.append(f"pid {proc.pid}")
    assert not left, f"processes left running: {names}"


@pytest.fixture
def cli():
    """Runs the `nbcluster` command in a separate process, as a user would."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nbcluster.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )

    return run
