"""A local cluster's workers are forked from the supervisor's forkserver, and are what spawned
workers would be (nbcluster/cluster/forkserver.py).

Real clusters, started both ways (forked, the default, and spawned with
``nbcluster.worker.forkserver: false``): a worker process of each reports what it sees (its
environment, threads, signal handlers and mask, paths, flags, hash seed, limits, Dask's
config), and the two reports must be the same; a task's ``atexit`` handler runs when its worker
exits, either way. Then what a forkserver started ahead could get wrong: the environment
changed after the spare supervisor was launched (a variable that glibc reads at process
start), the setting turned off by the requester, a supervisor for workers that run elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import dask.config
import psutil

import nbcluster
from nbcluster._start_up import START_UP_VARIABLE
from nbcluster.cluster import launcher
from tests.lifecycle_helpers import wait_catching
from tests.os_helpers import fresh_python

# The workers cannot import this test module: what lambdas call from it travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _report() -> dict[str, Any]:
    """What a worker process sees of how it was started (run on the worker)."""
    import atexit
    import re
    import resource
    import signal
    import threading

    status = dict(
        line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":\t" in line
    )
    handlers = {}
    for sig in sorted(signal.valid_signals()):
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(int(sig))
        handlers[name] = re.sub(r"0x[0-9a-f]+", "ADDRESS", repr(signal.getsignal(sig)))
    limits = {
        name: resource.getrlimit(getattr(resource, name))
        for name in ("RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_AS")
    }
    return {
        "environ": dict(os.environ),
        # Dask's thread names carry the process's id; the kinds of thread must match.
        "threads": sorted(re.sub(r"\d+", "N", t.name) for t in threading.enumerate()),
        "tasks": len(os.listdir("/proc/self/task")),  # native threads too (a BLAS pool)
        "handlers": handlers,
        "mask": {k: status[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")},
        # Dask puts the worker's and the scheduler's own scratch folders (random names) on it.
        "path": [re.sub(r"(dask-scratch-space/[a-z]+)-\w+", r"\1-X", p) for p in sys.path],
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "flags": tuple(sys.flags),
        "hash": hash("nbcluster"),  # PYTHONHASHSEED, read at start
        "nice": os.nice(0),
        "limits": limits,
        "method": dask.config.get("distributed.worker.multiprocessing-method"),
        # What it reports as it registers (the forkserver reads it ahead, for its workers).
        "versions": __import__("distributed.versions").versions.get_versions(),
        "atexit": atexit._ncallbacks(),
        "stdin": sys.stdin is None
        or sys.stdin.closed
        or os.path.realpath(f"/proc/self/fd/{sys.stdin.fileno()}"),
    }


def _draws() -> tuple[float, float]:
    import random

    import numpy as np

    return float(np.random.random()), random.random()


def _parent() -> list[str]:
    return psutil.Process(os.getppid()).cmdline()


def _forked(handle: nbcluster.ClusterHandle) -> list[bool]:
    """For each worker: whether its parent is a forkserver (else the supervisor spawned it)."""
    parents = handle.client.run(lambda: _parent()).values()
    return ["from multiprocessing.forkserver import main" in " ".join(cmd) for cmd in parents]


def _forkservers(pid: int) -> list[psutil.Process]:
    return [
        p for p in psutil.Process(pid).children() if "multiprocessing.forkserver" in " ".join(p.cmdline())
    ]


def _log(runtime_dir: Path, name: str) -> str:
    return (runtime_dir / f"{name}.log").read_text()


def test_a_forked_worker_is_what_a_spawned_one_would_be(runtime_dir: Path) -> None:
    forked = nbcluster.start(workers=1, threads=1, name="forked")
    with dask.config.set({"nbcluster.worker.forkserver": False}):
        spawned = nbcluster.start(workers=1, threads=1, name="spawned")
    try:
        assert _forked(forked) == [True] and _forked(spawned) == [False]
        # Started cold: its forkserver came with the launcher's prediction, which held.
        assert "a new forkserver" not in _log(runtime_dir, "forked")
        forked_by, spawned_by = (
            psutil.Process(h.entry["supervisor_pid"]).cmdline() for h in (forked, spawned)
        )
        [a] = forked.client.run(lambda: _report()).values()
        [b] = spawned.client.run(lambda: _report()).values()
    finally:
        forked.stop()
        spawned.stop()
    for report, handle, supervisor in ((a, forked, forked_by), (b, spawned, spawned_by)):
        # A nanny names its process as the workers' parent (Dask's process titles), and
        # multiprocessing gives a worker its parent's arguments: each its own supervisor's.
        assert report["environ"].pop("__DASK_PARENT_PID") == str(handle.entry["supervisor_pid"])
        assert report.pop("argv")[1:] == supervisor[3:]
    for key in a:
        assert a[key] == b[key], key
    assert a["method"] == "spawn"  # the supervisor forks; a worker's own processes spawn
    assert a["environ"]["MALLOC_MMAP_THRESHOLD_"] == "67108864"


def test_with_the_setting_off_no_forkserver_stays(runtime_dir: Path) -> None:
    with dask.config.set({"nbcluster.worker.forkserver": False}):
        handle = nbcluster.start(workers=1, name="off")
    try:
        supervisor = psutil.Process(handle.entry["supervisor_pid"])
        # The supervisor started one ahead (its own config said so); the request's said no.
        commands = [" ".join(p.cmdline()) for p in supervisor.children(recursive=True)]
        assert not [c for c in commands if "multiprocessing.forkserver" in c], commands
        assert _forked(handle) == [False]
    finally:
        handle.stop()


def test_a_spare_supervisors_forkserver_serves_the_start(runtime_dir: Path) -> None:
    launcher.prewarm(runtime_dir)
    spare = launcher._spare
    assert spare is not None
    # Its forkserver is its first act: wait for it, as a notebook's start comes later.
    wait_catching(spare.proc.pid, signal.SIGTERM)
    (ahead,) = _forkservers(spare.proc.pid)
    handle = nbcluster.start(workers=2, name="warm")
    try:
        assert handle.entry["supervisor_pid"] == spare.proc.pid
        assert set(handle.client.run(os.getppid).values()) == {ahead.pid}
        assert "a new forkserver" not in _log(runtime_dir, "warm")
        # Forked from one process, they still draw different random numbers (numpy's
        # global state and the standard library's are seeded afresh in each).
        draws = handle.client.run(lambda: _draws()).values()
        assert len({d[0] for d in draws}) == len({d[1] for d in draws}) == 2
    finally:
        handle.stop()


def _mmapped_for_2mb_array() -> int:
    import ctypes

    import numpy as np

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    before = libc.mallinfo2().hblkhd
    a = np.ones(250_000)  # 2 MB
    grown = int(libc.mallinfo2().hblkhd - before)
    del a
    return grown


def test_a_variable_set_after_the_spare_was_launched_holds_from_the_workers_start(
    runtime_dir: Path, monkeypatch: Any
) -> None:
    launcher.prewarm(runtime_dir)
    spare = launcher._spare
    assert spare is not None
    # Read by glibc when a process starts: a forkserver started without it cannot pass it on.
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    handle = nbcluster.start(workers=1, name="changed")
    try:
        assert handle.entry["supervisor_pid"] == spare.proc.pid
        assert set(handle.client.run(lambda: os.environ.get("MALLOC_MMAP_THRESHOLD_")).values()) == {
            "1048576"
        }
        # glibc honours it: a 2 MB array is mmapped (under the 64 MiB default it is not).
        assert min(handle.client.run(lambda: _mmapped_for_2mb_array()).values()) >= 2_000_000
        assert _forked(handle) == [True]
        assert "a new forkserver: the workers' environment differs in MALLOC_MMAP_THRESHOLD_" in _log(
            runtime_dir, "changed"
        )
    finally:
        handle.stop()


def test_a_tasks_atexit_handler_runs_when_its_worker_exits_forked_or_spawned(
    runtime_dir: Path, tmp_path: Path
) -> None:
    for forkserver in (True, False):
        marker = tmp_path / f"ran-{forkserver}"

        def register(path: str = str(marker)) -> None:
            import atexit

            atexit.register(lambda: Path(path).write_text("ran"))

        with dask.config.set({"nbcluster.worker.forkserver": forkserver}):
            handle = nbcluster.start(workers=1, name=f"atexit-{forkserver}")
        assert _forked(handle) == [forkserver]
        family = [
            psutil.Process(handle.entry["supervisor_pid"]),
            *psutil.Process(handle.entry["supervisor_pid"]).children(recursive=True),
        ]
        handle.client.run(register)
        handle.stop()
        _, alive = psutil.wait_procs(family, timeout=15)
        assert not alive
        assert marker.read_text() == "ran", forkserver


def test_a_supervisor_launched_for_workers_elsewhere_starts_no_forkserver(runtime_dir: Path) -> None:
    for local in (True, False):
        launched = launcher._launch(runtime_dir, local=local)
        try:
            # It installs its signal handlers after the forkserver's start (and its imports).
            wait_catching(launched.proc.pid, signal.SIGTERM)
            assert len(_forkservers(launched.proc.pid)) == (1 if local else 0), local
        finally:
            launched.discard()


def test_a_supervisor_starts_the_forkserver_its_launcher_predicted_before_dasks_config() -> None:
    # What a supervisor launched with the prediction does first (cluster/__main__.py): the
    # forkserver starts with it, before Dask's distributed loads, and it is what `use` then
    # expects. `import nbcluster` alone starts nothing.
    from nbcluster.cluster import forkserver

    probe = (
        "import os, sys\n"
        "import nbcluster.cluster.forkserver as f\n"
        "print(f.pid() is not None)\n"
        "f.start_as_launched()\n"
        "print(f.pid() is not None, f.AHEAD_VARIABLE in os.environ)\n"
        "import distributed\n"  # as a supervisor has by the time `use` checks
        "print(f._started_with == f.worker_environ(os.environ))\n"
        "f.stop()\n"
    )
    env = {**os.environ, **forkserver.ahead_environ(os.environ)}
    assert fresh_python(probe, env).split() == ["False", "True", "False", "True"]
    # Without it, the start-up starts nothing.
    done = subprocess.run(
        [sys.executable, "-c", probe.replace("f.stop()", "")], capture_output=True, text=True
    )
    assert done.stdout.split()[:2] == ["False", "False"]


def _ca_store_loaded() -> bool:
    from tornado.netutil import _client_ssl_defaults

    return bool(_client_ssl_defaults.cache_info().currsize)


def test_no_process_of_a_cluster_loads_the_ca_store_to_accept_its_connections(runtime_dir: Path) -> None:
    # Every connection within a cluster is TLS with the cluster's own certificates: the
    # scheduler (in the supervisor) accepts the client's and the workers', each worker the
    # scheduler's (`run`). None of them needs the system's CA store (about 40 ms to load).
    handle = nbcluster.start(workers=2, threads=1, name="ca")
    try:
        assert handle.address.startswith("tls://")
        assert handle.client.run_on_scheduler(_ca_store_loaded) is False
        assert _forked(handle) == [True, True]
        assert list(handle.client.run(_ca_store_loaded).values()) == [False, False]
    finally:
        handle.stop()


def _collector() -> tuple[bool, int]:
    import gc

    return gc.isenabled(), gc.get_freeze_count()


def test_the_collector_is_on_in_a_clusters_processes_once_started(runtime_dir: Path) -> None:
    # Off while the supervisor and the forkserver import (nbcluster._start_up.START_UP_VARIABLE), on
    # for what they and the workers run, with the start-up's objects frozen.
    handle = nbcluster.start(workers=1, threads=1, name="gc")
    try:
        on, frozen = handle.client.run_on_scheduler(_collector)
        assert on and frozen > 10_000
        assert _forked(handle) == [True]
        [(on, frozen)] = handle.client.run(_collector).values()
        assert on and frozen > 10_000
    finally:
        handle.stop()


def test_the_start_up_variable_turns_the_collector_off_for_that_process_only() -> None:
    probe = (
        "import gc, os\n"
        "import nbcluster\n"
        "print(gc.isenabled(), end=' ')\n"  # importing the package changes nothing
        "from nbcluster import _start_up\n"
        "_start_up.begin()\n"  # the entry point of a supervisor or forkserver
        "print(gc.isenabled(), _start_up.START_UP_VARIABLE in os.environ)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print(gc.isenabled(), flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    env = {**os.environ, START_UP_VARIABLE: "1"}
    assert fresh_python(probe, env).split() == ["True", "False", "False", "True"]
    assert fresh_python(probe).split() == ["True", "True", "False", "True"]


def test_the_forkserver_loads_what_a_worker_loads_as_it_starts_and_no_more() -> None:
    # Its preload, in a process of its own: the worker's HTTP routes, the versions it
    # reports, and no thread (a process with threads cannot be forked safely). Nor numpy's
    # random generators, unless numpy itself loads them (before 2.0): loaded there, they
    # made the items of every forked worker slower (forkserver_preload.py).
    probe = (
        "import sys, threading\n"
        "import nbcluster.cluster.forkserver_preload\n"
        "import dask.config, distributed.versions\n"
        "routes = dask.config.get('distributed.worker.http.routes')\n"
        "print(all(r in sys.modules for r in routes), 'prometheus_client' in sys.modules)\n"
        "print(distributed.versions._version_cached.cache_info().currsize > 5)\n"
        "print('numpy.random' in sys.modules, threading.active_count())\n"
    )
    with_numpy = fresh_python("import sys, numpy\nprint('numpy.random' in sys.modules)\n").strip()
    assert fresh_python(probe).split() == ["True", "True", "True", with_numpy, "1"]


def test_each_child_of_the_forkserver_draws_its_own_random_numbers() -> None:
    # Where the forkserver has numpy's random generators loaded (numpy before 2.0 loads them
    # with numpy), a fork shares their state: each child reseeds them as the forkserver's
    # loop serves it (`_serve_one`).
    probe = (
        "import os, sys, multiprocessing.forkserver as fs\n"
        "import nbcluster.cluster.forkserver_preload\n"
        "import numpy as np, numpy.random\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        fs._serve_one = lambda *args: print(np.random.random(), flush=True) or 0\n"
        "        nbcluster.cluster.forkserver_preload._serve_one_then_exit_cleanly(fs._serve_one)()\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
    )
    draws = fresh_python(probe).split()
    assert len(draws) == 2 and draws[0] != draws[1], draws
