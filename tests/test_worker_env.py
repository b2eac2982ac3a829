"""nbcluster's workers are set up for real work: numpy arrays reuse heap memory (as in a fresh
process, not mmapped afresh as under Dask's default environment), and freed memory still
goes back to the operating system. The settings themselves are tested, not timings
(bench/real_work.py has those)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from typing import Any

import cloudpickle
import dask.config
import pytest

import nbcluster
from nbcluster import config
from nbcluster.cluster.switch_interval import ShortSwitchInterval
from nbcluster.cluster.worker_memory import MemoryTrim
from tests.os_helpers import rss

# The workers cannot import this test module: what lambdas call from it travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MMAP_PROBE = """
import ctypes, numpy as np

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2

def mmapped_for_1mb_array():
    before = libc.mallinfo2().hblkhd
    a = np.ones(125_000)  # 1 MB
    grown = libc.mallinfo2().hblkhd - before
    del a
    return grown
"""


def _mmapped_for_1mb_array() -> int:
    scope: dict[str, Any] = {}
    exec(MMAP_PROBE, scope)
    return scope["mmapped_for_1mb_array"]()


def test_workers_take_arrays_from_the_heap_not_from_mmap(cluster: Any) -> None:
    expected = str(config.get("worker.pre-spawn-environ")["MALLOC_MMAP_THRESHOLD_"])
    env = cluster.client.run(lambda: os.environ.get("MALLOC_MMAP_THRESHOLD_"))
    assert set(env.values()) == {expected}
    # glibc honours it: a 1 MB array is not mmapped on the workers...
    assert set(cluster.client.run(lambda: _mmapped_for_1mb_array()).values()) == {0}
    # ...where under Dask's default worker environment it would be.
    dask_default = subprocess.run(
        [sys.executable, "-c", MMAP_PROBE + "print(mmapped_for_1mb_array())"],
        env={**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(dask_default.stdout) >= 1_000_000


def _churn() -> tuple[list[bytearray], int]:
    """240 MB of arrays freed again under small objects that stay (the result, kept by the
    client): glibc cannot give that heap back by itself, only `malloc_trim` can. Returns
    them and the process's RSS while the arrays were alive."""
    import numpy as np

    kept, temporary = [], []
    for _ in range(60):
        temporary.append(np.ones(500_000))  # 4 MB: from the heap, below the mmap threshold
        kept.append(bytearray(2000))
    peak = rss()
    del temporary
    return kept, peak


def test_every_worker_trims_its_heap_after_work(cluster: Any) -> None:
    # How much the trim gives back after real work is measured in bench/real_work.py; here,
    # that it happens on every worker, within a few trim intervals of the work.
    client = cluster.client
    interval = config.seconds("worker.trim-interval")
    for address in client.scheduler_info()["workers"]:
        # Lambdas, so that Dask pickles by value (a plain function here goes by reference).
        held = client.submit(lambda: _churn(), workers=[address], pure=False)
        _, peak = held.result()
        deadline = time.monotonic() + 5 * interval + 10
        while (now := client.run(rss, workers=[address])[address]) > peak - 150_000_000:
            assert time.monotonic() < deadline, f"{address} still holds {now / 1e6:.0f} MB ({peak / 1e6:.0f} MB at work)"
            time.sleep(0.1)
        del held


def _churn_and_keep(i: int) -> tuple[int, str, bool]:
    """`_churn` in an item, its small objects kept on the worker (`worker_local`): the peak
    RSS, the worker, and whether the item ran in a direct batch (not a Dask task)."""
    from distributed import get_worker

    from nbcluster._compat import running_task_key

    kept, peak = _churn()
    nbcluster.worker_local("trim-test", list).append(kept)
    return peak, get_worker().address, running_task_key() is None


def test_a_worker_trims_its_heap_after_a_direct_batch(cluster: Any) -> None:
    # A run's first seconds go to the workers directly, not as Dask tasks (run/transport.py),
    # and what those batches freed goes back as a task's does.
    client = cluster.client
    interval = config.seconds("worker.trim-interval")
    try:
        runs = nbcluster.distribute(_churn_and_keep, over=range(2))
        assert runs.ok and all(direct for _, _, direct in runs), runs.summary()
        for peak, address, _ in runs:
            deadline = time.monotonic() + 5 * interval + 10
            while (now := client.run(rss, workers=[address])[address]) > peak - 150_000_000:
                assert time.monotonic() < deadline, f"{address} still holds {now / 1e6:.0f} MB ({peak / 1e6:.0f} MB at work)"
                time.sleep(0.1)
    finally:
        client.run(lambda: nbcluster.worker_local("trim-test", list).clear())


def test_the_trim_runs_once_after_work() -> None:
    calls: list[int] = []
    plugin = MemoryTrim(interval=1.0, trim=calls.append)
    plugin.tick()
    assert calls == []  # nothing ran since the last trim: nothing to do
    plugin.transition("k", "executing", "memory")
    plugin.tick()
    plugin.tick()
    assert calls == [0]


def _in_new_workers(name: str, variable: str) -> set[str | None]:
    """`variable` in the environment of the workers of a new 1-worker cluster."""
    handle = nbcluster.cluster.handle.start(workers=1, name=name)
    try:
        return set(handle.client.run(lambda: os.environ.get(variable)).values())
    finally:
        handle.stop()


