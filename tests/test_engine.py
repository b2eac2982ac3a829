"""The engine on the shared real cluster: first results at once, stops that keep finished work.

Items wait on `distributed.Event`s that the test sets, so what is finished, running or
never started is decided by the test, not by timing.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import dask.config
from distributed import Event

from nbcluster.distribute import Results, distribute


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def test_the_first_result_arrives_while_every_other_item_is_still_blocked(cluster: Any) -> None:
    tag = _tag()
    first = threading.Event()
    res = distribute(
        "from distributed import Event\nEvent(f'{tag}-go-{x}' if x == 0 else f'{tag}-go').wait()\nx",
        namespace={"tag": tag},
        over="x in range(200)",
        wait=False,
        progress=lambda r: r.counts()["done"] and first.set(),
    )
    try:
        Event(f"{tag}-go-0", client=cluster.client).set()  # only item 0 may finish
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
        assert res._engine.stop_sent.wait(30)
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
    res: Results = distribute("x", over="x in range(5)", namespace={})
    res.cancel()  # after the end: nothing changes
    assert res.ok and res.counts()["cancelled"] == 0
