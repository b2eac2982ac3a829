"""A `--persist` batch's report is pushed by its worker, so the kernel asks for none (`distribute/reports.py`).

On the session's shared real cluster: a persisted run of several batches reads no report
with a round trip, and its results are right; a report the kernel did not expect (another
run's, a lineage recompute's) is dropped.
"""

from __future__ import annotations

from typing import Any

import pytest

from nbcluster.cluster.handle import ClusterHandle
from nbcluster.distribute import distribute, engine
from nbcluster.distribute.reports import Inbox


def test_a_persist_run_reads_no_report_with_a_round_trip(
    cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    read = engine.run_on_holder

    def counted(client: Any, key: str, *args: Any) -> Any:
        asked.append(key)
        return read(client, key, *args)

    monkeypatch.setattr(engine, "run_on_holder", counted)
    ns: dict[str, Any] = {}
    # Items of ~20 ms: each probe stops after its first, so the run is several batches.
    made = distribute(
        "import time\ntime.sleep(0.02)\nx * 10", over="x in range(8)", namespace=ns, into="made", persist=True, cluster=cluster.name
    )  # fmt: skip
    assert made.ok and made.gather() == [x * 10 for x in range(8)]
    assert len({h.future.key for h in made}) == 8
    assert asked == []  # every report came pushed, none was fetched
    made.release()


def test_an_inbox_keeps_only_the_reports_it_expects() -> None:
    inbox = Inbox()
    inbox.expect("distribute-aa-1")
    inbox.arrived((0.0, {"key": "distribute-aa-1", "report": b"mine"}))
    inbox.arrived((0.0, {"key": "distribute-bb-1", "report": b"another kernel's"}))
    inbox.arrived((0.0, {"key": "distribute-aa-2", "report": b"not expected (a recompute)"}))
    assert inbox.take("distribute-aa-1", 0.0) == b"mine"
    assert inbox.take("distribute-aa-1", 0.0) is None  # taken once
    assert inbox.take("distribute-bb-1", 0.0) is None
    inbox.expect("distribute-aa-3")
    inbox.forget("distribute-aa-")  # the run ended: a late report is dropped
    inbox.arrived((0.0, {"key": "distribute-aa-3", "report": b"late"}))
    assert inbox.take("distribute-aa-3", 0.0) is None
