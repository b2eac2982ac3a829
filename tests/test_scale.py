"""Status, metrics and the live widget of a real cluster with 201 workers.

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

import nbcluster
from nbcluster import widgets
from nbcluster.cluster.handle import ClusterHandle
from tests.scale_helpers import simulated_workers

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
    # A local function travels by value: the workers cannot import this test module.
    def inc(x: int) -> int:
        return x + 1

    return inc


_inc = _functions()


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
    assert snap["bands"] and snap["bands"][-1]["workers"] == 201
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
