"""Faults out there: remote processes whose scheduler is gone, on the netns hosts.

Three hosts (`netns_service`): host 0 runs a Python process that starts a cluster through
the ``ssh`` profile (its supervisor is that process's child, on host 0), the scheduler runs
on host 1 and two nannies on host 2, each started by host 2's sshd, with nbcluster's own
worker options and a short death timeout. Each worker runs a task that never ends (the case
where a worker waits for its task before exiting).

Then the scheduler side goes, hard: the driver, its supervisor and the scheduler are
killed with SIGKILL, and in the "cut off" case host 2's cable is pulled first, so that not
even a TCP reset reaches it. Every process on host 2 that SSH started must be gone within the
death timeout plus the watch's slack (`remote_watch`: one echo interval and the close). A cut
shorter than the death timeout, mended, ends nothing. With only the supervisor's host killed,
the SSH scheduler ends too, and its nannies after it.

Last, a worker whose Python has no nbcluster, under a local cluster's scheduler that has
it: a `%%distribute` batch there fails at once, in one line naming the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import config
from nbcluster.errors import ClusterCannotRun
from tests.netns_service import Hosts, driver_env, leftover_namespaces
from tests.shell_helpers import cell, magic

pytestmark = pytest.mark.timeout(240)

DEATH_TIMEOUT_S = 8.0
#: One echo interval (death timeout / 10, at least 0.5 s) and the nanny's close (5 s at most).
SLACK_S = 7.0

DRIVER = """
import json, sys, time
from nbcluster.cluster.handle import start

h = start(profile="hosts", name="faults")
client = h.client

def forever():
    import time
    while True:
        time.sleep(1)

workers = list(client.scheduler_info()["workers"])
futures = [client.submit(forever, pure=False, workers=[w]) for w in workers]
deadline = time.monotonic() + 60
while sum(len(v) for v in client.processing().values()) < len(workers):
    if time.monotonic() > deadline:
        sys.exit("the tasks did not start")
    time.sleep(0.05)
