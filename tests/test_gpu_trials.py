"""GPU trials: fractional `--gpus` items sharing a GPU, workers of several GPUs, and the
`CUDA_VISIBLE_DEVICES` each trial sees.

There is no GPU on the test machine, so the GPU workers are nbcluster's *simulated* ones
(NBCLUSTER_SIMULATE_GPUS=N): real Dask worker processes that advertise the `GPU` resource
and get `CUDA_VISIBLE_DEVICES` as real GPU workers would; only the devices behind them are
missing. bench/gpu_check.py runs the same checks on a machine with real GPUs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import _current
from nbcluster.cluster import gpu
from nbcluster.cluster.handle import ClusterHandle, start
from nbcluster.cluster.spec import GPU_THREADS, ClusterSpec
from nbcluster.commands import parse
from nbcluster.errors import BadArgument
from nbcluster.run.api import distribute


def _stop(handle: ClusterHandle) -> None:
    _current.forget(handle.name)
    handle.stop()


@pytest.fixture
def one_gpu(runtime_dir: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterHandle]:
    """One CPU worker and one (simulated) GPU worker with the default threads."""
    monkeypatch.setenv(gpu.SIMULATE_ENV, "1")
    handle = start(workers=1, gpu_workers=1, name="gpu-trials-1")
    try:
        handle.client.wait_for_workers(2, timeout=60)
        yield handle
    finally:
        _stop(handle)


def test_quarter_gpu_trials_run_four_at_once_on_one_gpu_worker(one_gpu: ClusterHandle) -> None:
    from distributed import Event, Queue

    workers = {w["name"]: w for w in one_gpu.info().workers}
    assert workers["gpu-0"]["nthreads"] == GPU_THREADS == 4
    assert workers["gpu-0"]["resources"] == {"GPU": 1}
    client = one_gpu.client
    arrived, go = Queue("gpu-trials-arrived", client=client), Event("gpu-trials-go", client=client)

    def trial(x: int) -> tuple[str, str | None]:
        import os

        from distributed import Event, Queue, get_worker

        Queue("gpu-trials-arrived").put(x)
        Event("gpu-trials-go").wait(120)  # held until all four are in: they run at once
        return get_worker().name, os.environ.get("CUDA_VISIBLE_DEVICES")

    results = distribute(
        trial, over=range(4), needs=nbcluster.Needs(gpus=0.25), batch=1, on=one_gpu, wait=False
    )
    try:
        # Four trials running together on the worker's one GPU; one thread would let in one.
        seen = sorted(arrived.get(timeout=60) for _ in range(4))
    finally:
        go.set()  # releases the trials even when fewer arrived, so the run ends
    assert seen == [0, 1, 2, 3]
    nbcluster.wait(results)
    assert set(results.values()) == {("gpu-0", "0")}


def test_a_whole_gpu_trial_still_runs_alone(one_gpu: ClusterHandle) -> None:
    # The GPU resource admits one `--gpus 1` item at a time, whatever the threads.
    def span(x: int) -> tuple[float, float]:
        import time

        start = time.monotonic()
        time.sleep(0.3)  # the trial's work: long enough to overlap if two ran together
        return start, time.monotonic()

    spans = sorted(distribute(span, over=range(3), needs=nbcluster.Needs(gpus=1), batch=1, on=one_gpu).values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_adapting_starts_one_gpu_worker_for_four_quarter_trials(
    runtime_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import Event, Queue

    monkeypatch.setenv(gpu.SIMULATE_ENV, "2")
    handle = start(workers=1, gpu_workers="auto", name="gpu-trials-adapt")
    try:
        client = handle.client
        handle.adapt(minimum=1, maximum=1)
        # Idle GPU workers retire first; then four quarter-GPU trials are the backlog.
        deadline = time.monotonic() + 60
        while handle.info()["requested"]["gpu"]:
            assert time.monotonic() < deadline, "idle GPU workers were not retired"
            time.sleep(0.2)  # adaptivity's rounds: no event to wait on
        arrived, go = Queue("gpu-adapt-arrived", client=client), Event("gpu-adapt-go", client=client)

        def trial(x: int) -> str:
            from distributed import Event, Queue, get_worker

            Queue("gpu-adapt-arrived").put(x)
            Event("gpu-adapt-go").wait(120)
            return str(get_worker().name)

        futures = client.map(trial, range(4), resources={"GPU": 0.25})
        try:
            assert sorted(arrived.get(timeout=60) for _ in range(4)) == [0, 1, 2, 3]
            # They fill one GPU worker: adapting asked for one, not one per trial (two here).
            assert handle.info()["requested"]["gpu"] == 1
        finally:
            go.set()
        assert len(set(client.gather(futures))) == 1
    finally:
        _stop(handle)


def test_two_gpu_workers_from_the_magic_give_each_trial_both_its_gpus(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gpu.SIMULATE_ENV, "4")
    shell.run_line_magic(
        "cluster", "start --workers 1 --gpu-workers auto --gpus-per-worker 2 --gpu-threads 1 --name gpu-trials-2"
    )
    handle = _current.current()
    assert handle is not None and handle.name == "gpu-trials-2"
    try:
        handle.client.wait_for_workers(3, timeout=60)
        gpus = {w["name"]: w for w in handle.info().workers if w["kind"] == "gpu"}
        assert sorted(gpus) == ["gpu-0", "gpu-2"]
        assert {w["resources"]["GPU"] for w in gpus.values()} == {2}
        assert {w["nthreads"] for w in gpus.values()} == {2}  # --gpu-threads 1, per GPU
        shown = repr(handle.info())
        assert "4 GPUs" in shown and "GPU 0 (+1 more): Simulated GPU" in shown, shown
        where = "from distributed import get_worker\nimport os\n(get_worker().name, os.environ['CUDA_VISIBLE_DEVICES'])"
        seen = distribute(where, over="x in range(8)", needs=nbcluster.Needs(gpus=2), on=handle, namespace={})
        assert set(seen) <= {("gpu-0", "0,1"), ("gpu-2", "2,3")} and len(set(seen)) >= 1
        everywhere = dict(handle.client.run(lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES")))
        assert sorted(v for v in everywhere.values() if v) == ["0,1", "2,3"]
        # One of a worker's two GPUs cannot be given: the trial would see both. Refused.
        for asked in (1, 0.5):
            with pytest.raises(BadArgument, match=rf"^--gpus {asked:g}: this cluster's GPU workers hold 2 GPUs each"):
                distribute(where, over=[1], needs=nbcluster.Needs(gpus=asked), on=handle, namespace={})
        with pytest.raises(BadArgument, match=r"cannot scale to 3 GPU workers: this cluster has 4 GPU\(s\) \(2 per GPU worker\)"):
            handle.scale(3, kind="gpu")
    finally:
        _stop(handle)


def test_gpu_selection_counts_whole_workers() -> None:
    sim = gpu.discover({gpu.SIMULATE_ENV: "5"})
    assert [d.index for d in gpu.select("auto", sim, 2)] == [0, 1, 2, 3]  # the fifth makes no worker
    assert [[d.index for d in g] for g in gpu.groups(sim[:4], 2)] == [[0, 1], [2, 3]]
    with pytest.raises(BadArgument, match=r"^--gpu-workers 3 of 2 GPUs each: this machine has only 5 GPU"):
        gpu.select(3, sim, 2)


def test_start_options_are_checked_with_one_line() -> None:
    from nbcluster.server.handlers import START_FIELDS
    from nbcluster.server.openapi import document

    ns = parse("start --gpus-per-worker 2 --gpu-threads 3")
    assert (ns.gpus_per_worker, ns.gpu_threads) == ("2", "3")
    # The REST start body takes them, typed in the OpenAPI document like --threads.
    assert {"gpus_per_worker", "gpu_threads"} <= set(START_FIELDS)
    body = document()["paths"]["/api/clusters"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["gpus_per_worker"]["type"] == ["integer", "string"]
    spec = ClusterSpec.from_user(gpu_workers=1, gpus_per_worker="2", gpu_threads="3")
    assert (spec.gpus_per_worker, spec.gpu_threads) == (2, 3)
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(BadArgument, match=r"^--gpus-per-worker must be at least 1, not 0$"):
        ClusterSpec.from_user(gpus_per_worker=0)
    with pytest.raises(BadArgument, match=r"^--gpu-threads must be a whole number, not 'many'$"):
        ClusterSpec.from_user(gpu_threads="many")
    with pytest.raises(BadArgument, match=r"^--gpus-per-worker: dask-cuda workers hold one GPU each"):
        ClusterSpec.from_user(gpus_per_worker=2, gpu_backend="dask-cuda")
