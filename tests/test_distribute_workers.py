"""Resource routing and worker loss, on a cluster of this module's own.

The cluster has one CPU worker and one GPU worker. There is no GPU on the test machine, so
the GPU worker is nbcluster's *simulated* one (NBCLUSTER_SIMULATE_GPUS=1): a real Dask
worker process that advertises the `GPU` resource and gets `CUDA_VISIBLE_DEVICES`, as a
real GPU worker would; only the device behind it is missing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from nbcluster.cluster.handle import ClusterHandle, start
from nbcluster.errors import BadArgument
from nbcluster.run.api import distribute, launch
from nbcluster.run.capture import capture
from nbcluster.run.results import Results

WHERE = "from distributed import get_worker\nimport os\n(get_worker().name, os.environ.get('CUDA_VISIBLE_DEVICES'))"


@pytest.fixture(scope="module")
def mixed() -> Iterator[ClusterHandle]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NBCLUSTER_SIMULATE_GPUS", "1")
        handle = start(workers=1, threads=1, gpu_workers=1, name="distribute-mixed")
    try:
        handle.client.wait_for_workers(2, timeout=60)
        yield handle
    finally:
        handle.stop()


def run(source: str, cluster: ClusterHandle, **flags: Any) -> Results:
    """Run `source` as `%%distribute` does, with the flags by their names (`gpus`, `everywhere`...)."""
    return launch(source, namespace={"__name__": "__main__"}, client=cluster.client, **flags)


def test_gpu_items_run_only_on_gpu_workers(mixed: ClusterHandle) -> None:
    res = run(WHERE, mixed, over="x in range(6)", gpus=1)
    assert set(res) == {("gpu-0", "0")}


def test_cpu_only_and_cpus_keep_items_off_gpu_workers(mixed: ClusterHandle) -> None:
    on_cpu = run(WHERE, mixed, over="x in range(6)", cpu_only=True)
    assert {name for name, _ in on_cpu} == {"cpu-0"}
    assert {name for name, _ in run(WHERE, mixed, over="x in range(4)", cpus=1)} == {"cpu-0"}


def test_everywhere_with_gpus_means_every_gpu_worker(mixed: ClusterHandle) -> None:
    res = run(WHERE, mixed, everywhere=True, gpus=1)
    assert list(res) == [("gpu-0", "0")]
    assert len(run(WHERE, mixed, everywhere=True)) == 2


def test_impossible_restrictions_are_refused_before_anything_runs(mixed: ClusterHandle) -> None:
    with pytest.raises(BadArgument, match=r"no worker offers GPU=2 per item \(workers offer: CPU=1; GPU=1\)"):
        run(WHERE, mixed, over="x in range(3)", gpus=2)
    with pytest.raises(BadArgument, match="no worker offers CPU=4 per item"):
        run(WHERE, mixed, over="x in range(3)", cpus=4)


def test_a_worker_killed_mid_cell_still_gives_every_result_exactly_once(mixed: ClusterHandle) -> None:
    client = mixed.client
    pids = client.run(os.getpid)
    victim = next(
        pid for address, pid in pids.items() if client.scheduler_info()["workers"][address]["name"] == "cpu-0"
    )
    killed = threading.Event()

    def kill_after_some(r: Results) -> None:
        if r.counts()["done"] >= 6 and not killed.is_set():
            killed.set()
            os.kill(victim, signal.SIGKILL)

    ns = {"__name__": "__main__", "big": np.arange(300_000, dtype=np.float64)}  # a large capture too
    res = distribute(
        "import time\ntime.sleep(0.05)\nx * x + int(big[1])",
        namespace=ns,
        over="x in range(60)",
        batch=2,
        on=client,
        progress=kill_after_some,
    )
    assert killed.is_set()
    assert list(res) == [x * x + 1 for x in range(60)]
    assert res.ok and res.counts() == {"total": 60, "done": 60, "failed": 0, "cancelled": 0, "running": 0}
    assert res.errors == []
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker
    assert victim not in client.run(os.getpid).values()


def test_a_large_value_lost_with_its_last_holder_is_sent_again(mixed: ClusterHandle) -> None:
    client = mixed.client
    client.wait_for_workers(2, timeout=60)
    ns = {"__name__": "__main__", "big": np.full(300_000, 2.0)}
    assert run_in(ns, "float(big[0]) + x", client, over="x in range(4)").ok
    # Dask's memory manager leaves one replica; kill its worker while the next cell runs.
    client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.extensions["amm"].run_once())
    key = f"nbcluster-capture-{capture({'big': 1}, ns).large['big'][1]}"
    holder = client.who_has()[key]
    assert len(holder) == 1
    victim = client.run(os.getpid)[holder[0]]
    killed = threading.Event()

    def kill_holder(r: Results) -> None:
        if r.counts()["done"] >= 2 and not killed.is_set():
            killed.set()
            os.kill(victim, signal.SIGKILL)

    res = run_in(
        ns,
        "import time\ntime.sleep(0.1)\nfloat(big[0]) + x",
        client,
        over="x in range(40)",
        batch=1,
        progress=kill_holder,
    )
    assert killed.is_set()
    assert list(res) == [2.0 + x for x in range(40)] and res.ok
    assert client.who_has().get(key)  # the kernel sent it again
    client.wait_for_workers(2, timeout=60)


def run_in(ns: dict[str, Any], source: str, client: Any, **kwargs: Any) -> Results:
    return distribute(source, namespace=ns, on=client, **kwargs)
