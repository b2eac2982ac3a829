"""Status, metrics, the live widget and a `%%distribute` run on a real cluster with 201 workers.

The scheduler, supervisor and plugins are nbcluster's own, over TLS; one worker is a real
nanny-managed process, the other 200 are a simulation: real Dask workers, 50 to a process
on four loopback addresses that the scheduler sees as four hosts (tests/sim_workers.py).
What is checked is size, not speed (timings: bench/scale.py): nothing a user sees, and
nothing the widget or the sidebar fetches, grows with the number of workers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import _current, widgets
from nbcluster.cluster.handle import ClusterHandle
from tests.scale_helpers import left_on_scheduler, simulated_workers
from tests.shell_helpers import cell
from tests.waiting import until, waited_for

SIMULATED = 200


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = nbcluster.start(workers=1, name="big", runtime_dir=tmp_path_factory.mktemp("scale-registry"))
    try:
        with simulated_workers(handle, per_process=SIMULATED // 4, processes=4):
            handle.client.wait_for_workers(SIMULATED + 1, timeout=90)
            yield handle
    finally:
        handle.stop()


def _functions() -> Any:
    # Local functions travel by value: the workers cannot import this test module.
    def inc(x: int) -> int:
        return x + 1

    def count_workers(dask_scheduler: Any = None) -> int:
        return len(dask_scheduler.workers)

    return inc, count_workers


def _made_batches_out() -> Any:
    # Made in a function so that it travels by value (see `_functions`).
    def batches_out(run_id: str, dask_scheduler: Any = None) -> int:
        """On the scheduler: the run's tasks not yet finished."""
        unfinished = ("waiting", "queued", "no-worker", "processing")
        return sum(1 for k, ts in dask_scheduler.tasks.items() if run_id in str(k) and ts.state in unfinished)

    return batches_out


_inc, _count_workers = _functions()
_batches_out = _made_batches_out()


def test_status_of_201_workers_is_a_summary_by_host(big: ClusterHandle) -> None:
    text = repr(big.info())
    lines = text.splitlines()
    assert "201 workers, 201 cores" in lines[1], text
    assert len(lines) < 20, text
    for k in range(4):
        assert any(line.split()[:3] == [f"127.0.0.{2 + k}", "50", "cpu"] for line in lines), text
    assert "idle: " in text and " of 201 workers run nothing" in text


def test_metrics_describe_the_busiest_and_summarise_the_rest(big: ClusterHandle) -> None:
    big.client.gather(big.client.map(_inc, range(50)))
    full = big.metrics()
    snap = big.metrics(detail=16)
    assert len(full["workers"]) == 201 and len(snap["workers"]) == 16
    summary = snap["summary"]
    assert summary["workers"] == 201 and summary["threads"] == 201
    assert sorted(h["host"] for h in summary["hosts"])[1:] == [f"127.0.0.{2 + k}" for k in range(4)]
    assert {r["worker"] for r in snap["resources"]} <= set(snap["workers"])
    # A band covers the workers whose heartbeat has brought a sample so far: the last of
    # the 201 may be one sampling round behind.
    assert waited_for(
        lambda: (b := big.metrics(detail=16)["bands"]) and b[-1]["workers"] == 201, "band over all 201 workers"
    )
    # What the widget and the sidebar fetch does not grow with the workers; the full
    # per-worker snapshot does.
    sizes = {
        k: len(json.dumps({**s, "tasks": []}, default=str)) for k, s in (("full", full), ("detail", snap))
    }
    assert sizes["detail"] * 4 < sizes["full"], sizes


class Recorder:
    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.shown = threading.Event()

    def show(self, bundle: dict[str, Any]) -> None:
        self.shown.set()

    def update(self, bundle: dict[str, Any]) -> None:
        self.updates.append(bundle)


def test_the_status_widget_of_201_workers_stays_small(big: ClusterHandle) -> None:
    rec = Recorder()
    view = widgets.status(big, live_for=None, interval=0.1, _display=rec, _widgets=True)
    sent: list[int] = []
    assert rec.shown.wait(30)
    view.widget.observe(lambda change: sent.append(len(json.dumps(change["new"]))), names="delta")
    big.client.gather(big.client.map(_inc, range(1000, 1100)))
    view.close()
    html = rec.updates[-1]["text/html"]
    # Lanes by host (five: the real worker's and four simulated ones), charts as bands.
    assert html.count('class="nbc-lane"') == 5 and 'data-lane="host:127.0.0.2"' in html
    assert "(50 workers)" in html
    assert 'class="nbc-resource-band"' in html and 'class="nbc-resource-worker"' not in html
    assert "201 workers (median, min" in html
    # Every update to the browser is bounded: at most 100 task records, 16 workers.
    assert sent and max(sent) < 40_000, max(sent)


