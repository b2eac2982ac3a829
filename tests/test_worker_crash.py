"""An item that kills its worker: only that item fails, the rest of the run goes on.

A cluster of this module's own (its workers die on purpose), 2 workers x 1 thread. The
crashes are real: `os._exit(1)` in the item, and an item that outgrows its worker's
`--memory` limit until Dask's nanny terminates the process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from nbcluster.cluster.handle import ClusterHandle, start
from nbcluster.errors import WorkerKilled
from nbcluster.run.api import distribute
from nbcluster.run.results import Results

EXITS = "import os\nif x == 3:\n    os._exit(1)\nx * 10"


@pytest.fixture(scope="module")
def fragile() -> Iterator[ClusterHandle]:
    handle = start(workers=2, threads=1, memory="400MiB", name="crash-test")
    try:
        handle.client.wait_for_workers(2, timeout=60)
        yield handle
    finally:
        handle.stop()


def run(source: str, cluster: ClusterHandle, **kwargs: Any) -> Results:
    return distribute(source, namespace={"__name__": "__main__"}, on=cluster.client, **kwargs)


def only_item_3_failed(res: Results, nanny_said: str) -> None:
    assert res.counts() == {"total": 6, "done": 5, "failed": 1, "cancelled": 0, "running": 0}
    assert res.values() == [0, 10, 20, None, 40, 50]
    [error] = res.errors
    assert error.index == 3 and error.type_name == "nbcluster.errors.WorkerKilled"
    assert re.fullmatch(
        rf"item 3 \(x=3\) killed its worker 4 times \(a crash or out of memory\); "
        rf"the worker's nanny logged: {nanny_said}",
        error.message,
    ), error.message
    with pytest.raises(WorkerKilled):
        res[3]


def test_an_item_that_exits_fails_alone_and_the_cluster_goes_on(fragile: ClusterHandle, capfd: Any) -> None:
    # --batch 3 puts items 3, 4 and 5 in one batch: 4 and 5 must come back from a split.
    res = run(EXITS, fragile, over="x in range(6)", batch=3)
    only_item_3_failed(res, r"Worker process \d+ exited with status 1")
    err = capfd.readouterr().err
    assert "internal error" not in err and "Couldn't gather" not in err, err
    # The nannies restarted the workers: the next run has both and succeeds.
    fragile.client.wait_for_workers(2, timeout=60)
    assert list(run("x + 1", fragile, over="x in range(8)")) == list(range(1, 9))


def test_an_item_past_the_memory_limit_fails_alone(fragile: ClusterHandle) -> None:
    # Item 3 keeps allocating until the nanny terminates its worker at 95% of 400 MiB;
    # batches sized by nbcluster, as in a plain `%%distribute --over "x in range(6)"`.
    hog = "import numpy as np\nif x == 3:\n    kept = []\n    while True:\n        kept.append(np.ones(10_000_000))\nx * 10"
    res = run(hog, fragile, over="x in range(6)")
    only_item_3_failed(res, r"Worker \S+ \(pid=\d+\) exceeded 95% memory budget\. Restarting\.\.\.")
