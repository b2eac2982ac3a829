"""`MetricsPlugin`: the scheduler side of nbcluster's live graphs.

What it records, and where from
- Task records: every ``processing -> memory`` or ``processing -> erred`` transition. The
  worker's report rides along as transition keyword arguments: ``worker`` and
  ``startstops`` (``[{"action": "compute", "start": ..., "stop": ...}, ...]``); the record
  spans the ``compute`` action. Prefix and group come from the scheduler's `TaskState`
  (attribute lookups, no key parsing on the hot path).
- Resource samples: every worker heartbeat leaves the worker's latest system-monitor sample
  in ``WorkerState.metrics`` (there is no plugin hook for heartbeats). A periodic callback
  on the scheduler's event loop copies each worker's sample once per new ``metrics["time"]``.
  GPU fields come from distributed's NVML diagnostics (``gpu_utilization``,
  ``gpu_memory_used``, ``gpu-memory-total`` in the monitor sample, or the ``gpu`` metric and
  the ``gpu`` startup information) and are left out, never zero-filled, when absent.

Records are stored as tuples in two `SeqRing`s sharing one sequence counter; dicts are built
only when a snapshot is asked for, so the per-task cost is one tuple and one deque append.

What costs what at 1,000 workers (issue 22: the plugin's share of the scheduler's CPU must
not grow with idle workers)
- A sampling round looks at each worker once, by identity: a heartbeat replaces
  ``WorkerState.metrics`` with a new dict, so an unchanged worker costs one dict lookup and
  one ``is``. Only the workers with a new heartbeat are sampled (Dask keeps heartbeats to
  about 200 a second however many workers there are), and the band of every worker's latest
  sample is kept by worker (`summary.LatestBand`): a new sample is a few dict assignments,
  a band three sorts in C, not a sample dict read per worker.
- An answer's ``summary`` reads what changes with every task (tasks processing) and every
  heartbeat (memory) in two passes over the workers made of C calls (``map`` over
  ``attrgetter``), no Python step per worker, and picks its busiest workers with a heap;
  what changes only when workers join or leave (hosts, their ranking, threads, limits,
  names) is kept in `_Roster`, rebuilt only then.
The snapshot format is documented in `nbcluster.metrics` and declared in `nbcluster._wire`.

Installing it: the plugin's `start` registers the ``nbcluster_metrics`` RPC handler, and
Dask calls `start` only for plugins present when the scheduler starts
(``Scheduler(plugins=[MetricsPlugin()])``) or registered through
``Scheduler.register_scheduler_plugin`` / ``Client.register_plugin``. A bare
``scheduler.add_plugin`` on a running scheduler records nothing and serves nothing; use
`install` instead.
"""

from __future__ import annotations

import heapq
import itertools
import operator
import time
from typing import TYPE_CHECKING, Any, cast

from dask.utils import key_split
from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from nbcluster import config
from nbcluster._wire import (
    DIRECT_TOPIC,
    PROGRESS_TOPIC,
    ROSTER_TOPIC,
    Band,
    GpuDevice,
    GroupProgress,
    HostTotals,
    ResourceSample,
    RosterChanged,
    RunProgress,
    Snapshot,
    SnapshotGpu,
    SnapshotWorker,
    Summary,
)
from nbcluster.metrics import summary as summarize
from nbcluster.metrics._ring import SeqRing

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import WorkerState

SNAPSHOT_VERSION = 1
MAX_GROUPS = 20
#: Runs whose item counts are kept (from `PROGRESS_TOPIC`), the latest reported last.
MAX_RUNS = 20
#: Distributions kept (one per sampling round with news: ~8 minutes at 500 ms).
BAND_CAPACITY = 1000
#: The scheduler handlers the plugin serves while it runs.
_HANDLERS = ("nbcluster_metrics", "nbcluster_roster")

# (prefix, group, worker, start, stop, ok, key); the key is the scheduler's own object (a
# reference, not a copy), turned into a string only when a snapshot is served.
TaskRecord = tuple[str, str, str, float, float, bool, Any]


