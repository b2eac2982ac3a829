"""A `--persist` item's report (its output, its value's description) reaches the kernel; its value stays.

On the session's shared real cluster: every item's report reaches the kernel, pushed by its
worker (`run/transport.py`), so a persisted run of several batches reads none with a round
trip; a report the kernel did not expect (another run's, a lineage recompute's) is dropped;
a worker keeps its reports within a bound, for those that were not pushed.
"""

from __future__ import annotations

from typing import Any

import pytest

from nbcluster import _compat
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.run.api import distribute
from nbcluster.worker import held


def test_a_persist_run_reads_every_report_and_its_values_stay_on_the_workers(cluster: ClusterHandle) -> None:
    ns: dict[str, Any] = {}
    # Items of ~20 ms, a task each, printing: their reports carry the output and the description.
    made = distribute(
        "import time\ntime.sleep(0.02)\nprint(x)\nx * 10", over="x in range(8)", namespace=ns, into="made", persist=True, on=cluster.name
    )  # fmt: skip
    assert made.ok and made.gather() == [x * 10 for x in range(8)]
    assert len({h.future.key for h in made}) == 8
    assert [made.output(i) for i in range(8)] == [f"{x}\n" for x in range(8)]
    assert all(h.describe() == "int, 28 B" for h in made), [h.describe() for h in made]
    made.release()


def test_a_persist_run_reads_no_report_with_a_round_trip(cluster: ClusterHandle) -> None:
    ns: dict[str, Any] = {}
    # Items of ~20 ms, a task each.
    made = distribute(
        "import time\ntime.sleep(0.02)\nx * 10", over="x in range(8)", namespace=ns, into="made", persist=True, on=cluster.name
    )  # fmt: skip
    assert made.ok and made.gather() == [x * 10 for x in range(8)]
    assert len({h.future.key for h in made}) == 8
    # Every report came pushed, none was fetched: a round trip takes the report it reads from
    # its worker (`held.report_of`), so each one is still there to take.
    keys = [h.future.key for h in made]
    assert all(_compat.run_on_holder(cluster.client, key, held.report_of, key) for key in keys)
    made.release()


def test_a_worker_keeps_its_newest_reports_within_a_bound() -> None:
    # Every persisted item's report is kept on its worker for `report_of` (one the event could
    # not carry): the oldest go first past the bound, and one read is gone from there.
    kept = held.Kept(limit=10)
    for key, report in [("persist-a-0", b"12345"), ("persist-a-1", b"123456"), ("persist-a-2", b"1")]:
        kept.add(key, report, len(report))
    assert kept.size == 7
    with pytest.raises(KeyError):
        kept.get("persist-a-0", take=True)
    assert kept.get("persist-a-2", take=True) == b"1" and kept.size == 6
    kept.add("persist-a-1", b"12", 2)  # a recompute's report replaces its own
    assert kept.size == 2 and kept.get("persist-a-1", take=True) == b"12"
