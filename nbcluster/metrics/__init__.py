"""Cluster metrics at the source: a scheduler plugin with bounded ring buffers, and its feed.

Design
------
The scheduler already sees every fact the live graphs need: each finished task arrives as a
``processing -> memory|erred`` transition carrying the worker's ``startstops``, and each
worker heartbeat leaves its latest system-monitor sample in ``WorkerState.metrics``.
`MetricsPlugin` (``nbcluster/metrics/plugin.py``) copies those facts, as small tuples, into
two bounded ring buffers, and serves them through scheduler RPC handlers::

    nbcluster_metrics(since: int | None = None, detail: int | None = None) -> dict
                                                   # the snapshot below
    nbcluster_roster() -> dict                     # threads by worker, as Dask's ncores

It logs an event on ``nbcluster-roster`` (`nbcluster._wire.ROSTER_TOPIC`) whenever a worker
comes or goes, so that a kernel that asked `nbcluster_roster` keeps the answer until then,
and reads two topics as Dask's events pass by: ``nbcluster-progress``
(`nbcluster._wire.PROGRESS_TOPIC`), a run's item counts as its kernel reports them, and
``nbcluster-direct`` (`nbcluster._wire.DIRECT_TOPIC`), the batches workers ran directly.

Every record gets a sequence number from one counter shared by both rings; the snapshot's
``cursor`` is the next number to be handed out. A caller passes the cursor back as ``since``
and gets only records it has not seen. Memory stays flat however long a cluster runs: the
rings drop their oldest records, and a caller that fell too far behind is told so (``gap``).

Snapshot format (version 1) -- a contract, also read by the sidebar panel (TypeScript)
-------------------------------------------------------------------------------------
Declared as `nbcluster._wire.Snapshot` (and its parts), which mypy holds every producer and
reader to, and which ``graphs.d.ts`` repeats field by field (tests/test_wire.py compares
them). Plain dicts, lists, strings and numbers, so it travels through msgpack and JSON (a
Dask client receives the lists as tuples: Dask's msgpack decodes arrays that way).
Times are seconds since the epoch (float; task and sample times are the workers' clocks,
``now`` the scheduler's), memory in bytes, network in bytes per second, CPU in percent of one core
(a busy 2-thread worker can read 200)::

    {
      "version": 1,
      "cursor": 1234,            # pass back as `since` to get only newer records
      "gap": False,              # True: records after `since` were dropped (ring overflow,
                                 # or `since` came from another scheduler); redraw from scratch
      "now": 1718000000.25,      # scheduler clock when the snapshot was taken
      "basic": True,             # present only in the scheduler's own view, served where
                                 # nbcluster's plugin is not on the scheduler: workers and
                                 # their latest samples, no tasks, groups or history
                                 # (`nbcluster.metrics.basic`)
      "summary": {               # every worker connected now, in a bounded shape
        "workers": 1000, "threads": 2000, "processing": 640,
        "memory": 123456789000, "memory_limit": 4000000000000,
        "hosts": [{"host": "10.0.0.1", "workers": 50, "threads": 100, "processing": 32,
                   "memory": ..., "memory_limit": ...}, ...],   # most workers first, <= 20
        "more_hosts": 30,                 # hosts not listed
      },
      "workers": {               # every worker connected now (always complete, not a delta),
                                 # or with `detail=N` only the N busiest (by tasks assigned)
        "tcp://127.0.0.1:40000": {
          "name": "0",           # str(worker name)
          "nthreads": 1,
          "memory_limit": 2000000000,     # 0 = no limit
          "resources": {"GPU": 1.0},      # Dask worker resources, {} when none
          "processing": 3,                # tasks assigned to it right now
          "gpu": {"name": "NVIDIA H200", "memory_total": 150000000000, "simulated": False},
                                          # key ABSENT on workers without a GPU that NVML or
                                          # the supervisor knows of; "simulated" only where
                                          # the supervisor assigned the device (True: made up
                                          # by NBCLUSTER_SIMULATE_GPUS, and every display says so)
        },
      },
      "tasks": [                 # finished tasks with seq >= since, oldest first
        {"key": "inc-3f1c...", "prefix": "inc", "group": "inc",
         "worker": "tcp://127.0.0.1:40000",
         "start": 1718000000.01, "stop": 1718000000.02, "status": "ok"},   # or "error"
      ],
      "resources": [             # worker samples with seq >= since, oldest first (with
                                 # `detail=N`, only those of the workers listed above)
        {"worker": "tcp://127.0.0.1:40000", "time": 1718000000.2,
         "cpu": 98.5, "memory": 123456789, "memory_limit": 2000000000,
         "net_read": 1024.0, "net_write": 2048.0,
         # only where the worker reports an NVML GPU (never zero-filled):
         "gpu_util": 87.0, "gpu_memory": 1073741824, "gpu_memory_total": 150000000000},
      ],
      "bands": [                 # per sampling round with news, seq >= since: every worker's
                                 # latest sample as (min, median, max) (metrics/summary.py)
        {"time": 1718000000.2, "workers": 1000, "cpu": (0.0, 45.5, 100.0),
         "memory": (...), "memory_limit": 4000000000, "gpu_util": (...)},  # gpu_util: if any
      ],
      "runs": [                  # the latest reported %%distribute runs (<= 20), latest last:
                                 # item counts, which a batch task cannot tell the scheduler
        {"run": "3f2a...", "label": None, "done": 12, "failed": 0, "total": 20,
         "state": "running", "elapsed": 2.5, "time": 1718000000.1},
      ],
      "groups": [                # task groups the scheduler still knows, newest last (<= 20)
        {"group": "inc", "prefix": "inc", "total": 100, "done": 40,
         "running": 2, "failed": 1, "waiting": 57},
      ],
    }

``key`` is ``str()`` of the Dask key (``%%distribute`` batches are
``distribute-<run id>-<n>``, persisted items ``persist-<run id>-<n>``, which is how a run's
widget picks out its own tasks).
``since=None`` (or omitted) returns everything the rings still hold. Fields may be added in
later versions; readers ignore fields they do not know. ``start``/``stop`` of a task span its
``compute`` action; a task that failed before computing has ``start == stop``.

Samples arrive with worker heartbeats, about twice a second per worker on small clusters.
The live widget and the sidebar ask with ``detail=16``: what they fetch then does not grow
with the number of workers (``summary`` and ``bands`` stand for the rest); the graphs
switch to lanes by host (or the busiest and "others") and to distributions on their own.

Client side
-----------
`client_feed(client)` returns the callable ``since -> snapshot`` the live widget polls
(`ClusterHandle.metrics` is the same thing for nbcluster's own clusters), and
`MetricsWindow` folds successive snapshots into a bounded local view (tasks, samples per
worker) for drawing -- the Python twin of ``applySnapshot`` in
``nbcluster/widgets/static/graphs.js``, with the same bounds (Dask config
``nbcluster.widget.max-tasks`` / ``max-samples``). The plugin's ring sizes are
``nbcluster.metrics.*``.
"""

from __future__ import annotations

from nbcluster.metrics.feed import Feed, MetricsWindow, client_feed, ensure_plugin
from nbcluster.metrics.plugin import MetricsPlugin, install

__all__ = [
    "Feed",
    "MetricsPlugin",
    "MetricsWindow",
    "client_feed",
    "ensure_plugin",
    "install",
]
