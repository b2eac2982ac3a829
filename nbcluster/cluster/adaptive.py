"""Adaptive scaling per worker kind: CPU backlog grows CPU workers, GPU backlog GPU workers.

Dask's stock `Adaptive` asks the scheduler for one number (`adaptive_target`) computed over
all tasks, and adds or retires interchangeable workers. With two kinds that is wrong both
ways: a queue of `{"GPU": 1}` items would add CPU workers that can never run them, and a CPU
backlog would keep idle GPU workers (and their device memory) alive.

So each kind gets its own `KindAdaptive`, Dask's machinery (wait counts, graceful
retirement) with three things replaced:

- the *plan*, *requested* and *observed* worker sets are those of its kind only;
- the *target* is computed from the scheduler's state (the supervisor hosts the scheduler,
  so this reads it directly, no RPC):
  * GPU: the GPU workers that the tasks asking for a GPU fill (waiting for a worker, queued,
    or running on a GPU worker): each task takes its share of a worker, the larger of its
    GPUs over the worker's GPUs and one thread over its threads, so four ``--gpus 0.25``
    tasks fill one single-GPU worker of four threads, and a ``--gpus 1`` task a whole one;
  * CPU: Dask's occupancy rule restricted to the tasks that do not ask for a GPU: expected
    run time of the running and ready tasks over `target_duration`, never more workers than
    ready tasks, divided by the threads per worker;
- scaling up or down touches its kind only (`NbSpecCluster.scale_kind`).

Work the scheduler cannot see counts too. A `%%distribute` run keeps only about two
batches per worker thread submitted (so that a stop drains in one item's time and new
batches are sized from what came back); the rest waits in the kernel. Seen from the
scheduler alone that is never a backlog, and the cluster never grew for a run. So each
run reports what it holds back (`nbcluster_backlog`: items and their expected seconds,
per kind) every half second while it runs, and the targets add it, as if those items
were queued tasks; a report not renewed within `BACKLOG_TTL` (a kernel that died) counts
no more. The same report names the workers running the run's direct batches (requests the
kernel sends a worker without the scheduler, `run/transport.py`): the scheduler sees no task
there, and those workers are not retired while they run them.

Example: 1 CPU worker, GPU workers adaptive in [0, 2], and 5 items submitted with
``--gpus 1``. They sit in the scheduler's "no-worker" set (nothing offers `GPU`), so the
GPU target is min(5, 2) = 2 and two GPU workers start; the CPU target is unchanged.
When the items are done the GPU target is 0, and after `wait_count` checks in a row the
idle GPU workers are retired.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from distributed.deploy.adaptive import Adaptive

from nbcluster._compat import prefix_duration
from nbcluster.cluster.kinds import worker_kind

if TYPE_CHECKING:  # speccluster.py imports this module
    from nbcluster.cluster.speccluster import NbSpecCluster

BACKLOG_TTL = 10.0  # seconds a run's report of its held-back work counts


class Backlogs:
    """The work each running `%%distribute` holds back in its kernel, by run (see above)."""

    def __init__(self, clock: Any = time.monotonic):
        self.clock = clock
        self._runs: dict[str, tuple[str, int, float, float]] = {}  # run -> (kind, items, seconds, expires)
        self._busy: dict[str, tuple[frozenset[str], float]] = {}  # run -> (workers on its direct batches, expires)

    def report(self, run: str, kind: str, items: int, seconds: float, busy: Collection[str] = ()) -> None:
        """Run `run` holds back `items` items of `kind` (about `seconds` of work), and runs
        direct batches on the workers `busy`; 0 items and no worker ends it.

        Parameters
        ----------
        run : str
            The run's id.
        kind : str
            ``cpu`` or ``gpu``: the workers the items need.
        items : int
            Items not yet submitted; 0 or less ends the report.
        seconds : float
            About how much work they are.
        busy : collection of str
            The addresses of the workers running the run's direct batches now.
        """
        expires = self.clock() + BACKLOG_TTL
        if items <= 0:
            self._runs.pop(run, None)
        else:
            self._runs[run] = (kind, int(items), float(seconds), expires)
        if busy:
            self._busy[run] = (frozenset(busy), expires)
        else:
            self._busy.pop(run, None)

    def total(self, kind: str) -> tuple[int, float]:
        """What every run still reporting holds back for workers of `kind`.

        Parameters
        ----------
        kind : str
            ``cpu`` or ``gpu``.

        Returns
        -------
        tuple of (int, float)
            Items, and seconds of work.
        """
        now = self.clock()
        for run in [r for r, (_, _, _, expires) in self._runs.items() if expires < now]:
            del self._runs[run]
        held = [(n, sec) for k, n, sec, _ in self._runs.values() if k == kind]
        return sum(n for n, _ in held), sum(sec for _, sec in held)

    def busy(self) -> set[str]:
        """The workers some run still reporting runs direct batches on.

        Returns
        -------
        set of str
            Their addresses.
        """
        now = self.clock()
        return {w for workers, expires in self._busy.values() if expires >= now for w in workers}


def backlogs(scheduler: Any) -> Backlogs:
    """The scheduler's `Backlogs` (made on first use).

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The cluster's scheduler.

    Returns
    -------
    Backlogs
        Kept among its extensions.
    """
    found: Backlogs | None = scheduler.extensions.get("nbcluster-backlogs")
    if found is None:
        found = scheduler.extensions["nbcluster-backlogs"] = Backlogs()
    return found


def needs_gpu(ts: Any) -> bool:
    """Whether a task is restricted to GPU workers.

    Parameters
    ----------
    ts : distributed.scheduler.TaskState
        The task.

    Returns
    -------
    bool
        True when it needs the GPU resource.
    """
    return worker_kind(ts.resource_restrictions) == "gpu"


def kind_target(
    scheduler: Any, kind: str, target_duration: float, gpu_worker: tuple[float, int] = (1, 1)
) -> int:
    """Desired number of workers of `kind` for the scheduler's current work.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The cluster's scheduler.
    kind : str
        ``cpu`` or ``gpu``.
    target_duration : float
        Seconds the ready work should take (Dask's ``adaptive.target-duration``).
    gpu_worker : tuple of (float, int)
        A GPU worker's GPUs and threads (``--gpus-per-worker``; ``--gpu-threads`` times it).

    Returns
    -------
    int
        Workers wanted, before the adaptive bounds.
    """
    workers = [ws for ws in scheduler.workers.values() if worker_kind(ws.resources) == kind]
    waiting = [ts for ts in scheduler.unrunnable] + list(scheduler.queued)
    held, held_time = backlogs(scheduler).total(kind)
    if kind == "gpu":
        gpus, gpu_threads = gpu_worker
        tasks = [ts for ts in waiting if needs_gpu(ts)]
        tasks += [ts for ws in workers for ts in ws.processing if needs_gpu(ts)]
        share = sum(max(float(ts.resource_restrictions["GPU"]) / gpus, 1 / max(gpu_threads, 1)) for ts in tasks)
        # Held-back items' needs are not known here: each counts as a whole worker.
        return math.ceil(share - 1e-9) + held

    ready = [ts for ts in waiting if not needs_gpu(ts)]
    # Dask's estimate of the expected run time of 100 ready tasks, scaled to all of them.
    sample = ready[:100]
    ready_time = sum(prefix_duration(scheduler, ts.prefix) for ts in sample)
    if len(ready) > len(sample):
        ready_time *= len(ready) / len(sample)
    running = sum(len(ws.processing) for ws in workers)
    occupancy = sum(ws.occupancy for ws in workers)
    cores: int = math.ceil((occupancy + ready_time + held_time) / target_duration)
    cores = min(cores, len(ready) + running + held)
    if (ready or held) and not workers:
        cores = max(cores, 1)
    threads: float = (sum(ws.nthreads for ws in workers) / len(workers)) if workers else 1
    return math.ceil(cores / max(threads, 1))


class KindAdaptive(Adaptive):
    """Dask's Adaptive for one worker kind of an `NbSpecCluster`."""

    def __init__(self, cluster: Any, kind: str, **kwargs: Any):
        self.kind = kind
        #: The cluster, typed as what it is (Adaptive types it as a Cluster).
        self.kinds: NbSpecCluster = cluster
        super().__init__(cluster, **kwargs)

    def _mine(self, entries: Any) -> set[Any]:
        # By spec entry, then its members: Dask's `plan` names a group's workers (name +
        # suffix), which the spec does not hold, so their kind is their entry's.
        return {w for e in entries if self.kinds.kind_of(e) == self.kind for w in self.kinds.members(e)}

    @property
    def plan(self) -> set[Any]:
        """The planned workers of this kind."""
        return self._mine(self.kinds.worker_spec)

    @property
    def requested(self) -> set[Any]:
        """The requested workers of this kind (started entries the spec still holds)."""
        return self._mine(e for e in self.kinds.workers if e in self.kinds.worker_spec)

    @property
    def observed(self) -> set[Any]:
        """The connected workers of this kind, by the resources they advertise.

        Not by the spec: a connected worker the spec no longer holds (one being retired) or
        never held (one that joined from elsewhere) has no kind there, and asking it for one
        raised a KeyError on every round, so adaptivity never acted.
        """
        scheduler: Any = self.kinds.scheduler  # started: the cluster's own, in this process
        return {ws.name for ws in scheduler.workers.values() if worker_kind(ws.resources) == self.kind}

    async def target(self) -> int:
        spec = self.kinds.nb_spec
        shape = (spec.gpus_per_worker, spec.gpus_per_worker * spec.gpu_threads)
        return kind_target(self.kinds.scheduler, self.kind, self.target_duration, shape)

    async def recommendations(self, target: int) -> dict[str, Any]:
        """Dask's recommendations, but scaling down by whole spec entries.

        Dask's own closes any `len(plan) - target` workers not yet arrived, then asks
        `workers_to_close`; a spec entry standing for a group of workers (a process or batch
        job hosting several) then went whole for one of its members, and the cluster
        flapped: 201 planned for a target of 200 closed a group of 50, and the next round
        started it again. Here `workers_to_close` names whole entries only, not-yet-arrived
        ones first; each must be named `wait_count` rounds in a row, as in Dask.

        Parameters
        ----------
        target : int
            Workers of this kind wanted, within the bounds.

        Returns
        -------
        dict
            ``{"status": "same"}``, ``{"status": "up", "n": n}`` or ``{"status": "down",
            "workers": [...]}``.
        """
        if target >= len(self.plan):
            return await super().recommendations(target)  # the same, or up: Dask's
        if len(self.plan) != len(self.requested):
            await self.cluster  # as Dask's Adaptive: plan and requested in step first
        to_close = set(await self.workers_to_close(target))
        firmly = set()
        for w in to_close:
            self.close_counts[w] += 1
            if self.close_counts[w] >= self.wait_count:
                firmly.add(w)
        for k in list(self.close_counts):  # forget the ones not named this round
            if k in firmly or k not in to_close:
                del self.close_counts[k]
        return {"status": "down", "workers": sorted(firmly)} if firmly else {"status": "same"}

    async def workers_to_close(self, target: int) -> list[Any]:
        """Which planned workers of this kind to retire: whole spec entries, idle ones,
        not yet arrived first, then holding the least data, then the largest groups.

        An entry that stands for a group of workers goes whole or not at all (closing one
        member closes its entry: `SpecCluster.scale_down`): it is named only when none of
        its members runs a task, and only if the kind keeps at least `target` planned
        workers without it. Workers the cluster did not start (no spec entry) are not its
        to retire.

        Parameters
        ----------
        target : int
            Workers of this kind to keep.

        Returns
        -------
        list
            Names of the workers to close.
        """
        scheduler = self.kinds.scheduler
        assert scheduler is not None  # Adaptive runs on a started cluster only
        joined = {ws.name: ws for ws in scheduler.workers.values()}
        busy = backlogs(scheduler).busy()
        entries = []
        for e in self.kinds.worker_spec:
            if self.kinds.kind_of(e) != self.kind:
                continue
            members = self.kinds.members(e)
            states = [joined[m] for m in members if m in joined]
            if not any(ws.processing or ws.address in busy for ws in states):
                entries.append((bool(states), sum(ws.nbytes for ws in states), -len(members), members))
        entries.sort(key=lambda c: c[:3])
        budget = len(self.plan) - target
        out: list[Any] = []
        for _, _, _, members in entries:
            if len(members) <= budget:
                out += members
                budget -= len(members)
        return out

    # Dask's AdaptiveCore annotates scale_up with scale_down's argument (workers) and the
    # reverse; Adaptive, the class it runs as, calls scale_up(n) with a count.
    async def scale_up(self, n: int) -> None:  # type: ignore[override]
        """Scale this kind up to `n` workers (Dask's adaptive calls this).

        Parameters
        ----------
        n : int
            Workers of this kind wanted.
        """
        await self.kinds.scale_kind(n, self.kind, adaptive=True)