def test_the_worker_environment_is_a_dask_setting(runtime_dir: Any) -> None:
    with dask.config.set({"nbcluster.worker.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 1048576}):
        assert _in_new_workers("env", "MALLOC_MMAP_THRESHOLD_") == {"1048576"}


def test_libc_has_malloc_trim() -> None:
    # The trim needs glibc; a libc without it would leave the heap unreturned silently.
    assert hasattr(ctypes.CDLL("libc.so.6"), "malloc_trim")


def test_a_kernel_that_ran_a_plain_dask_cluster_still_gets_nbclusters_environment(
    runtime_dir: Any, monkeypatch: Any
) -> None:
    from distributed import LocalCluster

    ours = str(config.get("worker.pre-spawn-environ")["MALLOC_TRIM_THRESHOLD_"])
    # monkeypatch restores the variable after the test, whoever set it.
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    # A real Dask nanny in this process copies Dask's worker variables into os.environ.
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"):
        pass
    dask_own = str(dask.config.get("distributed.nanny.pre-spawn-environ")["MALLOC_TRIM_THRESHOLD_"])
    assert os.environ.get("MALLOC_TRIM_THRESHOLD_") == dask_own != ours
    assert _in_new_workers("after-dask", "MALLOC_TRIM_THRESHOLD_") == {ours}


def test_a_worker_variable_the_user_set_still_wins(runtime_dir: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert _in_new_workers("user-env", "MALLOC_TRIM_THRESHOLD_") == {"1048576"}


def _loop_wakes_in_a_second() -> int:
    """How often the worker's event loop took the GIL from this item in one second.

    The item gives the GIL up over and over (as numpy's random numbers and I/O do), so the
    loop's main thread gets it at each of its wakes: its voluntary context switches count them.
    """

    def switches() -> int:
        with open(f"/proc/self/task/{os.getpid()}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))

    # At Python's interval each wake is one switch; at a one-thread worker's 10 us, the item
    # takes the GIL back in the middle of a wake's work, several switches a wake.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        before, end = switches(), time.monotonic() + 1
        while time.monotonic() < end:
            time.sleep(0)
        return switches() - before
    finally:
        sys.setswitchinterval(interval)


def test_a_running_item_is_seldom_interrupted_by_dasks_housekeeping(cluster: Any) -> None:
    # Dask's profiler, loop check and memory check wake a worker's loop ~160 times a second;
    # nbcluster.worker.dask-config runs them less often (bench/RESULTS.md, "simulation").
    workers = list(cluster.client.scheduler_info(n_workers=-1)["workers"])
    wakes = [cluster.client.submit(lambda: _loop_wakes_in_a_second(), workers=w, pure=False).result() for w in workers]
    assert max(wakes) < 25, wakes


def test_a_null_in_the_worker_dask_config_leaves_the_users_dask_setting(runtime_dir: Any, monkeypatch: Any) -> None:
    def housekeeping(dask_worker: Any) -> tuple[bool, float]:
        callbacks = dask_worker.periodic_callbacks
        return "profile" in callbacks, callbacks["tick"].callback_time

    # The user's own Dask setting, as their environment (or a YAML file) gives it to the cluster.
    monkeypatch.setenv("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "40ms")
    profiler = "nbcluster.worker.dask-config.distributed.worker.profile.enabled"
    tick = "nbcluster.worker.dask-config.distributed.admin.tick.interval"
    with dask.config.set({profiler: None, tick: None, "nbcluster.worker.switch-interval": None}):
        handle = nbcluster.cluster.handle.start(workers=1, name="dasks-own")
    try:
        # Dask's profiler is back (the dashboard's Profile page fills), and the user's tick holds.
        assert set(handle.client.run(housekeeping).values()) == {(True, 40)}
        # And the one-thread worker keeps Python's switch interval.
        assert set(handle.client.run(sys.getswitchinterval).values()) == {sys.getswitchinterval()}
    finally:
        handle.stop()


def test_a_one_thread_workers_event_loop_gets_the_gil_soon_after_it_asks(cluster: Any) -> None:
    # With Python's 5 ms, an item that gives the GIL up thousands of times a second keeps the
    # loop waking for nothing (cluster/switch_interval.py; bench/RESULTS.md, "simulation").
    assert set(cluster.client.run(sys.getswitchinterval).values()) == {config.seconds("worker.switch-interval")}
    assert config.seconds("worker.switch-interval") < 0.001


def test_threads_of_one_worker_take_turns_at_pythons_interval() -> None:
    # Items in several threads of one worker would take turns every 10 us too: pure-Python
    # items ~20% slower. Such a worker keeps Python's interval, and gets it back at teardown.
    class Worker:
        def __init__(self, nthreads: int):
            self.state = type("State", (), {"nthreads": nthreads})()

    pythons = sys.getswitchinterval()
    ShortSwitchInterval(1e-5).setup(Worker(2))
    assert sys.getswitchinterval() == pythons
    short = ShortSwitchInterval(1e-5)
    try:
        short.setup(Worker(1))
        assert sys.getswitchinterval() == pytest.approx(1e-5)
    finally:
        short.teardown(Worker(1))
    assert sys.getswitchinterval() == pythons
