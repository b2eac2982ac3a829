"""A run's link to its cluster (`nbcluster/run/target.py`): the workers it sees are asked, not remembered.

On a real cluster of this test's own, scaled between two cells: the second cell's link
sees the worker that came, and a running run's watch sees it too (`usable_threads`).
"""

from __future__ import annotations

from typing import Any

import nbcluster
from nbcluster.run.api import distribute
from nbcluster.run.target import Link, Needs


def test_a_link_sees_the_workers_there_when_it_opens_and_when_asked_again(runtime_dir: Any) -> None:
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:
        first = Link(Needs(), client=client, find=lambda name: None).open()
        assert (first.threads, len(first.workers())) == (1, 1)
        assert list(distribute("x + 1", over="x in range(4)", namespace={}, on=client)) == [1, 2, 3, 4]
        handle.scale(2)
        client.wait_for_workers(2, timeout=60)
        second = Link(Needs(), client=client, find=lambda name: None).open()
        assert second.threads == 2 and set(second.workers()) == set(client.ncores())
        assert first.usable_threads() == 2 and len(first.workers()) == 2  # the watch's question
        res = distribute(
            "from distributed import get_worker\nget_worker().address", over="x in range(40)", namespace={}, on=client
        )  # fmt: skip
        assert res.ok and len(res) == 40
    finally:
        handle.stop()
