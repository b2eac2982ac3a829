"""`%%distribute` on an adaptive cluster: the run's backlog grows it, and it shrinks after.

The engine keeps only about two batches per worker thread submitted, so the scheduler
alone never sees a backlog; the run reports what it holds back (issue 21, defect 3). A
real adaptive cluster (`adapt --min 1 --max 3`): 80 items of 0.25 s, 20 s of work, are
4 workers' worth at Dask's 5 s target duration, so it must reach its maximum.
"""

from __future__ import annotations

from typing import Any

import nbcluster
from nbcluster.run.api import distribute
from tests.waiting import until

ITEM = "import time\nfrom distributed import get_worker\ntime.sleep(0.25)\nget_worker().name"


def test_a_run_grows_an_adaptive_cluster_to_its_max_and_it_shrinks_back(runtime_dir: Any) -> None:
    handle = nbcluster.start(workers=1, threads=1, name="adaptive")
    handle.adapt(1, 3)
    client = handle.client
    res = distribute(ITEM, over="x in range(80)", namespace={}, on=client)
    assert res.ok
    # Three workers ran items: the cluster grew to its max, and the new workers got batches.
    assert len(set(res)) == 3, sorted(set(res))
    # Dask's adaptive loop retires idle workers: there is no event to wait on.
    assert until(lambda: len(client.scheduler_info()["workers"]) == 1, 60, 0.2)


def test_a_worker_that_joins_a_direct_run_gets_its_batches_directly(runtime_dir: Any) -> None:
    # A run's first seconds go to the workers directly (run/transport.py); one that joins
    # then (adapt, or `%cluster scale`) takes direct batches too, not the scheduler's tasks.
    handle = nbcluster.start(workers=1, threads=1, name="joining")
    try:
        client = handle.client
        client.wait_for_workers(1, timeout=60)
        cell = (
            "import time\n"
            "from distributed import get_worker\n"
            "from nbcluster._compat import running_task_key\n"
            "time.sleep(0.1)\n"
            "(get_worker().name, running_task_key() is None)"
        )
        runs = distribute(cell, over="x in range(50)", namespace={}, on=client, wait=False)
        handle.scale(2)
        res = nbcluster.wait(runs)
        assert res.ok and len({name for name, _ in res}) == 2, "the worker that joined ran none"
        assert all(direct for _, direct in res), "the worker that joined got Dask tasks"
    finally:
        handle.stop()


def test_a_backlog_report_counts_until_it_is_ended_or_goes_stale() -> None:
    from nbcluster.cluster.adaptive import BACKLOG_TTL, Backlogs

    now = [100.0]
    held = Backlogs(clock=lambda: now[0])
    held.report("run-a", "cpu", 40, 10.0)
    held.report("run-b", "gpu", 2, 4.0)
    assert held.total("cpu") == (40, 10.0) and held.total("gpu") == (2, 4.0)
    held.report("run-a", "cpu", 0, 0.0)  # the run ended
    assert held.total("cpu") == (0, 0.0)
    now[0] += BACKLOG_TTL + 1  # a kernel that died stops counting
    assert held.total("gpu") == (0, 0.0)


def test_workers_running_a_runs_direct_batches_count_as_busy_until_it_says_otherwise() -> None:
    from nbcluster.cluster.adaptive import BACKLOG_TTL, Backlogs

    now = [100.0]
    held = Backlogs(clock=lambda: now[0])
    held.report("run-a", "cpu", 0, 0.0, busy=["tls://10.0.0.1:1"])  # nothing held back, one worker busy
    held.report("run-b", "cpu", 3, 1.0, busy=["tls://10.0.0.2:1"])
    assert held.busy() == {"tls://10.0.0.1:1", "tls://10.0.0.2:1"} and held.total("cpu") == (3, 1.0)
    held.report("run-a", "cpu", 0, 0.0)  # its batches came back
    assert held.busy() == {"tls://10.0.0.2:1"}
    now[0] += BACKLOG_TTL + 1  # a kernel that died stops counting
    assert held.busy() == set()


def test_a_worker_running_direct_batches_is_not_retired_under_them(runtime_dir: Any, tmp_path: Any) -> None:
    # Two workers, adapting between 1 and 2: the run holds back little, so the target soon
    # drops to 1, and the scheduler sees no task on a worker that runs direct batches.
    # Named busy in the run's reports, neither is retired mid-batch: no item runs twice.
    import dask.config

    handle = nbcluster.start(workers=2, threads=1, name="adaptive-direct")
    try:
        client = handle.client
        client.wait_for_workers(2, timeout=60)
        handle.adapt(1, 2)
        cell = "import time\nwith open(f'{folder}/{x}', 'a') as f:\n    f.write('ran\\n')\ntime.sleep(0.2)\nx"
        with dask.config.set({"nbcluster.distribute.direct": "60s"}):
            res = distribute(cell, over="x in range(40)", namespace={"folder": str(tmp_path)}, on=client)
        assert res.ok and list(res) == list(range(40))
        twice = {x: n for x in range(40) if (n := (tmp_path / str(x)).read_text().count("ran")) != 1}
        assert not twice, f"items run more than once (a worker retired under its batch): {twice}"
    finally:
        handle.stop()
