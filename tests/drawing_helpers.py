"""A snapshot to draw, shared by the browser tests: progress counts, a grid, and a live view.

Two workers and a departed one, with a simulated GPU on one (there is no GPU on the test
machine), so that every part of the drawing has something to show.
"""

from __future__ import annotations

from typing import Any

W0, W1, W2 = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"
COUNTS = {
    "done": 7,
    "failed": 2,
    "running": 1,
    "total": 12,
    "state": "done",
    "elapsed": 75.0,
    "label": "sweep",
}
GRID = {
    "params": ["lr", "depth"],
    "rows": [
        {"params": {"lr": "0.1", "depth": "3"}, "value": "0.93", "status": "ok"},
        {"params": {"lr": "0.3", "depth": "2"}, "value": "failed", "status": "error"},
        {"params": {"lr": "0.2", "depth": "4"}, "status": "pending"},
    ],
    "total": 9,
}


def snapshot() -> dict[str, Any]:
    # Worker "10" sorts after "2" (numeric order); W2 is gone but still has a task; W0's
    # GPU is a simulation (no GPU on the test machine), so the GPU column shows.
    workers = {
        W0: {"name": "2", "nthreads": 2, "memory_limit": 4_000_000_000, "resources": {},
             "gpu": {"name": "Sim", "memory_total": 80_000_000_000, "simulated": True}},
        W1: {"name": "10", "nthreads": 1, "memory_limit": 0, "resources": {}},
    }  # fmt: skip
    tasks = [
        {"prefix": "inc", "worker": W0, "start": 100.0, "stop": 103.0, "status": "ok"},
        {"prefix": "inc", "worker": W0, "start": 101.0, "stop": 102.0, "status": "ok"},
        {"prefix": "slow_inc", "worker": W0, "start": 101.5, "stop": 104.0, "status": "ok"},
        {"prefix": "train", "worker": W1, "start": 100.5, "stop": 109.0, "status": "ok"},
        {"prefix": "train", "worker": W1, "start": 109.0, "stop": 109.2, "status": "error"},
        {"prefix": "inc", "worker": W2, "start": 102.0, "stop": 102.5, "status": "ok"},
    ]
    sample = {"cpu": 150.0, "memory": 2.5e8, "memory_limit": 4e9, "net_read": 0.0, "net_write": 0.0}
    samples = {
        W0: [{**sample, "worker": W0, "time": 100.0 + i, "cpu": 20.0 * i, "gpu_util": 10.0 * i,
              "gpu_memory": 1.5e9, "gpu_memory_total": 8e10} for i in range(6)],
        W1: [{**sample, "worker": W1, "time": 104.0 + i} for i in range(3)],
    }  # fmt: skip
    return {"now": 110.0, "workers": workers, "tasks": tasks, "samples": samples}

