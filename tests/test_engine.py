"""The engine on the shared real cluster: first results at once, stops that keep finished work.

Items wait on `distributed.Event`s that the test sets, so what is finished, running or
never started is decided by the test, not by timing.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from typing import Any

import dask.config
import pytest
from distributed import Client, Event

import nbcluster
from nbcluster._wire import PUSHED_TOPIC
from nbcluster.errors import ClusterLost
from nbcluster.run.api import distribute
from nbcluster.run.results import Results
from nbcluster.worker.context import stopped_run
from tests.waiting import until


def _tag() -> str:
    return uuid.uuid4().hex[:8]


@pytest.mark.parametrize("direct", ["500ms", "0s"], ids=["direct batches", "Dask tasks"])
def test_the_first_result_arrives_while_every_other_item_is_still_blocked(
    cluster: Any, direct: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent to a worker directly, the first batch sends item 0 ahead (`worker.serve`); as a
    # Dask task, it is item 0 alone.
    monkeypatch.setitem(dask.config.config["nbcluster"]["distribute"], "direct", direct)
    tag = _tag()
    first = threading.Event()
    # Only item 0 may finish, and at once: right behind it, item 1 blocks. (A first batch of
    # several items would hold item 0's result until item 1 ends, which it never does.)
    res = distribute(
        "from distributed import Event\nif x:\n    Event(f'{tag}-go').wait()\nx",
        namespace={"tag": tag},
        over="x in range(200)",
        wait=False,
        progress=lambda r: r.counts()["done"] and first.set(),
    )
    try:
        assert first.wait(30), res.counts()
        assert res[0] == 0
        assert res.counts() == {"total": 200, "done": 1, "failed": 0, "cancelled": 0, "running": 199}
    finally:
        Event(f"{tag}-go", client=cluster.client).set()
    assert res.wait(60).ok and list(res) == list(range(200))


def test_a_stop_keeps_every_finished_item_and_starts_nothing_new(cluster: Any) -> None:
    # Batches of 10 (items 0-9 on one worker, 10-19 on the other, 20-39 queued): items 0-2
    # and 10-12 finish at once, items 3 and 13 hold their batch until the test lets them go.
    tag = _tag()
    client = cluster.client
    cell = (
        "from distributed import Event\n"
        "Event(f'{tag}-started-{x}').set()\n"
        "if x % 10 == 3:\n"
        "    Event(f'{tag}-go-{x}').wait()\n"
        "x"
    )
    res = distribute(cell, namespace={"tag": tag}, over="x in range(40)", batch=10, wait=False)
    assert Event(f"{tag}-started-3", client=client).wait(30)
    assert Event(f"{tag}-started-13", client=client).wait(30)
    with dask.config.set({"nbcluster.distribute.cancel-grace": "60s"}):
        stopping = threading.Thread(target=res.cancel)
        stopping.start()
        # Once the workers know the run is stopping, let the two held items finish: each
        # batch then returns its 4 finished items instead of going on to item 4 / 14.
        # The first start's stop token is ``<run id>-1`` (`engine.Engine`).
        token = f"{res.run_id}-1"
        assert until(lambda: all(client.run(stopped_run, token).values()), 30)
        Event(f"{tag}-go-3", client=client).set()
        Event(f"{tag}-go-13", client=client).set()
        stopping.join(60)
    assert not stopping.is_alive()
    missing = object()
    done = [i for i, v in enumerate(res.values(missing=missing)) if v is not missing]
    assert done == [0, 1, 2, 3, 10, 11, 12, 13]
    assert res.counts() == {"total": 40, "done": 8, "failed": 0, "cancelled": 32, "running": 0}
    never = [x for x in (4, 14, 20, 30) if Event(f"{tag}-started-{x}", client=client).is_set()]
    assert never == []  # the workers stopped between items and ran nothing queued

    # The workers are free at once, and retry() runs only what is missing.
    assert list(distribute("x * 2", over="x in range(4)", namespace={})) == [0, 2, 4, 6]
    Event(f"{tag}-started-0", client=client).clear()
    for x in (23, 33):
        Event(f"{tag}-go-{x}", client=client).set()
    assert res.retry() is res and res.ok and list(res) == list(range(40))
    assert not Event(f"{tag}-started-0", client=client).is_set()
    assert Event(f"{tag}-started-4", client=client).is_set()


def test_a_stopped_run_counts_what_it_kept(cluster: Any) -> None:
    # Items 0-2 finish; 3-5 wait on an event that is set only after the stop, so they are
    # still out when the grace ends: cancelled on the scheduler, counted as cancelled.
    tag = _tag()
    three = threading.Event()
    cell = "from distributed import Event\nif x >= 3:\n    Event(f'{tag}-go').wait()\nx"
    res: Results = distribute(
        cell, namespace={"tag": tag}, over="x in range(6)", batch=1, wait=False,
        progress=lambda r: r.counts()["done"] >= 3 and three.set(),
    )  # fmt: skip
    try:
        assert three.wait(30), res.counts()
        with dask.config.set({"nbcluster.distribute.cancel-grace": "0.5s"}):
            res.cancel()
        kept = {"total": 6, "done": 3, "failed": 0, "cancelled": 3, "running": 0}
        assert res.counts() == kept and not res.ok
        assert res.values(missing=None) == [0, 1, 2, None, None, None]
    finally:
        Event(f"{tag}-go", client=cluster.client).set()
    res.cancel()  # again, once stopped: nothing changes
    assert res.counts() == kept


def test_a_cluster_killed_mid_cell_ends_the_cell_with_one_line(runtime_dir: Any, capfd: Any) -> None:
    doomed = nbcluster.start(workers=2, threads=1, name="doomed")
    pid = doomed.entry["supervisor_pid"]
    killed: list[float] = []

    def kill_after_ten(r: Results) -> None:
        if r.counts()["done"] >= 10 and not killed:
            killed.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)

    ns: dict[str, Any] = {}
    cell = "import os, time\ntime.sleep(0.05)\nos.getpid()"
    with pytest.raises(ClusterLost) as info:
        distribute(cell, over="x in range(200)", namespace=ns, into="runs", progress=kill_after_ten)
    assert time.monotonic() - killed[0] < 5
    runs = ns["runs"]
    c = runs.counts()
    assert c["done"] >= 10 and c["failed"] == 0 and c["done"] + c["cancelled"] == 200
    assert re.fullmatch(
        rf"cluster 'doomed' stopped answering \(its (supervisor exited|scheduler stopped answering)\): "
        rf"{c['done']}/200 items finished and are in runs; start a cluster and run runs.retry\(\)",
        str(info.value),
    )
    assert info.value._render_traceback_() == [f"ClusterLost: {info.value}"]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "distributed" not in err, err

    # On a new cluster, retry() runs just the items that were lost.
    before = runs.values()
    nbcluster.start(workers=2, threads=1, name="second")
    assert runs.retry() is runs and runs.ok
    after = list(runs)
    kept = [i for i, v in enumerate(before) if v is not None]
    assert [after[i] for i in kept] == [before[i] for i in kept]  # not run again
    assert not {after[i] for i in range(200) if i not in kept} & {before[i] for i in kept}


def test_a_misleading_first_item_costs_one_time_budget_not_a_long_batch(cluster: Any) -> None:
    # Item 0 is instant, the others take 0.1 s: sized from item 0 alone, the next batch
    # would take everything. Its quarter-second budget sends it back after a few items.
    cell = (
        "import time\nfrom distributed.worker import thread_state\n"
        "if x:\n    time.sleep(0.1)\nthread_state.key"
    )
    res = distribute(cell, over="x in range(40)", namespace={})
    assert res.ok
    per_batch: dict[str, int] = {}
    for key in res:
        per_batch[key] = per_batch.get(key, 0) + 1
    assert max(per_batch.values()) <= 3, per_batch  # 3 x 0.1 s passes the 0.25 s budget


@pytest.mark.parametrize("direct", ["500ms", "0s"], ids=["direct batches", "Dask tasks"])
def test_many_tiny_items_over_a_range_or_a_list_all_come_back_in_order(
    cluster: Any, monkeypatch: pytest.MonkeyPatch, direct: str
) -> None:
    # How the probes share them out is the policy's (`test_policy.py`): here, that every
    # value comes back, in order, whichever way the batches travelled.
    monkeypatch.setitem(dask.config.config["nbcluster"]["distribute"], "direct", direct)
    n = 500_000
    assert distribute(lambda x: x + 1, over=range(n)).values() == list(range(1, n + 1))
    assert distribute(lambda x: x + 1, over=list(range(n))).values() == list(range(1, n + 1))


def test_small_results_are_pushed_and_large_ones_fetched_both_complete(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small batch's result comes with the worker's push (`nbcluster.worker`), which saves the
    # cell a fetch after its last item; a large one, or one whose push never came, is
    # fetched as before. Either way every value arrives, in order. (Batches that are Dask
    # tasks: a direct batch's result comes with its answer, `test_direct`.) A fetch is seen
    # where it costs: the workers' count of transfers out (a Prometheus metric of theirs).
    monkeypatch.setitem(dask.config.config["nbcluster"]["distribute"], "direct", "0s")

    def fetched() -> int:
        return sum(cluster.client.run(lambda dask_worker: dask_worker.transfer_outgoing_count_total).values())

    before = fetched()
    assert list(distribute(lambda x: x * 2, over=range(8))) == [x * 2 for x in range(8)]
    assert fetched() == before, "the small results should have come with their pushes"
    big = distribute(lambda x: bytes([x]) * 20_000, over=range(4))
    assert [len(v) for v in big] == [20_000] * 4 and big[3][0] == 3
    assert fetched() > before, "results over worker.LARGEST_PUSH are fetched"

    # Pushes that never come (a worker of another version, events lost on the way): a client
    # that stops listening after its first run fetches every result, and loses none.
    with Client(cluster.client.scheduler.address, security=cluster.client.security) as deaf:
        assert list(distribute(lambda x: x + 1, over=range(8), on=deaf)) == list(range(1, 9))
        deaf.unsubscribe_topic(PUSHED_TOPIC)
        before = fetched()
        assert list(distribute(lambda x: x + 1, over=range(8), on=deaf)) == list(range(1, 9))
        assert fetched() > before
