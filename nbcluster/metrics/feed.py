"""The client side of the metrics: fetching snapshots and folding them into a local window.

A *feed* is any callable ``since -> snapshot`` (the format in `nbcluster.metrics`). The live
widget takes a feed rather than a client so that it does not care whether the snapshot
comes from `ClusterHandle.metrics`, a plain Dask `Client`, or a test.

`MetricsWindow` keeps the latest worker table and the newest tasks and samples, each in a
bounded deque, so a widget left open for hours holds a fixed amount of memory. It folds
snapshots as ``applySnapshot`` in ``graphs.js`` does, with the same bounds (Dask config
``nbcluster.widget.max-tasks`` / ``max-samples``, which the front ends receive from Python),
so the frozen picture holds what the live view held; `to_view` returns the shape of the
JavaScript view, which is what the static (saved-notebook) renderer draws.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster import config
from nbcluster._wire import Band, ResourceSample, Snapshot, SnapshotWorker, Summary, TaskRecord
from nbcluster.metrics.basic import basic_snapshot
from nbcluster.metrics.plugin import MetricsPlugin

if TYPE_CHECKING:
    from distributed import Client

Feed = Callable[[int | None], Snapshot]


# Clients whose scheduler has no `nbcluster_metrics` handler. Asked once per client, not once
# per feed: each asking logs a traceback on a scheduler that is someone else's.
_without_plugin: weakref.WeakSet[Client] = weakref.WeakSet()


def client_feed(client: Client, detail: int | None = None) -> Feed:
    """A feed that calls the scheduler's ``nbcluster_metrics`` handler through `client`.

    `detail` caps the workers the snapshots describe one by one (see the plugin).

    A scheduler without nbcluster's plugin (one someone else runs, that refused it) has no
    such handler: there the feed serves the basic view from the scheduler's own
    ``identity`` (workers, CPU and memory; no task stream), marked ``basic``, as
    `ClusterHandle.metrics` does. Safe to call from any thread except the client's event
    loop thread.

    Parameters
    ----------
    client : distributed.Client
        A connected client of the cluster.
    detail : int, optional
        The most workers a snapshot describes one by one; None is the plugin's default.

    Returns
    -------
    Feed
        ``feed(since=None) -> Snapshot``: what is new since the cursor `since`.
    """

    def fetch(since: int | None = None) -> Snapshot:
        scheduler = client.scheduler
        assert scheduler is not None  # set on a connected client, which a feed is made from
        if client not in _without_plugin:
            snap: Snapshot | None = client.sync(scheduler.nbcluster_metrics, since=since, detail=detail)
            if snap is not None:
                return snap
            # Dask answers None to an operation the scheduler has no handler for.
            _without_plugin.add(client)
            since = None
        return basic_snapshot(client.sync(scheduler.identity), since)

    return fetch


def ensure_plugin(client: Client) -> None:
    """Install `MetricsPlugin` on `client`'s scheduler unless it is already there.

    For schedulers nbcluster did not start (e.g. ``connect`` to an address); the
    scheduler must be able to import nbcluster.

    Parameters
    ----------
    client : distributed.Client
        A connected client of that scheduler.
    """
    client.register_plugin(MetricsPlugin())  # idempotent: the plugin class says so
    _without_plugin.discard(client)


class MetricsWindow:
    """A bounded, incrementally updated view of a cluster's recent activity."""

    def __init__(self, *, max_tasks: int | None = None, max_samples: int | None = None) -> None:
        limits = config.view_limits()
        max_tasks = limits["maxTasks"] if max_tasks is None else max_tasks
        max_samples = limits["maxSamples"] if max_samples is None else max_samples
        self.cursor: int | None = None
        self.now = 0.0
        #: True while the feed serves the scheduler's own view (no plugin: no task stream).
        self.basic = False
        self.workers: dict[str, SnapshotWorker] = {}
        self.tasks: deque[TaskRecord] = deque(maxlen=max_tasks)
        self.samples: dict[str, deque[ResourceSample]] = {}
        #: The plugin's distributions across all workers (``bands``), for large clusters.
        self.bands: deque[Band] = deque(maxlen=max_samples)
        #: The plugin's totals over all workers (``summary``), or None.
        self.summary: Summary | None = None
        self.max_samples = max_samples

    def apply(self, snap: Snapshot) -> None:
        """Fold one snapshot (as returned for ``since=self.cursor``) into the window.

        Parameters
        ----------
        snap : Snapshot
            A feed's answer, or part of one (absent keys leave the window as it is).
        """
        # Keys read with .get: a test or a caller may fold in part of a snapshot, as
        # graphs.js's applySnapshot takes a Partial<Snapshot>.
        self.cursor = snap.get("cursor", self.cursor)
        self.now = max(self.now, snap.get("now") or 0.0)
        self.basic = bool(snap.get("basic"))
        if "summary" in snap:
            self.summary = snap["summary"]
        if "workers" in snap:
            self.workers = snap["workers"]
            # A departed worker's charts go with it, as in graphs.js.
            for addr in [a for a in self.samples if a not in self.workers]:
                del self.samples[addr]
        self.tasks.extend(snap.get("tasks", ()))
        self.bands.extend(snap.get("bands", ()))
        for r in snap.get("resources", ()):
            series = self.samples.get(r["worker"])
            if series is None:
                series = self.samples[r["worker"]] = deque(maxlen=self.max_samples)
            series.append(r)

    def to_view(self) -> dict[str, Any]:
        """The window as plain data, shaped like the ``view`` of ``graphs.js``.

        Returns
        -------
        dict
            ``cursor``, ``now``, ``basic``, ``workers``, ``summary``, ``tasks``, ``samples``
            (by worker) and ``bands``, as lists and dicts (JSON-ready).
        """
        return {
            "cursor": self.cursor,
            "now": self.now,
            "basic": self.basic,
            "workers": self.workers,
            "summary": self.summary,
            "tasks": list(self.tasks),
            "samples": {w: list(s) for w, s in self.samples.items()},
            "bands": list(self.bands),
        }
