"""A run's link to its cluster (`nbcluster/run/target.py`): the workers it sees.

On a real cluster of this test's own, scaled: a link asks the scheduler when it opens, and
a run's watch thread asks again (`usable_threads`), so a worker that joins is seen at once.
"""

from __future__ import annotations

import pytest

import nbcluster
from nbcluster.errors import NoCluster
from nbcluster.run.target import Link, Needs
from tests.waiting import until


def _nowhere(name: str | None) -> None:
    raise NoCluster("no cluster")


def test_a_link_sees_the_workers_there_when_it_opens_and_when_it_asks_again(runtime_dir):
    handle = nbcluster.start(workers=1, threads=1)
    client = handle.client
    try:
        link = Link(Needs(), client=client, find=_nowhere).open()
        assert len(link.eligible) == 1 and link.threads == 1 and link.submit_kwargs == {}
        handle.scale(2)
        assert until(lambda: link.usable_threads() == 2), "the worker that joined was not seen"
        again = Link(Needs(), client=client, find=_nowhere).open()
        assert sorted(again.eligible) == sorted(client.ncores()) and again.threads == 2
    finally:
        handle.stop()


def test_a_link_without_a_cluster_says_how_to_run_anyway() -> None:
    with pytest.raises(NoCluster, match=r"^no cluster; or run the items in this kernel with --local$"):
        Link(Needs(), find=_nowhere).open()