def test_a_distribute_cell_over_201_workers(shell: InteractiveShell, big: ClusterHandle) -> None:
    _current.use(big)
    cell(shell, "from distributed import get_worker\nfrom nbcluster._compat import running_task_key")
    out = cell(
        shell, '%%distribute --over "x in range(3000)"\n(x * 2, get_worker().address, running_task_key() is None)'
    )
    assert out.ok and len(out) == 3000, out.counts()
    assert [v for v, _, _ in out] == [2 * x for x in range(3000)]  # every item, right and in order
    # The items were shared out over most of the cluster, not queued on a few workers.
    ran_on = {w for _, w, _ in out}
    assert len(ran_on) > 150, len(ran_on)
    # The kernel sent batches directly to a few of them only (a connection each), the rest
    # went through the scheduler (`run/transport.py`).
    direct = {w for _, w, d in out if d}
    assert 0 < len(direct) <= 32, len(direct)
    # Its Dask tasks (batches), as the task stream recorded them: never one per item.
    tasks = [t for t in big.metrics()["tasks"] if out.run_id in t["key"]]
    assert 0 < len(tasks) < 3000 // 2, len(tasks)
    # Nothing is left behind on the scheduler: no task, no backlog report for adaptivity.
    assert big.client.run_on_scheduler(left_on_scheduler, out.run_id, 30) == {"tasks": [], "backlog": []}


def test_a_run_keeps_every_thread_of_the_cluster_fed(big: ClusterHandle) -> None:
    from nbcluster.run.api import distribute

    res = distribute(
        "import time\ntime.sleep(0.2)", over=range(20_000), namespace={}, on=big.client, wait=False
    )
    threads = SIMULATED + 1

    def out() -> int:
        return int(big.client.run_on_scheduler(_batches_out, res.run_id))

    try:
        # As the scheduler sees the run: more batches out than threads (a thread's next batch
        # waits beside its running one, so no thread waits for the kernel), never more than
        # `in-flight` (2) per thread.
        assert until(lambda: out() > threads, 60), out()
        assert out() <= 2 * threads
    finally:
        res.cancel()


def test_adaptivity_acts_on_a_cluster_with_workers_it_did_not_start(big: ClusterHandle) -> None:
    # The 200 simulated workers joined from elsewhere: no spec of the cluster holds them.
    # Adaptivity must still act on a backlog (it raised a KeyError for each of them, every
    # round, and never did).
    big.adapt(1, 2)
    report = big.client.scheduler.nbcluster_backlog
    try:
        big.client.sync(report, run="scale-test", kind="cpu", items=1000, seconds=100.0)
        big.client.wait_for_workers(SIMULATED + 2, timeout=30)
    finally:
        big.client.sync(report, run="scale-test", kind="cpu", items=0, seconds=0.0)
        big.scale(1)  # takes control back: the worker it added goes (for the tests after)
    assert _workers_become(big, SIMULATED + 1)


def _workers_become(handle: ClusterHandle, n: int, timeout: float = 30) -> bool:
    """Whether the scheduler has `n` workers within `timeout` (a retiring worker takes a
    moment, and Dask has no event for fewer workers)."""
    return until(lambda: handle.client.run_on_scheduler(_count_workers) == n, timeout)


def test_adapt_grows_to_200_workers_in_groups_and_back(tmp_path: Any) -> None:
    # Adaptivity itself starts and retires the workers here: each spec entry the cluster
    # adds is one process of 50 simulated workers (tests/sim_workers.py, `group_spec`),
    # as a dask-jobqueue job hosting several. --max 190 is not a whole number of groups.
    import dask

    from tests.sim_workers import Backlog, use_groups

    # The limits count workers as processes; 200 of these are 4 processes.
    limits = {"nbcluster.limits.max-workers": 1000, "nbcluster.limits.max-threads": 1000}
    with dask.config.set(limits):
        handle = nbcluster.start(workers=0, name="groups", runtime_dir=tmp_path)
    try:
        handle.client.run_on_scheduler(use_groups, 50, handle.entry["tls"])
        with dask.config.set(limits):
            handle.adapt(0, 190, force=True)
        backlog = Backlog(handle.client, items=100_000, seconds=10_000.0)
        # Four processes of 50 (the fewest that give 190), each its own host: not one process
        # per worker, and not torn down again for being 10 over the target (Dask's own
        # recommendations closed a group for one member and started it again, round after round).
        handle.client.wait_for_workers(200, timeout=40)
        hosts = {w["host"] for w in handle.client.scheduler_info(n_workers=-1)["workers"].values()}
        assert len(hosts) == 4, hosts
        # No group was closed on the way up: the scheduler lost no worker (Dask's "all" events).
        removed = [e for _, e in handle.client.get_events("all") if e.get("action") == "remove-worker"]
        assert removed == [], removed[:3]
        backlog.stop()
        # The backlog gone, every group is retired: its workers gone, then its spec entry (a
        # moment after the last of them, in the cluster's own loop; the full suite once read
        # 200 requested just as the workers were gone).
        assert _workers_become(handle, 0, timeout=30)
        assert until(lambda: handle.info().data["requested"]["cpu"] == 0, 30), handle.info().data
    finally:
        handle.stop()
