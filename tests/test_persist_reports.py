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


def test_a_persist_run_reads_no_report_with_a_round_trip(
    cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    read = _compat.run_on_holder

    def counted(client: Any, key: str, *args: Any) -> Any:
        asked.append(key)
        return read(client, key, *args)

    monkeypatch.setattr(_compat, "run_on_holder", counted)
    ns: dict[str, Any] = {}
    # Items of ~20 ms, a task each.
    made = distribute(
        "import time\ntime.sleep(0.02)\nx * 10", over="x in range(8)", namespace=ns, into="made", persist=True, on=cluster.name
    )  # fmt: skip
    assert made.ok and made.gather() == [x * 10 for x in range(8)]
    assert len({h.future.key for h in made}) == 8
    assert asked == []  # every report came pushed, none was fetched
    made.release()


def test_a_worker_keeps_its_newest_reports_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every persisted item's report is kept on its worker for `report_of` (one the event could
    # not carry): the oldest go first past KEEP_BYTES, and one read is gone from there.
    class Worker:
        key = ""

        def get_current_task(self) -> str:
            return self.key

        def log_event(self, topic: str, message: Any) -> None:
            pass

    worker = Worker()
    monkeypatch.setattr("distributed.get_worker", lambda: worker)
    monkeypatch.setattr(held, "KEEP_BYTES", 10)
    monkeypatch.setattr(held, "_KEPT", type(held._KEPT)())
    monkeypatch.setattr(held, "_KEPT_BYTES", [0])
    for key, report in [("persist-a-0", b"12345"), ("persist-a-1", b"123456"), ("persist-a-2", b"1")]:
        worker.key = key
        held._report(report)
    assert list(held._KEPT) == ["persist-a-1", "persist-a-2"] and held._KEPT_BYTES == [7]
    assert held.report_of("persist-a-2") == b"1" and held._KEPT_BYTES == [6]
    with pytest.raises(KeyError):
        held.report_of("persist-a-0")
