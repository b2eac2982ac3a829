"""A run's item counts reach the scheduler as Dask events on `PROGRESS_TOPIC`.

The kernel's live view (or, for a run over before its view shows, the progress hook) reports
a run's counts; nbcluster's scheduler plugin keeps the latest per run, which the sidebar and
``%cluster status`` show. Real runs: on the session's cluster (the plugin is there), and on a
plain Dask scheduler and worker started here, without the plugin, whose event log Dask bounds.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

from nbcluster._wire import PROGRESS_TOPIC
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.run.api import distribute
from nbcluster.widgets import REPORT_GAP_S, progress_hook
from tests.os_helpers import stop_all
from tests.waiting import until, waited_for
from tests.widget_helpers import Recorder, square

#: Events a topic keeps on the plain scheduler (``distributed.admin.low-level-log-length``).
KEPT = 4


def _reports(client: Client, run: str) -> list[tuple[float, dict[str, Any]]]:
    return [(t, m) for t, m in client.get_events(PROGRESS_TOPIC) if m.get("run") == run]


def test_a_runs_counts_reach_the_scheduler_while_it_runs_a_few_times_a_second(cluster: ClusterHandle) -> None:
    # The view ticks 100 times a second and the counts change with every item: the reports
    # to the scheduler still come at most once every REPORT_GAP_S.
    hook = progress_hook(delay=0, interval=0.01, _display=Recorder(), _widgets=True)
    results = distribute(square, over=range(30), batch=1, on=cluster.client, progress=hook)
    assert hook.live is not None
    hook.live.close()

    def final() -> dict[str, Any] | None:
        mine = [r for r in cluster.metrics().get("runs") or () if r["run"] == results.run_id]
        return mine[-1] if mine and mine[-1].get("state") == "done" else None

    last = waited_for(final, "the run's final counts in the plugin's snapshot")
    assert (last["done"], last["failed"], last["total"]) == (30, 0, 30)
    reports = _reports(cluster.client, results.run_id)
    assert reports[0][1]["state"] == "running", reports  # heard of while it ran, not only at its end
    times = [t for t, _ in reports]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Arrival times carry the network's jitter: half the gap still tells 4 a second from 100.
    assert gaps and min(gaps) > REPORT_GAP_S / 2, gaps
    assert len(reports) <= (times[-1] - times[0]) / REPORT_GAP_S + 2


@pytest.fixture
def plain_dask(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Dask scheduler (no nbcluster plugin, `KEPT` events a topic) and one worker; always stopped."""
    env = {**os.environ, "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": str(KEPT)}
    info, log = tmp_path / "scheduler.json", tmp_path / "scheduler.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(info)],
                    env=env, stdout=subprocess.DEVNULL, stderr=out,
                )
            )  # fmt: skip
        # The scheduler says nothing when ready but its file.
        until(lambda: procs[0].poll() is not None or (info.exists() and info.read_text().strip()), 30, 0.05)
        assert procs[0].poll() is None and info.exists(), "the scheduler did not start"
        address = json.loads(info.read_text())["address"]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", "127.0.0.1",
                 "--nthreads", "1", "--no-nanny", "--no-dashboard"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        yield address, log
    finally:
        stop_all(procs)


def test_a_scheduler_without_the_plugin_keeps_a_bounded_log_and_says_nothing(
    plain_dask: tuple[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    address, log = plain_dask
    caplog.set_level(logging.INFO)
    with Client(address) as client:
        client.wait_for_workers(1, timeout=30)
        runs = []
        for _ in range(KEPT + 3):  # each run over before its view shows: one report at its end
            results = distribute(square, over=range(2), on=client, progress=progress_hook(delay=30))
            assert results.values() == [0, 1]
            runs.append(results.run_id)

        def kept() -> list[str]:
            return [m["run"] for _, m in client.get_events(PROGRESS_TOPIC)]

        # A long session's reports stay as many as Dask keeps of any topic: the newest.
        assert until(lambda: kept() == runs[-KEPT:]), kept()
        assert all(m["done"] == 2 and m["state"] == "done" for _, m in client.get_events(PROGRESS_TOPIC))
    # Neither side complained of the reports: the scheduler took them as plain events.
    said = [r.getMessage() for r in caplog.records] + log.read_text().splitlines()
    assert not [line for line in said if "progress" in line], said
