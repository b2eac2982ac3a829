"""GPU workers, on a CPU machine: discovery, and simulated GPUs for layout, routing, scaling.

Simulated GPUs (NBCLUSTER_SIMULATE_GPUS) are workers that advertise the GPU resource and a
device index without a device behind them; everything here but the hardware is real.
"""

from __future__ import annotations

import os
import time

import pytest
from distributed import get_worker

import nbcluster
from nbcluster.cluster import gpu
from nbcluster.errors import BadArgument
from tests.waiting import waited_for


def kinds(handle: nbcluster.ClusterHandle) -> dict[str, int]:
    counts = {"cpu": 0, "gpu": 0}
    for w in handle.info().workers:
        counts[w["kind"]] += 1
    return counts


def test_discovery_without_gpus_is_empty_and_simulation_only_when_asked():
    # Without the variable, only real devices are found (none on a CPU machine).
    assert not any(g.simulated for g in gpu.discover({}))
    sim = gpu.discover({gpu.SIMULATE_ENV: "2"})
    assert [g.index for g in sim] == [0, 1] and all(g.simulated for g in sim)
    assert gpu.select(None, sim) == [] and gpu.select("auto", []) == []
    assert gpu.select(1, sim) == sim[:1]
    with pytest.raises(BadArgument, match="only 2 GPU"):
        gpu.select(3, sim)
    with pytest.raises(BadArgument, match="whole number"):
        gpu.discover({gpu.SIMULATE_ENV: "many"})


def test_nvidia_smi_fallback_parses_devices():
    text = "GPU 0: NVIDIA H200 (UUID: GPU-1234)\nGPU 1: NVIDIA H200 (UUID: GPU-5678)\n"
    devices = gpu.parse_nvidia_smi_list(text)
    assert [(d.index, d.name, d.uuid) for d in devices] == [(0, "NVIDIA H200", "GPU-1234"), (1, "NVIDIA H200", "GPU-5678")]


@pytest.fixture
def gpu_cluster(runtime_dir, monkeypatch):
    monkeypatch.setenv(gpu.SIMULATE_ENV, "2")
    return nbcluster.start(workers=1, gpu_workers="auto")


def test_one_pinned_worker_per_gpu_plus_cpu_workers(gpu_cluster):
    info = gpu_cluster.info()
    assert kinds(gpu_cluster) == {"cpu": 1, "gpu": 2}
    gpus = {w["name"]: w for w in info.workers if w["kind"] == "gpu"}
    assert {w["resources"]["GPU"] for w in gpus.values()} == {1}
    assert all(w["gpu"]["simulated"] for w in gpus.values())
    assert "[simulated]" in repr(info) and "[simulated]" in info._repr_html_()
    visible = gpu_cluster.client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    by_name = {w["address"]: w["name"] for w in info.workers}
    pinned = {by_name[a]: v for a, v in visible.items() if by_name[a].startswith("gpu-")}
    assert pinned == {"gpu-0": "0", "gpu-1": "1"}


def test_gpu_items_run_only_on_gpu_workers(gpu_cluster):
    client = gpu_cluster.client
    on_gpu = client.gather(client.map(lambda i: get_worker().name, range(20), resources={"GPU": 1}))
    on_cpu = client.gather(client.map(lambda i: get_worker().name, range(20, 40), resources={"CPU": 1}))
    assert set(on_gpu) <= {"gpu-0", "gpu-1"}
    assert set(on_cpu) == {"cpu-0"}


def test_scaling_is_per_kind(gpu_cluster):
    gpu_cluster.scale(0, kind="gpu")
    assert kinds(gpu_cluster) == {"cpu": 1, "gpu": 0}
    gpu_cluster.scale(2, kind="cpu")
    assert kinds(gpu_cluster) == {"cpu": 2, "gpu": 0}
    gpu_cluster.scale(2, kind="gpu")
    assert kinds(gpu_cluster) == {"cpu": 2, "gpu": 2}
    visible = set(gpu_cluster.client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES")).values())
    assert {"0", "1"} <= visible
    with pytest.raises(BadArgument, match="has 2 GPU"):
        gpu_cluster.scale(3, kind="gpu")


def test_adaptive_scaling_counts_gpu_backlog_separately(gpu_cluster):
    gpu_cluster.adapt(minimum=1, maximum=1)
    # Idle GPU workers are retired; the CPU kind stays at its minimum.
    # Worker counts under adaptivity: a cluster fact with no event to wait on.
    waited_for(lambda: kinds(gpu_cluster) == {"cpu": 1, "gpu": 0}, "scale-down to one CPU worker", 60)
    client = gpu_cluster.client
    futures = client.map(lambda i: time.sleep(1) or get_worker().name, range(6), resources={"GPU": 1})
    # A GPU backlog brings GPU workers back (one per device), never extra CPU workers.
    waited_for(lambda: kinds(gpu_cluster)["gpu"] == 2, "two GPU workers", 60)
    assert kinds(gpu_cluster)["cpu"] == 1
    assert set(client.gather(futures)) <= {"gpu-0", "gpu-1"}
    info = gpu_cluster.info()
    assert info["adaptive"] == {"minimum": 1, "maximum": 1, "gpu_maximum": 2}


def test_simulated_gpus_are_labelled_in_the_metrics_and_the_static_picture(gpu_cluster):
    from nbcluster.widgets._static import _label

    gpu_cluster.client.submit(lambda: 1, resources={"GPU": 1}).result()
    snapshot = gpu_cluster.metrics()
    by_name = {w["name"]: (addr, w) for addr, w in snapshot["workers"].items()}
    addr, gpu0 = by_name["gpu-0"]
    assert gpu0["gpu"]["simulated"] is True and gpu0["gpu"]["name"] == "Simulated GPU"
    assert "gpu" not in by_name["cpu-0"][1]
    assert _label(snapshot, addr) == "gpu-0 (simulated GPU)"
