"""A run's link to its cluster (`nbcluster/run/target.py`): which workers it knows of.

On real clusters of the tests' own, scaled: the second cell's link sees the worker that
came, and a running run's watch sees it too (`usable_threads`); the workers a link keeps
stand until the scheduler's plugin says one came or went, and no longer.
"""

from __future__ import annotations

from typing import Any

import pytest

import nbcluster
from nbcluster.run import target
from nbcluster.run.api import distribute
from nbcluster.run.target import Link, Needs
from tests.waiting import until


def test_a_link_sees_the_workers_there_when_it_opens_and_when_asked_again(runtime_dir: Any) -> None:
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:
        first = Link(Needs(), client=client, find=lambda name: None).open()
        assert (first.threads, len(first.workers())) == (1, 1)
        assert list(distribute("x + 1", over="x in range(4)", namespace={}, on=client)) == [1, 2, 3, 4]
        handle.scale(2)
        client.wait_for_workers(2, timeout=60)
        # A new link sees it once the scheduler's news of it arrived (`target.ROSTER_TOPIC`).
        assert until(lambda: Link(Needs(), client=client, find=lambda name: None).open().threads == 2)
        second = Link(Needs(), client=client, find=lambda name: None).open()
        assert set(second.workers()) == set(client.ncores())
        assert first.usable_threads() == 2 and len(first.workers()) == 2  # the watch's question
        res = distribute(
            "from distributed import get_worker\nget_worker().address", over="x in range(40)", namespace={}, on=client
        )  # fmt: skip
        assert res.ok and len(res) == 40
    finally:
        handle.stop()


def news(client) -> int:
    return target._NEWS.get(client, 0)


def test_the_workers_a_link_knows_stand_until_the_scheduler_says_they_changed(runtime_dir, monkeypatch):
    # FRESH_S all but off: only the scheduler's news may keep an answer. SETTLED_S off: the
    # subscription is known to have taken effect here once a first piece of news arrived.
    monkeypatch.setattr(target, "FRESH_S", 1e-9)
    monkeypatch.setattr(target, "SETTLED_S", 0.0)
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:
        (first,) = target._ncores(client, target.FRESH_S)  # asks, and subscribes to the news
        handle.scale(2)
        assert until(lambda: news(client) >= 1), "no news of the worker that came"
        both = target._ncores(client, target.FRESH_S)  # asked again: the news said so
        assert len(both) == 2 and first in both
        asked = target._ASKED[client]
        assert asked.told
        # Nothing came or went since: the answer stands, however old, and nothing is asked.
        assert target._ncores(client, target.FRESH_S) == both
        assert target._ASKED[client] is asked
        before = news(client)
        handle.scale(1)
        assert until(lambda: news(client) > before), "no news of the worker that went"
        assert len(target._ncores(client, target.FRESH_S)) == 1
        # A run's watch thread asks afresh whatever it was told (`usable_threads`).
        asked = target._ASKED[client]
        target._ncores(client, 0.0)
        assert target._ASKED[client] is not asked
    finally:
        handle.stop()


def test_a_scheduler_without_the_plugin_is_asked_each_time(runtime_dir, monkeypatch):
    monkeypatch.setattr(target, "SETTLED_S", 0.0)
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:
        def drop_roster_handler(dask_scheduler=None):  # nested: sent by value, not as an import
            del dask_scheduler.handlers["nbcluster_roster"]

        client.run_on_scheduler(drop_roster_handler)
        target._ncores(client, 1e-9)
        assert client in target._UNTOLD  # asked once what it is, then Dask's ncores each time
        asked = target._ASKED[client]
        assert not asked.told
        assert len(target._ncores(client, 1e-9)) == 1
        assert target._ASKED[client] is not asked
    finally:
        handle.stop()


@pytest.fixture(autouse=True)
def _forget_links():
    yield
    target._ASKED.clear()
