"""The basic view: a metrics snapshot from a scheduler's own ``identity``, where nbcluster's
plugin is not there (a scheduler someone else runs that refused it, or a remote backend's).

It holds the workers and their latest heartbeat samples (CPU, memory, GPU where reported)
and their distribution (``bands``), in the plugin's own sample shape (`plugin.resource_sample`);
no task records, no history; marked ``basic``. Served by the client feed
(`feed.client_feed`), by `ClusterHandle.metrics` for an external cluster, and by a
supervisor whose remote scheduler refused the plugin.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from nbcluster._wire import ResourceSample, Snapshot, SnapshotWorker
from nbcluster.metrics.plugin import SNAPSHOT_VERSION, resource_sample
from nbcluster.metrics.summary import band


def basic_snapshot(identity: Mapping[str, Any], since: int | None = None) -> Snapshot:
    """The basic snapshot of a scheduler's ``identity`` answer (the format in `nbcluster.metrics`).

    Each heartbeat is sent once: the cursor is the scheduler's clock, in milliseconds, just
    past the newest heartbeat it had received, so passing it back as `since` returns only
    the samples of heartbeats received since.

    Parameters
    ----------
    identity : Mapping
        ``Scheduler.identity()`` of a scheduler without nbcluster's plugin.
    since : int, optional
        The cursor of the previous snapshot; None for the first.

    Returns
    -------
    Snapshot
        Workers, CPU and memory samples, no task stream; marked ``basic``.
    """
    workers: dict[str, SnapshotWorker] = {}
    samples: list[ResourceSample] = []
    latest: list[ResourceSample] = []
    cursor = since or 0
    for address, reported in identity.get("workers", {}).items():
        metrics = reported.get("metrics") or {}
        workers[address] = {
            "name": str(reported.get("name")), "nthreads": reported.get("nthreads", 0),
            "memory_limit": reported.get("memory_limit") or 0, "resources": dict(reported.get("resources") or {}),
            "processing": metrics.get("task_counts", {}).get("executing", 0),
        }  # fmt: skip
        seen = int((reported.get("last_seen") or 0) * 1000)
        if metrics.get("time") is None:
            continue
        # `resource_sample` reads a WorkerState; an identity answer holds the same fields as a dict.
        ws = SimpleNamespace(memory_limit=reported.get("memory_limit"), metrics=metrics, extra=reported)
        sample = resource_sample(address, ws, metrics)
        latest.append(sample)
        if since is not None and seen < since:
            continue
        samples.append(sample)
        cursor = max(cursor, seen + 1)
    now = time.time()
    # With news, the distribution of every worker's latest sample, which the graphs draw
    # past a few workers (as the plugin's bands).
    return {
        "version": SNAPSHOT_VERSION, "cursor": cursor, "gap": False, "now": now, "basic": True,
        "workers": workers, "tasks": [], "resources": samples, "bands": [band(now, latest)] if samples else [],
        "groups": [],
    }  # fmt: skip