class MetricsPlugin(SchedulerPlugin):
    """Keep bounded task-stream and resource histories; serve them as ``nbcluster_metrics``.

    `task_capacity` and `sample_capacity` bound memory (about 150 bytes per record);
    `sample_interval` is how often (seconds) worker heartbeats are checked for new samples.
    Each defaults to its Dask config key (``nbcluster.metrics.task-capacity``,
    ``sample-capacity``, ``sample-interval``), read where the plugin is made.
    """

    name = "nbcluster-metrics"
    idempotent = True

    def __init__(
        self,
        *,
        task_capacity: int | None = None,
        sample_capacity: int | None = None,
        sample_interval: float | None = None,
    ) -> None:
        self.tasks: SeqRing[TaskRecord] = SeqRing(_setting(task_capacity, "metrics.task-capacity"))
        self.samples: SeqRing[ResourceSample] = SeqRing(_setting(sample_capacity, "metrics.sample-capacity"))
        # One record per sampling round: every worker's latest sample, as min/median/max.
        self.bands: SeqRing[Band] = SeqRing(BAND_CAPACITY)
        self.sample_interval = (
            config.seconds("metrics.sample-interval") if sample_interval is None else sample_interval
        )
        self._next = 0  # the sequence number the next record gets; also the cursor
        self._last_sample_time: dict[str, float] = {}
        # Each worker's metrics dict as the last round saw it: a heartbeat replaces the dict.
        self._seen: dict[str, dict[str, Any]] = {}
        self._band = summarize.LatestBand()
        self._roster: _Roster | None = None
        self.runs: dict[str, RunProgress] = {}
        self._scheduler: Scheduler | None = None
        self._callback: PeriodicCallback | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, scheduler: Scheduler) -> None:
        """Dask's plugin hook: serve the handlers and start sampling.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler the plugin was added to.
        """
        self._scheduler = scheduler
        for name in _HANDLERS:
            scheduler.handlers[name] = getattr(self, name)
        if self._callback is None:
            self._callback = PeriodicCallback(self.sample, self.sample_interval * 1000)
            self._callback.start()

    async def close(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        handlers = self._scheduler.handlers if self._scheduler is not None else {}
        for name in _HANDLERS:
            if handlers.get(name) == getattr(self, name):  # not another plugin's since
                del handlers[name]

    def remove_worker(self, scheduler: Scheduler, worker: str, **kwargs: Any) -> None:
        """Dask's plugin hook (for `add_worker` too): the workers' roster is out of date.

        What sampling knew of a worker at that address is forgotten. Kernels that keep the
        workers they were told of (`nbcluster_roster`) hear of it on `ROSTER_TOPIC`.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        worker : str
            The address of the worker that came or left.
        **kwargs
            Dask's details (``stimulus_id``, ``expected``), unused.
        """
        self._roster = None
        self._seen.pop(worker, None)
        self._last_sample_time.pop(worker, None)
        self._band.drop(worker)
        changed: RosterChanged = {"workers": len(scheduler.workers)}
        scheduler.log_event(ROSTER_TOPIC, changed)

    add_worker = remove_worker

    def nbcluster_roster(self) -> dict[str, int]:
        """The workers and their threads, as Dask's ``ncores`` answers; a kernel that asks
        this (not ``ncores``) knows that this scheduler says on `ROSTER_TOPIC` when a worker
        comes or goes, and keeps the answer until then.

        Returns
        -------
        dict of str to int
            Threads by worker address.
        """
        scheduler = self._scheduler
        assert scheduler is not None, "MetricsPlugin.start() has not run"
        return {address: ws.nthreads for address, ws in scheduler.workers.items()}

    # -- recording ------------------------------------------------------------------------

    def _stamp(self) -> int:
        seq = self._next
        self._next = seq + 1
        return seq

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Dask's plugin hook: record a task that finished (or erred) on a worker.

        Parameters
        ----------
        key : Key
            The task's key.
        start, finish : str
            The states it moved between; only ``processing`` to ``memory`` or ``erred`` count.
        *args
            Dask's other positional arguments (unused).
        **kwargs
            Dask's details of the transition: ``worker`` and ``startstops`` are read.
        """
        if start != "processing" or (finish != "memory" and finish != "erred"):
            return
        worker = kwargs.get("worker")
        if not worker:
            # Erred without running anywhere (e.g. KilledWorker): nothing to draw in a lane.
            return
        compute: tuple[float, float] | None = None
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") == "compute":
                compute = ss["start"], ss["stop"]
        begin, end = compute if compute is not None else (time.time(),) * 2
        ts = self._scheduler.tasks.get(key) if self._scheduler is not None else None
        if ts is not None:
            prefix, group = ts.prefix.name, ts.group.name
        else:
            prefix = group = key_split(key)
        self.tasks.append(self._stamp(), (prefix, group, worker, begin, end, finish == "memory", key))

    def log_event(self, topic: str, msg: Any) -> None:
        """Dask's plugin hook: keep a run's counts, or record a batch a worker ran directly.

        On `PROGRESS_TOPIC` a kernel reports a run's item counts (`RunCounts`): a batch
        task holds many items, so only the kernel knows how many are done. The latest
        `MAX_RUNS` runs are served in snapshots as ``runs``.

        On `DIRECT_TOPIC` a worker reports a batch it ran for a kernel directly
        (`nbcluster.run.transport`), which is no task of the scheduler's, so no transition
        reports it: it is drawn like a task of the run, prefix and group from its key.

        Parameters
        ----------
        topic : str
            The event's topic; others are ignored.
        msg : Any
            The event: `RunCounts`, or ``key``, ``start``, ``stop`` and the ``worker`` the
            scheduler adds.
        """
        if not isinstance(msg, dict):
            return
        if topic == PROGRESS_TOPIC:
            # Only the declared keys: the counts cross a process boundary.
            counts = {k: msg[k] for k in RunProgress.__optional_keys__ if k in msg}
            record = cast(RunProgress, {**counts, "run": str(msg.get("run")), "time": time.time()})
            self.runs.pop(record["run"], None)
            self.runs[record["run"]] = record
            while len(self.runs) > MAX_RUNS:
                self.runs.pop(next(iter(self.runs)))
        elif topic == DIRECT_TOPIC and msg.get("worker"):
            key = str(msg.get("key"))
            prefix = key_split(key)
            start, stop = float(msg.get("start") or 0.0), float(msg.get("stop") or 0.0)
            self.tasks.append(self._stamp(), (prefix, prefix, str(msg["worker"]), start, stop, True, key))

    def sample(self) -> None:
        """Copy each worker's newest heartbeat sample, if it is new (runs periodically).

        A worker with no heartbeat since the last round costs a dict lookup and an identity
        test; the band of every worker's latest sample is updated with the new ones only.
        """
        if self._scheduler is None:
            return
        workers = self._scheduler.workers
        seen, last, band = self._seen, self._last_sample_time, self._band
        news = False
        # Dask's workers are a SortedDict, whose own views iterate in Python (10x slower):
        # find what changed through the plain dict's view, then take it in the sorted order.
        changed = [(addr, ws) for addr, ws in dict.items(workers) if seen.get(addr) is not ws.metrics]
        if len(changed) > 1:
            changed.sort(key=_FIRST)
        for addr, ws in changed:
            m = seen[addr] = ws.metrics
            t = m.get("time")
            if t is None:
                band.drop(addr)
                continue
            if last.get(addr) == t:
                continue
            last[addr] = t
            sample = resource_sample(addr, ws, m)
            self.samples.append(self._stamp(), sample)
            band.put(addr, sample)
            news = True
        if news:
            self.bands.append(self._stamp(), band.band(time.time()))

    # -- serving --------------------------------------------------------------------------

    def nbcluster_metrics(self, since: int | None = None, detail: int | None = None) -> Snapshot:
        """The snapshot of records with sequence number ``>= since`` (see `nbcluster.metrics`).

        Parameters
        ----------
        since : int, optional
            The cursor of the reader's previous snapshot; None for everything held.
        detail : int, optional
            Describe at most this many workers one by one (the busiest), with only their
            resource samples; ``summary`` and ``bands`` cover them all. None: every one.

        Returns
        -------
        Snapshot
            `nbcluster._wire.Snapshot`; ``gap`` is true when the reader missed records.
        """
        scheduler = self._scheduler
        assert scheduler is not None, "MetricsPlugin.start() has not run"
        cursor = self._next
        gap = False
        if since is not None and since > cursor:
            # A cursor from the future was issued by another scheduler (or a restarted
            # one): start the reader over.
            since, gap = None, True
        gap = gap or self.tasks.lost_since(since) or self.samples.lost_since(since)
        detailed = scheduler.workers
        resources = self.samples.since(since)
        roster = self._current_roster()
        # Tasks processing on each worker, in the roster's order: one pass of C calls.
        processing = list(map(len, map(_PROCESSING, roster.workers)))
        if detail is not None and len(detailed) > detail:
            # The few busiest (most tasks, then by name), not all of them sorted.
            detailed = {
                roster.workers[i].address: roster.workers[i] for i in roster.busiest(processing, detail)
            }
            resources = [r for r in resources if r["worker"] in detailed]
        devices = _devices(scheduler)
        return {
            "version": SNAPSHOT_VERSION,
            "cursor": cursor,
            "gap": gap,
            "now": time.time(),
            "summary": roster.summary(processing),
            "workers": {addr: _worker_info(ws, devices) for addr, ws in detailed.items()},
            "tasks": [
                {
                    "key": str(k),
                    "prefix": p,
                    "group": g,
                    "worker": w,
                    "start": b,
                    "stop": e,
                    "status": "ok" if ok else "error",
                }
                for p, g, w, b, e, ok, k in self.tasks.since(since)
            ],
            "resources": resources,
            "bands": self.bands.since(since),
            "runs": list(self.runs.values()),
            "groups": _groups(scheduler),
        }

    def _current_roster(self) -> _Roster:
        scheduler = self._scheduler
        assert scheduler is not None
        key = _Roster.key_of(scheduler)
        if self._roster is None or self._roster.key != key:
            self._roster = _Roster(scheduler, key)
        return self._roster


async def install(scheduler: Scheduler, **kwargs: Any) -> MetricsPlugin:
    """Add a `MetricsPlugin` to a running scheduler (idempotent) and return the one in use.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        A running scheduler.
    **kwargs
        `MetricsPlugin`'s arguments (ring sizes, the sample interval), for a new plugin.

    Returns
    -------
    MetricsPlugin
        The plugin the scheduler has (an earlier one, if there was).
    """
    await scheduler.register_scheduler_plugin(
        MetricsPlugin(**kwargs), name=MetricsPlugin.name, idempotent=True
    )
    plugin = scheduler.plugins[MetricsPlugin.name]
    assert isinstance(plugin, MetricsPlugin)
    return plugin


def _setting(value: int | None, key: str) -> int:
    return int(config.get(key)) if value is None else value


def _gpu_static(ws: Any) -> SnapshotGpu | None:
    gpu = ws.extra.get("gpu")
    if isinstance(gpu, dict) and gpu.get("memory-total") is not None:
        return {"name": gpu.get("name"), "memory_total": gpu["memory-total"]}
    total = ws.metrics.get("gpu-memory-total")
    if total is not None and total >= 0:
        return {"name": None, "memory_total": total}
    return None


def _devices(scheduler: Any) -> dict[str, GpuDevice]:
    """GPU devices by worker name, as nbcluster's supervisor assigned them (if it did).

    NVML tells a worker about its real device; only the supervisor knows that a device is
    simulated, and every display must say so.
    """
    control = scheduler.plugins.get("nbcluster-control")
    devices = getattr(getattr(control, "cluster", None), "devices", None) or {}
    return {name: d.to_dict() for name, d in devices.items()}


def _worker_info(ws: WorkerState, devices: dict[str, GpuDevice] | None = None) -> SnapshotWorker:
    info: SnapshotWorker = {
        "name": str(ws.name),
        "nthreads": ws.nthreads,
        "memory_limit": ws.memory_limit or 0,
        "resources": dict(ws.resources),
        "processing": len(ws.processing),
    }
    gpu = _gpu_static(ws)
    device = (devices or {}).get(str(ws.name))
    if device is not None:
        gpu = {"name": device["name"], "memory_total": device["memory_total"]} if gpu is None else gpu
        gpu["simulated"] = bool(device["simulated"])
    if gpu is not None:
        info["gpu"] = gpu
    return info


def resource_sample(addr: str, ws: Any, m: dict[str, Any]) -> ResourceSample:
    """One worker's heartbeat sample in the snapshot's shape, GPU fields only where the
    worker reports them.

    Parameters
    ----------
    addr : str
        The worker's address.
    ws : WorkerState or alike
        The worker's ``memory_limit``, ``metrics`` and ``extra``: a `WorkerState`, or the
        same fields of a scheduler's ``identity`` answer (`basic.basic_snapshot`).
    m : dict
        Its heartbeat ``metrics``.

    Returns
    -------
    ResourceSample
        `nbcluster._wire.ResourceSample`.
    """
    net = m.get("host_net_io") or {}
    out: ResourceSample = {
        "worker": addr,
        "time": m["time"],
        "cpu": m.get("cpu", 0.0),
        "memory": m.get("memory", 0),
        "memory_limit": ws.memory_limit or 0,
        "net_read": net.get("read_bps", 0.0),
        "net_write": net.get("write_bps", 0.0),
    }
    # Two routes carry NVML readings: the system monitor's flat keys, and the `gpu` metric
    # distributed adds once NVML initialises. Either may be missing; None means the
    # driver does not support the reading, which is "absent", not zero.
    gpu = m.get("gpu")
    gpu_metric = gpu if isinstance(gpu, dict) else {}
    util = m.get("gpu_utilization", gpu_metric.get("utilization"))
    used = m.get("gpu_memory_used", gpu_metric.get("memory-used"))
    if util is not None:
        out["gpu_util"] = util
    if used is not None:
        out["gpu_memory"] = used
    if util is not None or used is not None:
        static = _gpu_static(ws)
        if static is not None:
            out["gpu_memory_total"] = static["memory_total"]
    return out


_FIRST = operator.itemgetter(0)
_PROCESSING = operator.attrgetter("processing")
_METRICS = operator.attrgetter("metrics")


def _memory(workers: list[WorkerState]) -> int:
    """The memory the workers' last heartbeats reported, added up in C calls
    (``metrics.get("memory", 0) or 0`` each: `filter` drops the None and 0 alike)."""
    return sum(filter(None, map(dict.get, map(_METRICS, workers), itertools.repeat("memory"))))


class _Roster:
    """What an answer needs of the workers that changes only when one joins or leaves: the
    workers grouped by host (the hosts listed in the summary first, ranked as
    `summary.hosts` ranks them: most workers first), their names and name order, and each
    host's workers, threads and memory limits.

    An answer then reads only what changes with each task or heartbeat (tasks processing,
    memory), in two passes of C calls over the workers (``map`` over ``attrgetter``; a
    host's share is a slice). Dask counts every worker that joins (``_workers_added_total``); with
    the number of workers that tells when the roster is out of date (and the plugin's
    `add_worker` / `remove_worker` hooks drop it too).
    """

    def __init__(self, scheduler: Scheduler, key: tuple[int, int]):
        self.key = key
        by_host: dict[str, list[tuple[int, WorkerState]]] = {}
        for i, ws in enumerate(scheduler.workers.values()):
            by_host.setdefault(ws.host, []).append((i, ws))
        # workers, threads, processing, memory, memory limit: the last three per answer.
        static = {
            host: [
                len(wss),
                sum(ws.nthreads for _, ws in wss),
                0,
                0,
                sum(ws.memory_limit or 0 for _, ws in wss),
            ]
            for host, wss in by_host.items()
        }
        self.threads = sum(t[1] for t in static.values())
        self.memory_limit = sum(t[4] for t in static.values())
        ranked, self.more_hosts = summarize.hosts(static)
        listed = [row["host"] for row in ranked]
        ordered = [iw for host in listed for iw in by_host[host]]
        self.spans: list[tuple[HostTotals, int, int]] = []
        for row in ranked:
            start = self.spans[-1][2] if self.spans else 0
            self.spans.append((row, start, start + row["workers"]))
        self.rest = len(ordered)  # the workers of hosts not listed start here
        named = set(listed)
        ordered += [iw for host, wss in by_host.items() if host not in named for iw in wss]
        self.workers = [ws for _, ws in ordered]
        # By name, then by the scheduler's order (the order `heapq.nsmallest` kept on a tie).
        names = [(str(ws.name), i) for i, ws in ordered]
        self.by_name = sorted(range(len(names)), key=names.__getitem__)

    @staticmethod
    def key_of(scheduler: Scheduler) -> tuple[int, int]:
        """What changes whenever a worker joins or leaves."""
        return len(scheduler.workers), getattr(scheduler, "_workers_added_total", -1)

    def busiest(self, processing: list[int], n: int) -> list[int]:
        """The `n` workers with the most tasks processing, busiest first, ties in name order
        (indices; `heapq.nsmallest` keeps the order it was given among equals)."""
        return heapq.nsmallest(n, self.by_name, key=lambda i: -processing[i])

    def summary(self, processing: list[int]) -> Summary:
        """The snapshot's ``summary``; `processing` counts each worker's tasks, in roster order."""
        hosts: list[HostTotals] = [
            {**row, "processing": sum(processing[a:b]), "memory": _memory(self.workers[a:b])}
            for row, a, b in self.spans
        ]
        return {
            "workers": len(self.workers),
            "threads": self.threads,
            "processing": sum(processing),
            "memory": sum(h["memory"] for h in hosts) + _memory(self.workers[self.rest :]),
            "memory_limit": self.memory_limit,
            "hosts": hosts,
            "more_hosts": self.more_hosts,
        }


def _groups(scheduler: Scheduler) -> list[GroupProgress]:
    out: list[GroupProgress] = []
    for tg in itertools.islice(reversed(scheduler.task_groups.values()), MAX_GROUPS):
        st = tg.states
        out.append(
            {
                "group": tg.name,
                "prefix": tg.prefix.name,
                "total": sum(st.values()),
                # Released/forgotten tasks of a live group have, in practice, finished:
                # the client gathered them and let go.
                "done": st["memory"] + st["released"] + st["forgotten"],
                "running": st["processing"],
                "failed": st["erred"],
                "waiting": st["waiting"] + st["queued"] + st["no-worker"],
            }
        )
    out.reverse()
    return out