print(json.dumps({"address": h.address, "workers": workers}), flush=True)
sys.stdin.read()  # until the test kills this process
"""


def profile(hosts: Hosts) -> dict[str, Any]:
    return {
        "backend": "ssh",
        "description": "A scheduler host and a worker host behind a bridge",
        "options": {
            "hosts": [hosts.addresses[1], hosts.addresses[2], hosts.addresses[2]],
            "connect_options": hosts.connect_options(),
            "scheduler_options": {"interface": "eth0", "port": 0},
            "worker_options": {"interface": "eth0", "nthreads": 1, "death_timeout": f"{DEATH_TIMEOUT_S:g}s"},
            "remote_python": sys.executable,
        },
    }


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    with Hosts(tmp_path / "hosts", 3) as made:
        yield made
    assert leftover_namespaces() == []


def remote_processes(hosts: Hosts, i: int) -> list[psutil.Process]:
    """The processes SSH sessions started on host i (its nannies and their workers)."""
    out = []
    for pid in hosts.pids(i):
        try:
            p = psutil.Process(pid)
            if p.name() != "sshd":
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@contextlib.contextmanager
def running_cluster(hosts: Hosts, tmp_path: Path) -> Iterator[list[psutil.Process]]:
    """The driver on host 0 with its cluster up and a task running on each worker; yields the
    processes SSH started on the worker host (its two nannies and their workers)."""
    env = driver_env(tmp_path, profile(hosts))
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(
        [*hosts.prefix(0), sys.executable, "-c", DRIVER], env=env, cwd=Path(__file__).parent.parent,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line, f"the driver exited: {(tmp_path / 'driver.log').read_text()[-2000:]}"
        started = json.loads(line)
        assert started["address"].startswith(f"tls://{hosts.addresses[1]}:"), started
        assert len(started["workers"]) == 2, started
        remote = remote_processes(hosts, 2)
        nannies = [p for p in remote if "distributed.cli.dask_spec" in " ".join(p.cmdline())]
        assert len(nannies) == 2, [p.cmdline() for p in remote]
        yield remote
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(timeout=30)
        log.close()


@pytest.mark.parametrize("cut", [False, True], ids=["killed", "cut off"])
def test_remote_nannies_end_within_their_death_timeout_once_the_scheduler_is_gone(
    hosts: Hosts, tmp_path: Path, cut: bool
) -> None:
    with running_cluster(hosts, tmp_path) as remote:
        if cut:
            hosts.cut(2)
        # The driver and its supervisor (host 0, each in a session of its own), the scheduler (host 1).
        for p in remote_processes(hosts, 0) + remote_processes(hosts, 1):
            p.kill()
        gone_at = time.monotonic()
        _, alive = psutil.wait_procs(remote, timeout=DEATH_TIMEOUT_S + SLACK_S)
        took = time.monotonic() - gone_at
        assert not alive, (
            f"{len(alive)} processes on the worker host outlived their scheduler by {took:.1f} s "
            f"(death timeout {DEATH_TIMEOUT_S:g} s): {[' '.join(p.cmdline())[:120] for p in alive]}"
        )


def test_a_cut_shorter_than_the_death_timeout_ends_nothing(hosts: Hosts, tmp_path: Path) -> None:
    with running_cluster(hosts, tmp_path) as remote:
        hosts.cut(2)
        # Half the death timeout without the scheduler (a wait for nothing to happen).
        gone, _ = psutil.wait_procs(remote, timeout=DEATH_TIMEOUT_S / 2)
        hosts.mend(2)
        assert not gone, [p.pid for p in gone]
        # The watch counts from the last answer: once the link is back, nothing ends.
        gone, _ = psutil.wait_procs(remote, timeout=DEATH_TIMEOUT_S + SLACK_S)
        assert not gone, f"the watch ended {len(gone)} processes after a {DEATH_TIMEOUT_S / 2:g} s cut"


def test_the_scheduler_and_its_nannies_end_once_the_supervisor_is_gone(hosts: Hosts, tmp_path: Path) -> None:
    with running_cluster(hosts, tmp_path) as remote:
        scheduler_side = remote_processes(hosts, 1)
        assert any("distributed.cli.dask_spec" in " ".join(p.cmdline()) for p in scheduler_side)
        # The kernel's side only (the driver and its supervisor, host 0), as when a laptop dies.
        for p in remote_processes(hosts, 0):
            p.kill()
        # The scheduler ends a death timeout after its supervisor's client left, then its
        # nannies by theirs.
        _, alive = psutil.wait_procs(scheduler_side + remote, timeout=2 * DEATH_TIMEOUT_S + SLACK_S)
        alive = [p for p in alive if not _exited(p)]
        assert not alive, f"outlived their supervisor: {[' '.join(p.cmdline())[:120] for p in alive]}"


def _exited(process: psutil.Process) -> bool:
    # A zombie has ended: it only waits for its parent (ending too, a moment later) to reap it.
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- a worker without nbcluster, under a scheduler that has it -------------------------------


def python_without_nbcluster(folder: Path) -> Path:
    """A Python environment with this one's packages but not nbcluster: a venv whose only
    site entry is a ``.pth`` naming this environment's site-packages.

    Python processes ``.pth`` files in site directories only, not in the directories they
    add: nbcluster's editable install (a ``.pth`` of its own in that folder) is never seen,
    so ``import nbcluster`` fails as where it was never installed, while dask and
    distributed are the very versions the scheduler runs, as Dask requires.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_a_task_reading_persisted_values_loads_without_nbcluster_and_fails_when_run(tmp_path: Path) -> None:
    """A chained `--persist` task keeps its handles as Dask dependencies beside the bytes of its
    call: what a worker without nbcluster unpickles must still load, and the missing module be
    the task's error when it runs (`transport.task` with `deps`)."""
    from dask._task_spec import Task

    from nbcluster.run.transport import task
    from nbcluster.worker import held

    python = python_without_nbcluster(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    fn, loader, deps = task(held.run_batch_held, ("ctx", None), b"", "token", True, {}, deps=("dep",))
    assert isinstance(loader, Task) and deps == ["dep"]
    script = (
        "import pickle, sys\n"
        "fn, loader, deps = pickle.loads(sys.stdin.buffer.read())\n"  # as the worker gets the task
        "print('loaded', flush=True)\n"
        "fn(loader({}), deps)\n"  # as the worker runs it
    )
    ran = subprocess.run([python, "-c", script], input=pickle.dumps((fn, loader, deps)), env=env, cwd=tmp_path,
                         capture_output=True, timeout=60)  # fmt: skip
    assert ran.stdout.decode().strip() == "loaded", ran.stderr.decode()
    assert "ModuleNotFoundError: No module named 'nbcluster'" in ran.stderr.decode()


@pytest.mark.timeout(90)  # where the batch hangs (Dask never fails it), this ends the test
def test_a_worker_without_nbcluster_fails_the_batch_in_one_line_naming_it(
    shell: InteractiveShell, runtime_dir: Path, tmp_path: Path
) -> None:
    python = python_without_nbcluster(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests' own path has nbcluster
    # Run from the test's folder: the checkout's own folder holds the package.
    probe = subprocess.run(
        [python, "-c", "import distributed, nbcluster"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert "No module named 'nbcluster'" in probe.stderr, probe.stderr

    magic(shell, "start --workers 0 --name nonb")
    handle = nbcluster.current()
    security = handle.security
    assert security is not None
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [python, "-m", "distributed.cli.dask_worker", handle.address, "--name", "bare-worker", "--nthreads", "1",
         "--host", "127.0.0.1", "--no-dashboard", "--tls-ca-file", str(security.tls_ca_file),
         "--tls-cert", str(security.tls_client_cert), "--tls-key", str(security.tls_client_key)],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        handle.client.wait_for_workers(1, timeout=60)
        started = time.monotonic()
        with pytest.raises(ClusterCannotRun) as error:
            cell(shell, '%%distribute --over "x in range(6)" --into res\nx + 1')
        took = time.monotonic() - started
        assert took < config.seconds("timeouts.connect"), took
        message = str(error.value)
        pattern = (
            r"worker bare-worker \(tls://127\.0\.0\.1:\d+\) cannot import nbcluster \(ModuleNotFoundError: "
            r"No module named 'nbcluster'\): install nbcluster [\w.]+ in the Python environment that runs it "
            r"\(as on the scheduler\), or stop that worker, then res\.retry\(\) runs the rest; "
            r"0/6 items finished and are in res"
        )
        assert re.fullmatch(pattern, message), message
        # The worker is still there: the failure was the task's, not its connection's.
        assert worker.poll() is None and len(handle.info().workers) == 1

        # A --persist run: each item is its own task (`worker/held.py`), and fails the same way.
        started = time.monotonic()
        with pytest.raises(ClusterCannotRun) as error:
            cell(shell, '%%distribute --over "x in range(4)" --persist --into held\nx + 1')
        took = time.monotonic() - started
        assert took < config.seconds("timeouts.connect"), took
        persisted = pattern.replace("res\\.retry", "held\\.retry").replace("0/6 items finished and are in res",
                                                                               "0/4 items finished and are in held")
        assert re.fullmatch(persisted, str(error.value)), str(error.value)
        assert worker.poll() is None and len(handle.info().workers) == 1
    finally:
        worker.kill()
        worker.wait(timeout=30)
        log.close()
        magic(shell, "stop nonb")
