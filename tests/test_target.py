"""A run's link to its cluster (`nbcluster/run/transport.py`): which workers it knows of.

On real clusters of the tests' own, scaled: the second cell's link sees the worker that
came, and a running run's watch sees it too (`usable_threads`); the workers a link keeps
stand until the scheduler's plugin says one came or went, and no longer: counted as the
questions the scheduler answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import nbcluster
from nbcluster.run import transport
from nbcluster.run.api import distribute
from nbcluster.run.transport import Link, Needs
from tests.waiting import until


def test_a_link_sees_the_workers_there_when_it_opens_and_when_asked_again(runtime_dir: Any) -> None:
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:
        first = Link(Needs(), client=client, find=lambda name: None).open()
        assert (first.threads, len(first.eligible)) == (1, 1)
        assert list(distribute("x + 1", over="x in range(4)", namespace={}, on=client)) == [1, 2, 3, 4]
        handle.scale(2)
        client.wait_for_workers(2, timeout=60)
        # A new link sees it once the scheduler's news of it arrived (`transport.ROSTER_TOPIC`).
        assert until(lambda: Link(Needs(), client=client, find=lambda name: None).open().threads == 2)
        second = Link(Needs(), client=client, find=lambda name: None).open()
        assert set(second.eligible) == set(client.ncores())
        assert first.usable_threads() == 2 and len(first.eligible) == 2  # the watch's question
        res = distribute(
            "from distributed import get_worker\nget_worker().address", over="x in range(40)", namespace={}, on=client
        )  # fmt: skip
        assert res.ok and len(res) == 40
    finally:
        handle.stop()


def _questions(client: Any) -> Callable[[], int]:
    """Count from now on the scheduler's answers about its workers (nbcluster's
    `nbcluster_roster`, Dask's `ncores`); a function that reads the count."""

    def count(dask_scheduler: Any = None) -> None:  # nested: sent by value, not as an import
        counts = dask_scheduler.nbcluster_test_questions = [0]
        for op in ("nbcluster_roster", "ncores"):
            if (real := dask_scheduler.handlers.get(op)) is not None:

                def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                    counts[0] += 1
                    return _real(*args, **kwargs)

                dask_scheduler.handlers[op] = counted

    def read(dask_scheduler: Any = None) -> int:
        return int(dask_scheduler.nbcluster_test_questions[0])

    client.run_on_scheduler(count)
    return lambda: int(client.run_on_scheduler(read))


def test_the_workers_a_link_knows_stand_until_the_scheduler_says_they_changed(runtime_dir: Any) -> None:
    # Time passing is what is tested here: the sleeps wait out `SETTLED_S` and `FRESH_S`.
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client

    def link() -> Link:
        return Link(Needs(), client=client, find=lambda name: None).open()

    try:
        asked = _questions(client)
        watched = link()  # asks, and subscribes to the news
        assert asked() == 1
        time.sleep(transport.SETTLED_S)
        assert link().threads == 1 and asked() == 2  # past FRESH_S: asked, now with the news on
        time.sleep(transport.FRESH_S)
        assert link().threads == 1 and asked() == 2  # nothing came or went: the answer stands
        handle.scale(2)
        assert until(lambda: link().threads == 2), "no news of the worker that came"
        seen = asked()
        assert link().threads == 2 and asked() == seen
        handle.scale(1)
        assert until(lambda: link().threads == 1), "no news of the worker that went"
        seen = asked()
        assert watched.usable_threads() == 1 and asked() == seen + 1  # a run's watch asks afresh
    finally:
        handle.stop()


def test_a_scheduler_without_the_plugin_is_asked_each_time(runtime_dir: Any) -> None:
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:

        def drop_roster_handler(dask_scheduler: Any = None) -> None:  # nested: sent by value
            del dask_scheduler.handlers["nbcluster_roster"]

        client.run_on_scheduler(drop_roster_handler)
        asked = _questions(client)  # Dask's ncores now
        for n in (1, 2, 3):  # the last one a second past the subscription: still no news to keep it
            assert Link(Needs(), client=client, find=lambda name: None).open().threads == 1
            assert asked() == n
            time.sleep(transport.FRESH_S)
    finally:
        handle.stop()
