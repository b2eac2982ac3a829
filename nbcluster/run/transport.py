"""Where a run's batches go and how they travel: the link to the cluster, and one way out.

What is where, in this module: the link (`Link`, with what items need, `Needs`, and where
they fit, `placement`; the workers it knows, `_Roster`); `Transport`, with its one queue of
finished batches, and its Dask tasks, each bound loosely to its workers; the direct path (`Call`,
`_Direct`); results pushed ahead of a gather (`_inbox`); tasks that load anywhere (`task`,
`halt_reason`).

The link. `Link(needs, client=..., cluster=..., find=...)` is made before anything else of
a run, and opened (`open()`) only when items leave the kernel: a `--local` run never needs
a cluster.
Opening finds the client (the one given, else `find(cluster)`'s: the named cluster's, or
the current one; the API layer passes its lookup in, as the engine never imports it), asks the
scheduler for its workers once, and works out the placement of the run's items from their
`Needs`: the Dask resource restrictions, the workers that can take them and how many items
can run at once there (the batch sizing's `threads`).

Where every worker fits (no `Needs`), an answer of the scheduler's from the last `FRESH_S`
seconds stands in for asking: cells run back to back (a loop of `distribute` calls, a
pipeline) then send their first items without waiting for a round trip. Being a second
late about the workers costs little: each run's watch thread asks afresh twice a second
and resizes the run (`usable_threads`). A scheduler with nbcluster's plugin (every cluster
nbcluster starts) says on `ROSTER_TOPIC` when a worker comes or goes; there the answer
stands until such news (`TOLD_S` at most), so cells seconds apart, as a notebook's are, do
not wait for the round trip either (asking each cell cost a small cell its lead over
ipyparallel: bench/RESULTS.md, "engine removals"). `--everywhere`, which runs once on each
worker, asks afresh (`eligible_now`).

A link whose cluster went away is `close()`d by the engine; a retry `open()`s it again, to
whatever cluster is current by then.

The way out. The engine (`engine.py`) decides what to send (its `policy.Policy`); a
`Transport` sends it and hands back what finished. The engine talks to nothing else of the
way out. Its verbs:

- `open` begins a start (the first run, each retry) and says whether its batches may go to
  the workers directly; `close` ends it;
- `map` submits batches as Dask tasks, in one graph message (`client.map`), keyed
  ``distribute-<run id>-<n>`` (``persist-...`` for a persisted item);
- `send_direct` sends a batch to a worker directly instead (a start's first ten seconds,
  where a small cell's round trip is 0.5 ms, not the scheduler's 4-5 ms); `all_direct` says
  whether every worker takes its batches so now;
- `completions` yields the finished batches, futures and direct calls in one queue, in the
  order they finish (`distributed.as_completed` takes futures only); `results` reads their
  result blobs; `take` tells which items a finished batch held, and whether it ran alone;
- `stop` submits nothing more, `cancel` cancels on the scheduler what is still out, `lose`
  forgets it all (the cluster went away).

Every batch out is *pending* (its items by future, or by direct `Call`) until taken. A
`Transport` lives as long as its run.

Direct batches. A batch that is a Dask task crosses the scheduler on its way out and on its
way back: 4 to 5 ms here for a task that does nothing, the whole cost of a small cell. A
request from the kernel to a worker over the client's own connection pool (TLS, the
cluster's credentials) answers in 0.3 to 0.5 ms. So for the first `distribute.direct`
seconds of a run (10 s), `send_direct` sends each batch straight to a worker, which runs it
in the thread pool its tasks run in (`worker/__init__.py`) and answers with the same result
blob a task returns. A small cell, 20,000 tiny items, a million of them, a round of
rollouts: all of it is over within those seconds. A longer run goes on through the
scheduler after that, where Dask's dashboard and its work stealing see its batches as they
always did (the adaptive scaling counts direct batches too: `cluster/adaptive.py`).

- One a thread. A direct batch is never queued on a worker: the policy keeps one batch a
  worker thread out (`Policy.top_up`'s ``direct``), and sends a thread its next when the
  last comes back: the thread waits 0.5 ms on an idle machine, 2-3 ms while the other
  cores run items, which the batch sizes make 2% of a batch (`policy.py`). A queued batch
  would start as soon as its thread is free, but it would also still start after its
  kernel died, where the scheduler drops a dead client's queued tasks; and on the rollouts
  of `bench/simulation.py` one a thread was faster anyway, since a worker's loop then
  writes no answer while an item runs (`bench/RESULTS.md`, "simulation"). Dask tasks,
  after the direct time, are `in-flight` a thread (2): a task's round trip through the
  scheduler is too slow to wait for.

- The first batch. A run's first result must come one item's time after its start, whatever
  the items behind it do. Through the scheduler, the first batch is that item alone; sent
  directly, it is a probe like the others, and its worker sends the first item's result
  ahead of the answer when the batch goes on (`worker/__init__.py`), on the same connection
  (`_compat.worker_exchange`): `completions` gives it as a `Call` of its own (``of`` the
  batch), before the batch's answer, which leaves that item out.
- Which workers. Only a run whose items fit every worker goes direct (one with ``--gpus`` or
  ``--cpus`` is Dask tasks: the scheduler counts resources). And at most `MAX_WORKERS` of
  them: the kernel opens a connection, with a TLS handshake, to each worker it sends to (the
  scheduler has one to every worker already), so on a cluster of a thousand workers the
  batches beyond those workers' threads go through the scheduler from the start, in the same
  top-up, `in-flight` a thread. A worker is asked once per client to serve direct batches
  (`worker.serve`, through Dask's ``run`` request); one that cannot (nbcluster
  missing there, another nbcluster version) is remembered and gets Dask tasks only.
- When it goes wrong, the batch goes through the scheduler instead, and the start sends
  every later batch that way (`take` says it came back unrun): the worker refused it (paused
  past its memory limit, closing), and the scheduler holds the batch until a worker can take
  it; or the request broke (the worker died, or left the cluster, which the run's watch
  thread notices within half a second: `direct_workers`), and its items run again, once, as
  Dask re-runs a task whose worker died. A crash that an item itself causes is then found by
  the engine's suspects, as before. Nothing of a batch is lost or run twice by this: a
  batch's items are delivered only from its answer, and an answer that never came delivered
  nothing.

Results without a gather. A worker pushes a small result blob (or a persisted item's report)
to the kernel as a Dask event on `PUSHED_TOPIC` just before the task ends (`worker.push`).
Events from a worker travel on the same ordered stream as its task-finished message, so by
the time the kernel sees the task done, its blob is in the client's `_inbox`; where it is
not (a worker of another version, a blob too large, a lost event) the blob is gathered, so
a push never costs a result. The inbox keeps only the pushes of the keys a run of this
kernel expects, and forgets a run's keys when the run closes. It is opened on a run's first
Dask task: a run whose batches all went directly has nothing pushed.

Tasks that fail, not hang, on a worker without nbcluster (`task`). Dask unpickles a task as
part of the message that brings it to a worker; one that cannot import nbcluster failed
there, outside any task, lost its connection, and the batch waited forever. So a task's
function and arguments travel as bytes the task unpickles: the message loads anywhere, and
the import happens when the task runs, where its ``ModuleNotFoundError`` halts the run in one line
(`halt_reason`): ``dask.utils.apply(loader, [*deps])``, ``loader`` a nested task loading the
function with its arguments, and ``deps`` the task's Dask dependencies (the futures of
`--persist` handles it reads) as arguments Dask sees.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import math
import pickle
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple

from dask.base import annotate
from dask.utils import apply

from nbcluster import _compat, config
from nbcluster._compat import call_in_loop, erred_on, nested_task, run_on_worker, worker_exchange
from nbcluster._version import __version__
from nbcluster._wire import PUSHED_TOPIC, ROSTER_TOPIC
from nbcluster.cluster import registry
from nbcluster.errors import BadArgument, ClusterUnreachable, NoCluster
from nbcluster.persist.handles import outcome
from nbcluster.worker import HANDLER, VERSION, refusal, serve

# -- the link ------------------------------------------------------------------------------------
#: Seconds for which the scheduler's last word on its workers stands, for opening a link.
FRESH_S = 1.0
#: ... and where that scheduler tells this kernel of every worker that comes or goes
#: (nbcluster's plugin, on `ROSTER_TOPIC`): until such news, or this long at most.
TOLD_S = 60.0
#: An answer stands for `TOLD_S` only if asked this long after the kernel subscribed to the
#: news: the subscription and the question travel on two connections, so a question asked at
#: once could be answered before the subscription took effect, and a change in between missed.
SETTLED_S = 1.0


@dataclasses.dataclass
class _Roster:
    """What this kernel knows of one client's workers: the scheduler's last answer, and its news."""

    cores: dict[str, int] = dataclasses.field(default_factory=dict)  # threads by worker, as last asked
    at: float = -math.inf  # when asked (monotonic)
    told: bool = False  # the scheduler says on `ROSTER_TOPIC` when `cores` changes
    news: int = 0  # roster events heard
    seen: int = 0  # ... before `cores` was asked: newer news makes it stale
    stream: Any = None  # a weak reference to the connection the subscription went over
    since: float = 0.0  # when it subscribed there
    roster: bool = True  # the scheduler has nbcluster's `nbcluster_roster` (else Dask's `ncores`)


_ROSTERS: weakref.WeakKeyDictionary[Any, _Roster] = weakref.WeakKeyDictionary()
_ROSTERS_LOCK = threading.Lock()  # the kernel's thread opens links, runs' watch threads refresh them


def _ncores(client: Any, within: float) -> dict[str, int]:
    """The scheduler's workers and their threads: its answer of the last `within` seconds
    (`TOLD_S` where it tells of changes, and none came since), else asked now.

    A notebook's cells come seconds apart, so with `FRESH_S` alone nearly every cell asked,
    a round trip of 2 ms before its first item could go out (a third of a small cell).
    """
    now = time.monotonic()
    with _ROSTERS_LOCK:
        known = _ROSTERS.setdefault(client, _Roster())
        stands = TOLD_S if known.told and known.seen == known.news and within > 0 else within
        if client.status == "running" and now - known.at < stands:
            return known.cores
        seen = known.news
    told = _follow(client, known, now)
    answer = client.sync(client.scheduler.nbcluster_roster) if known.roster else None
    # Dask answers None to an operation the scheduler has no handler for: ask Dask's from now on.
    known.roster = answer is not None
    cores = {str(address): int(n) for address, n in (answer or client.ncores()).items()}
    with _ROSTERS_LOCK:
        known.cores, known.at, known.told, known.seen = cores, now, told and known.roster, seen
    return cores


def _follow(client: Any, known: _Roster, now: float) -> bool:
    """Subscribe `client` to the roster news, once per connection to its scheduler (a client
    that reconnected is subscribed to nothing); whether it was subscribed `SETTLED_S` ago."""
    if (stream := client.scheduler_comm) is None:
        return False
    with _ROSTERS_LOCK:
        if known.stream is not None and known.stream() is stream:
            return now - known.since >= SETTLED_S
        known.stream, known.since = weakref.ref(stream), now

    def heard(event: Any) -> None:  # holds the roster, not the client: the client holds it
        with _ROSTERS_LOCK:
            known.news += 1

    try:
        client.subscribe_topic(ROSTER_TOPIC, heard)
    except Exception:  # a client closing: asked each time, as without the news
        known.stream = None
    return False


class Needs(NamedTuple):
    """What each item of a run needs of a worker: ``distribute(..., needs=Needs(gpus=1))``.

    `%%distribute`'s ``--gpus``, ``--cpus`` and ``--cpu-only``, in one value; they are
    checked when a run starts, with its other options. An item runs only on a worker that
    has what it needs, and as many items run at once on a worker as it has room for.

    Parameters
    ----------
    gpus : float, optional
        GPUs each item needs: it runs only on GPU workers.
    cpus : float, optional
        CPU cores each item needs, of a CPU worker.
    cpu_only : bool, default False
        Keep the items off GPU workers.

    Examples
    --------
    >>> nbcluster.Needs(gpus=1)
    Needs(gpus=1, cpus=None, cpu_only=False)
    """

    gpus: float | None = None
    cpus: float | None = None
    cpu_only: bool = False


class Link:
    """A run's connection to its cluster; see the module docstring."""

    def __init__(self, needs: Needs, *, client: Any = None, cluster: str | None = None,
                 find: Callable[[str | None], Any]):  # fmt: skip
        self.needs, self.cluster, self.client = needs, cluster, client
        self._find = find  # a cluster's name (None: the current one) -> its handle, or NoCluster
        self.handle: Any = None  # the cluster's handle, when the link found the client itself
        self.submit_kwargs: dict[str, Any] = {}
        self.threads = 1
        self.eligible: list[str] = []  # the workers that qualified when the link opened
        self.is_open = False

    def open(self) -> Link:
        """Connect (once) and place the items; a mistake or an absent cluster is one message.

        Returns
        -------
        Link
            This link, open: its client, submit keywords, usable threads and eligible
            workers set.

        Raises
        ------
        nbcluster.errors.NoCluster
            When no cluster is running (or the named one is not), with how to start one or run
            with ``--local``.
        nbcluster.errors.ClusterUnreachable
            When the cluster's scheduler does not answer.
        nbcluster.errors.BadArgument
            When the cluster's workers cannot give what the items ask (see `placement`).
        """
        if self.is_open:
            return self
        if self.client is None:
            try:
                self.handle = self._find(self.cluster)
            except NoCluster as e:
                raise NoCluster(f"{e}; or run the items in this kernel with --local") from None
            self.client = self.handle.client
        try:
            self.submit_kwargs, self.threads, self.eligible = self._place(FRESH_S)
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(f"the cluster's scheduler does not answer: {e}") from None
        self.is_open = True
        return self

    def _place(self, within: float = 0.0) -> tuple[dict[str, Any], int, list[str]]:
        """`placement` of the items on the workers there: the scheduler's word of the last
        `within` seconds where every worker fits (`_ncores`), else asked now."""
        if self.needs == Needs():  # every worker fits
            cores = _ncores(self.client, within)
            return {}, max(1, sum(cores.values())), list(cores)
        return placement(self.needs, _compat.workers(self.client))

    def usable_threads(self) -> int:
        """How many items the workers that fit can run at once now (at least 1), asked now.

        The link's `threads` and `eligible` workers are now those of this answer.

        Returns
        -------
        int
            The threads of the eligible workers.

        Raises
        ------
        nbcluster.errors.BadArgument
            When no worker fits any more (see `placement`).
        """
        _, self.threads, self.eligible = self._place()
        return self.threads

    def eligible_now(self) -> list[str]:
        """The addresses of the workers that qualify, asked of the scheduler now (`--everywhere`).

        Returns
        -------
        list of str
            Their addresses; empty when the cluster has no worker that fits.
        """
        return self.open()._place()[2]

    @property
    def name(self) -> str:
        """The cluster's name for messages: its handle's, the ``--cluster`` given, else "the cluster"."""
        return getattr(self.handle, "name", None) or self.cluster or "the cluster"

    def gone(self) -> str | None:
        """Why the cluster is gone (its supervisor exited, its scheduler stopped answering), or None.

        Returns
        -------
        str or None
            The reason, for the one-line message that ends the run; None while the cluster is
            there.
        """
        entry = getattr(self.handle, "entry", None) or {}
        pid = entry.get("supervisor_pid")
        if pid and not registry.process_alive(pid, entry.get("supervisor_started")):
            return "its supervisor exited"
        return "its scheduler stopped answering" if self.client.status != "running" else None

    def close(self) -> None:
        """Drop a cluster that went away; its client stops trying to reconnect at once."""
        client, self.is_open = self.client, False
        if self.handle is not None:  # found by this link: open() finds the current one afresh
            self.client, self.handle = None, None
        with contextlib.suppress(Exception):
            client.close(timeout=2)


def placement(needs: Needs, workers: dict[str, Any]) -> tuple[dict[str, Any], int, list[str]]:
    """Resource restrictions for `--gpus/--cpus/--cpu-only`, usable threads, eligible workers.

    nbcluster's CPU workers advertise `{"CPU": threads}` and GPU workers `{"GPU": n}` (n from
    ``--gpus-per-worker``), so `--cpu-only` is simply a `CPU` restriction: it can never land
    on a GPU worker. A GPU worker's threads (``--gpu-threads`` per GPU) let fractional
    ``--gpus`` items share its GPU; the `GPU` resource caps how many run at once.

    Parameters
    ----------
    needs : Needs
        What each item asks of a worker.
    workers : dict of str to dict
        The scheduler's workers (``scheduler_info()["workers"]``), by address.

    Returns
    -------
    kwargs : dict
        The submit keywords (``{"resources": ...}``, or {} when nothing is asked).
    threads : int
        How many items the eligible workers can run at once (at least 1).
    eligible : list of str
        The addresses of the workers that qualify.

    Raises
    ------
    nbcluster.errors.BadArgument
        When no worker offers what is asked, or the workers do not say which ones are CPU
        workers for ``--cpu-only``/``--cpus``; the message says what they offer. Also when
        ``--gpus`` asks fewer GPUs than a multi-GPU worker holds (its items see them all).
    """
    resources = {k: float(v) for k, v in (("GPU", needs.gpus), ("CPU", needs.cpus)) if v}
    offered = {k for w in workers.values() for k in (w.get("resources") or {})}
    if needs.cpu_only and "CPU" not in resources:
        if "CPU" in offered:
            resources["CPU"] = 1
        elif "GPU" in offered:
            raise BadArgument("--cpu-only: this cluster's workers do not say which ones are CPU workers (none "
                              "advertises a CPU resource); start the cluster with nbcluster, or drop --cpu-only")  # fmt: skip
    if "CPU" in resources and "CPU" not in offered and workers:
        raise BadArgument("--cpus needs workers that advertise a CPU resource (nbcluster's clusters do); this "
                          "cluster's workers advertise none")  # fmt: skip
    eligible, threads = [], 0
    for address, info in workers.items():
        have, nthreads = info.get("resources") or {}, info.get("nthreads", 1)
        if all(have.get(k, 0) >= v for k, v in resources.items()):
            eligible.append(address)
            threads += max(1, min([int(have[k] // v) for k, v in resources.items()] + [nthreads]))
    if resources and workers and not eligible:
        wanted = ", ".join(f"{k}={v:g}" for k, v in resources.items())
        kinds = {", ".join(f"{k}={v:g}" for k, v in (w.get("resources") or {}).items()) for w in workers.values()}
        offers = "; ".join(sorted(kind or "no resources" for kind in kinds))
        fix = " Start GPU workers with `%cluster start --gpu-workers N`." if "GPU" in resources else ""
        raise BadArgument(f"no worker offers {wanted} per item (workers offer: {offers}).{fix}")
    # CUDA_VISIBLE_DEVICES is one value per worker process: every item on a worker of several
    # GPUs sees all of them. An item asking fewer would see (and could use) devices that the
    # scheduler counts as another item's, so it is refused, not run.
    held = sorted({g for a in eligible if (g := float(workers[a]["resources"]["GPU"])) > 1}) if needs.gpus else []
    if wrong := [g for g in held if g != needs.gpus]:
        each = f"{wrong[0]:g}"
        raise BadArgument(f"--gpus {needs.gpus:g}: this cluster's GPU workers hold {each} GPUs each and an item sees "
                          f"all of its worker's GPUs (one CUDA_VISIBLE_DEVICES per process); ask --gpus {each}, or "
                          "start the cluster with --gpus-per-worker 1 to run items of one GPU or less")  # fmt: skip
    return ({"resources": resources} if resources else {}), max(threads, 1), eligible


# -- the way out -------------------------------------------------------------------------------
#: Workers one start sends direct batches to, at most (the first by address).
MAX_WORKERS = 32
#: Per client: worker address -> True (serves direct batches), False (does not), or the
#: asyncio task asking it now. Touched only in the client's event loop.
_SERVES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


class Transport:
    """One run's batches in flight; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id, in its batches' keys.
    """

    def __init__(self, run_id: str):
        self.run_id, self.lock, self._seq = run_id, threading.Lock(), itertools.count()
        self.pending: dict[Any, Any] = {}  # future (or direct call) -> the item indices of its batch
        self.stopping = False  # nothing more is submitted
        self._alone: Any = None  # the batch that has been the only one out since its submit
        self._completed: queue.SimpleQueue[Any] | None = None  # finished batches; itself: the start is over
        self._direct: _Direct | None = None
        self._inbox: dict[str, bytes | None] = {}  # the client's pushed blobs, from the first task on

    def open(self, link: Link, direct: bool = True) -> bool:
        """Begin a start: batches may go out; True when its batches go to workers directly.

        Parameters
        ----------
        link : Link
            The run's link, open.
        direct : bool
            Whether the run's batches may go directly at all: only a run whose items fit
            every worker and read no persisted values (for ``distribute.direct`` seconds).

        Returns
        -------
        bool
            Whether a worker takes direct batches now.
        """
        completed, sending = queue.SimpleQueue[Any](), None
        if direct and link.needs == Needs():  # for ``distribute.direct`` seconds (`_Direct.worker`)
            sending = _Direct(link.client, _ncores(link.client, FRESH_S), completed)
        with self.lock:
            self._completed, self._direct = completed, sending
        return sending is not None and sending.worker() is not None

    def all_direct(self) -> bool:
        """Whether every worker of the start takes its batches directly now (one a thread).

        Returns
        -------
        bool
            False once the direct time is over or a call failed, and on a cluster of more
            than `MAX_WORKERS` workers.
        """
        sending = self._direct
        return sending is not None and sending.everywhere and time.monotonic() < sending.until

    def close(self) -> None:
        """End a start: what finishes from now on is ignored; nothing is expected any more."""
        with self.lock:
            self._completed = self._direct = None
        with _INBOXES_LOCK:  # expect nothing more of this run (its keys hold ``-<run id>-``)
            for key in [k for k in self._inbox if f"-{self.run_id}-" in k]:
                del self._inbox[key]

    def map(self, client: Any, calls: Sequence[tuple[Any, ...]], batches: Sequence[Any], *, persist: bool = False,
            placed: Sequence[Sequence[str]] = (), **where: Any) -> list[Any | None]:  # fmt: skip
        """Submit each of `calls` as a Dask task, all in one graph message.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        calls : sequence of tuple
            Per task: its function (the same for all) and arguments (as `task` makes them).
        batches : sequence
            Per task: the item indices it runs.
        persist : bool
            Keys ``persist-<run id>-<n>`` (a persisted item's), not ``distribute-...``.
        placed : sequence of sequence of str
            Per task, the workers it should run on, loosely; empty, or none: anywhere.
        **where : Any
            Dask's submit keywords for every one of them.

        Returns
        -------
        list of distributed.Future or None
            The tasks' futures; Nones when stopping (nothing was submitted).
        """
        self._inbox = _inbox(client)
        with self.lock:
            if self.stopping:
                return [None] * len(calls)
            keys = [f"{'persist' if persist else 'distribute'}-{self.run_id}-{next(self._seq)}" for _ in calls]
            with _INBOXES_LOCK:  # before the tasks can run: a push may come first
                self._inbox.update(dict.fromkeys(keys))
            columns = zip(*(c[1:] for c in calls), strict=True)
            # Each task bound loosely to its own workers, in one graph message (Dask's submit keywords
            # bind every task of a message to the same ones): the annotation is a function of the key,
            # which the scheduler calls for each new task, a mapping's own lookup, so it needs nothing
            # of nbcluster to load it.
            by_key = collections.defaultdict(list, {k: list(p) for k, p in zip(keys, placed, strict=False) if p})
            with annotate(workers=by_key.__getitem__, allow_other_workers=True) if by_key else contextlib.nullcontext():
                made = client.map(calls[0][0], *columns, key=keys, pure=False, **where)
            for future, indices in zip(made, batches, strict=True):
                self._out(future, indices)
            completed = self._completed
        if completed is not None:
            for future in made:
                future.add_done_callback(completed.put)
        return list(made)

    def send_direct(self, indices: Any, context: tuple[str, bytes | None], blob: bytes, token: str) -> bool:
        """Send one batch to a worker directly; False: it must be a Dask task.

        Parameters
        ----------
        indices : sequence of int
            The batch's items.
        context : tuple of (str, bytes or None)
            The run's context key and inline blob.
        blob : bytes
            The pickled batch.
        token : str
            The start's stop token.

        Returns
        -------
        bool
            True when it was sent, or dropped because the run is stopping (its items then
            become cancelled).
        """
        with self.lock:
            if self.stopping or (sending := self._direct) is None:
                return self.stopping
            key = f"distribute-{self.run_id}-{next(self._seq)}"
            if (call := sending.send(key, context, blob, token, not self.pending)) is not None:
                self._out(call, indices)
        return call is not None

    def _out(self, batch: Any, indices: Any) -> None:
        # Under `lock`: `batch` (a future or a direct call) is pending, alone if none else is.
        self._alone = None if self.pending else batch
        self.pending[batch] = indices

    def completions(self) -> Iterator[list[Any]]:
        """Lists of finished batches (futures and direct calls), in the order they finished,
        each all that had finished by then, until none is out.

        Yields
        ------
        list
            Dask futures and direct calls.
        """
        # Each pending batch reaches the queue once it is finished (a direct batch's first
        # item sent ahead, before it); `lose` puts the queue itself there.
        while (completed := self._completed) is not None and self.pending:
            done = [completed.get()]
            while not completed.empty():  # the only reader: what it holds, it gives
                done.append(completed.get_nowait())
            if completed in done:
                return
            yield done

    def results(self, client: Any, done: list[Any], *, gather: bool = True) -> list[Any]:
        """The result blobs of the finished batches in `done`, fetched in one gather.

        A direct call's came with its answer; one its worker pushed ahead of the task's end
        needs no gather. A batch that did not finish gives its exception instead, and so
        does one whose gather failed (each is then asked alone).

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        done : list
            Finished futures and direct calls.
        gather : bool
            False for a ``--persist`` run, whose values stay where they are: a task's is what
            its worker pushed (its report), or None.

        Returns
        -------
        list
            Per batch, its blob or its exception (or None, see `gather`).
        """
        with _INBOXES_LOCK:
            got = {id(f): f.answer if isinstance(f, Call) else self._inbox.pop(str(f.key), None) for f in done}
        if not gather:
            return [got[id(f)] for f in done]
        if fetch := [f for f in done if got[id(f)] is None and f.status == "finished"]:
            with contextlib.suppress(Exception):  # one of them went meanwhile: each is asked alone
                got.update({id(f): blob for f, blob in zip(fetch, client.gather(fetch), strict=True)})
        return [outcome(f) if got[id(f)] is None else got[id(f)] for f in done]

    def take(self, future: Any) -> tuple[Any, bool, bool]:
        """The items of a finished batch, now no longer pending.

        Parameters
        ----------
        future : distributed.Future or Call
            A finished batch.

        Returns
        -------
        tuple of (indices or None, bool, bool)
            Its items (None when it was cancelled or withdrawn, or the first item of a batch
            no longer out); whether no other batch was out while it ran; whether it came back
            unrun from a worker asked directly (refused, or the worker died under it), in
            which case every later batch of this start is a Dask task.
        """
        with self.lock:
            if isinstance(future, Call) and future.of is not None:
                # The first item of a batch still out (`worker/__init__.py`): a batch of its own
                # now; the batch's answer leaves it out.
                if (whole := self.pending.get(future.of)) is not None:
                    self.pending[future.of] = whole[1:]
                return (None if whole is None else whole[:1]), False, False
            batch = self.pending.pop(future, None)
            alone, self._alone = self._alone is future, None
        return batch, alone, isinstance(future, Call) and future.status != "finished"

    def direct_workers(self, alive: Collection[str]) -> list[str]:
        """The workers running (or holding) this run's direct batches now, for the adaptive
        scaling, which sees no task of theirs there (`cluster/adaptive.py`); the calls to
        workers no longer in the cluster are given up first, and workers that joined get
        direct batches from now on (`_Direct.meet`).

        Parameters
        ----------
        alive : collection of str
            The addresses of the cluster's workers now (a direct run's are all eligible).

        Returns
        -------
        list of str
            The addresses of those still there, each once.
        """
        with self.lock:
            calls = [c for c in self.pending if isinstance(c, Call)]
        for call in calls:
            if call.worker not in alive and (sent := call.sent) is not None:
                call_in_loop(call.client, sent.cancel)  # a task of the client's loop
        if (sending := self._direct) is not None:
            sending.meet(_ncores(sending.client, FRESH_S))  # the answer `alive` came from
        return sorted({c.worker for c in calls if c.worker in alive})

    def stop(self) -> bool:
        """Submit nothing more; whether batches are still out.

        Returns
        -------
        bool
            True while some batch is pending.
        """
        with self.lock:
            self.stopping = True
            return bool(self.pending)

    def cancel(self, client: Any) -> None:
        """Stop, and cancel on the scheduler every batch still out (its items are given up).

        A direct batch cannot be cancelled: it was told the stop token, and its answer, if it
        still comes, is ignored.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        """
        if futures := [f for f in self.lose() if not isinstance(f, Call)]:
            client.cancel(futures, reason="interrupted from the notebook")

    def lose(self) -> list[Any]:
        """Stop, and forget every batch still out; those batches.

        Returns
        -------
        list
            The futures and direct calls that were pending.
        """
        with self.lock:
            self.stopping, completed = True, self._completed
            futures, self.pending = list(self.pending), {}
        if completed is not None:
            completed.put(completed)  # `completions` ends
        return futures


# -- direct batches: to a worker, not through the scheduler --------------------------------
class Call:
    """One direct batch, kept where the engine keeps a Dask future.

    Attributes
    ----------
    client : distributed.Client
        The client whose event loop sends it.
    key : str
        Its name, as a Dask key would be (``distribute-<run id>-<n>``).
    worker : str
        The worker's address.
    status : str
        ``"pending"``, ``"finished"`` (``answer`` is the result blob) or ``"error"``
        (``answer`` is why: the exception, or a refusal's reason).
    answer : Any
        See `status`.
    of : Call or None
        For the first item of a run's first batch, sent ahead of its answer
        (`worker/__init__.py`): the batch it came from; None for a batch's answer.
    """

    def __init__(self, client: Any, key: str, worker: str, of: Call | None = None, answer: Any = None):
        self.client, self.key, self.worker, self.of, self.answer = client, key, worker, of, answer
        self.status = "pending" if of is None else "finished"
        self.sent: Any = None  # the request (a task of the client's event loop), while it runs


class _Direct:
    """Sends one start's direct batches; see the module docstring.

    Parameters
    ----------
    client : distributed.Client
        The run's client (its event loop sends the requests).
    workers : dict of str to int
        The workers every item fits, with their threads (`meet`).
    completions : queue.SimpleQueue
        Where each call goes when it is answered, after it was counted out.
    """

    def __init__(self, client: Any, workers: dict[str, int], completions: queue.SimpleQueue[Any]):
        self.client, self.completions = client, completions
        self.until = time.monotonic() + config.seconds("distribute.direct")  # a failed call ends it at once
        self._lock = threading.Lock()  # `out`: the driver sends, the client's loop answers
        # Each worker starts this start's batches in the order they were sent (`worker/__init__.py`).
        self.sender = uuid.uuid4().hex
        self.out: dict[str, int] = {}
        self._numbered: dict[str, int] = {}
        self.meet(workers)

    def meet(self, workers: dict[str, int]) -> None:
        """Send to the workers there now: one that joined gets direct batches too, one that
        left none (the run's watch thread, twice a second).

        Parameters
        ----------
        workers : dict of str to int
            The workers every item fits, with their threads (`MAX_WORKERS` of them are used).
        """
        chosen = sorted(workers)[:MAX_WORKERS]
        with self._lock:
            for address in chosen:
                self.out.setdefault(address, 0)
                self._numbered.setdefault(address, 0)
        self.everywhere = len(chosen) == len(workers)
        # Rebound whole, not changed: `worker` reads it without the lock. A batch a thread.
        self.slots = {address: max(1, workers[address]) for address in chosen}

    def worker(self) -> str | None:
        """The worker the next batch goes to directly, or None: send it through the scheduler.

        Returns
        -------
        str or None
            The least busy worker (by its share of its slots) with a free slot; None once the
            direct time is over, after a failed call, or when every slot is taken.
        """
        if time.monotonic() >= self.until:
            return None
        known = _SERVES.get(self.client, {})
        free = [(self.out[a] / slots, a) for a, slots in self.slots.items()
                if self.out[a] < slots and known.get(a) is not False]  # fmt: skip
        return min(free)[1] if free else None

    def send(self, key: str, context: tuple[str, bytes | None], blob: bytes, token: str, first: bool) -> Call | None:
        """Send one batch to the worker `worker()` names; None: no worker.

        Parameters
        ----------
        key : str
            The batch's name (``distribute-<run id>-<n>``).
        context, blob, token
            As a batch's task takes them (`worker.run_batch`).
        first : bool
            The run's first batch: a worker still running it after `worker.AHEAD_S`
            sends its first item ahead, which reaches the completions as a `Call` of its own
            (``of`` this one) before this one's answer, which then leaves that item out.

        Returns
        -------
        Call or None
            The call, pending; None when no worker takes a direct batch now (see `worker`).
        """
        if (worker := self.worker()) is None:
            return None
        call = Call(self.client, key, worker)
        with self._lock:
            self.out[worker] += 1
            number, self._numbered[worker] = self._numbered[worker], self._numbered[worker] + 1
            args = {"key": key, "context": context, "batch": blob, "token": token, "sender": self.sender, "number": number}
            # Under the lock: the worker starts a sender's batches in the order of their numbers.
            call_in_loop(self.client, self._start, call, args, first)
        return call

    def _start(self, call: Call, args: dict[str, Any], first: bool) -> None:
        # In the client's event loop.
        call.sent = asyncio.ensure_future(self._request(call, args, first))
        call.sent.add_done_callback(functools.partial(self._answered, call))

    async def _request(self, call: Call, args: dict[str, Any], first: bool) -> Any:
        """Ask the worker to run the batch, installing the handler there first (once per client)."""
        known = _SERVES.setdefault(self.client, {})
        if (serves := known.get(call.worker)) is None:
            serves = known[call.worker] = asyncio.ensure_future(_install(self.client, call.worker))
        if isinstance(serves, asyncio.Future):
            serves = known[call.worker] = await serves
        if not serves:
            return {"refused": "it cannot serve direct batches"}
        message = {"op": HANDLER, "reply": True, "first": first, **args}
        return await worker_exchange(self.client, call.worker, message, functools.partial(self._ahead, call))

    def _ahead(self, call: Call, blob: bytes) -> None:
        # In the client's event loop: the first item of `call`, ahead of its answer.
        self.completions.put(Call(self.client, call.key, call.worker, of=call, answer=blob))

    def _answered(self, call: Call, sent: Any) -> None:
        with self._lock:
            self.out[call.worker] -= 1
        call.sent = None
        try:
            call.answer = sent.result()
            why: str | BaseException | None = refusal(call.answer)  # None for a result blob
        except BaseException as e:  # the request broke, or was given up (`direct_workers`)
            why = e
        call.status = "finished" if why is None else "error"
        if why is not None:  # `answer` says why; the direct time is over: every later batch is a Dask task
            call.answer, self.until = why, 0.0
        self.completions.put(call)


async def _install(client: Any, worker: str) -> bool:
    """Whether `worker` now serves direct batches of this nbcluster's `VERSION`."""
    try:
        return bool(await run_on_worker(client, worker, serve) == VERSION)
    except Exception:
        return False


# -- results pushed by the workers -----------------------------------------------------------
#: Per client: the blobs pushed on `PUSHED_TOPIC`, kept for the keys some run expects (the key
#: -> its blob once pushed, None before): other kernels' pushes, and late ones, are not kept.
_INBOXES: weakref.WeakKeyDictionary[Any, dict[str, bytes | None]] = weakref.WeakKeyDictionary()
_INBOXES_LOCK = threading.Lock()  # the driver threads expect and take, the clients' loops fill


def _inbox(client: Any) -> dict[str, bytes | None]:
    """The inbox of `client`, subscribed the first time; an empty one of no client's if it
    cannot subscribe (nothing arrives there: every blob is gathered)."""
    with _INBOXES_LOCK:
        if client not in _INBOXES:
            blobs: dict[str, bytes | None] = {}

            def arrived(event: tuple[float, Any]) -> None:  # holds the inbox, not the client
                key, blob = event[1].get("key"), event[1].get("report")
                with _INBOXES_LOCK:
                    if isinstance(key, str) and isinstance(blob, bytes) and key in blobs:
                        blobs[key] = blob

            with contextlib.suppress(Exception):
                client.subscribe_topic(PUSHED_TOPIC, arrived)
                _INBOXES[client] = blobs
        return _INBOXES.get(client, {})


# -- tasks that load anywhere --------------------------------------------------------------------
def task(fn: Callable[..., Any], *args: Any, deps: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """``client.submit(*task(fn, *args, deps=deps))`` runs ``fn(*args, *deps)``; where `fn`
    cannot be imported, the task fails with that ImportError instead of breaking the
    worker's connection (see the module docstring).

    Parameters
    ----------
    fn : callable
        A function importable by name (a module's top-level function) where the task runs.
    *args : Any
        Its arguments: plain data, pickled with it (no Dask futures: Dask would not see them).
    deps : tuple
        Dask futures, passed last, as their values: Dask resolves them on the worker.

    Returns
    -------
    tuple
        ``(dask.utils.apply, a nested task that unpickles fn with its arguments, [*deps])``.

    Examples
    --------
    >>> import operator
    >>> apply, loader, deps = task(operator.add, 2, 3)
    >>> apply(loader(), deps)
    5
    """
    call = pickle.dumps(functools.partial(fn, *args), protocol=pickle.HIGHEST_PROTOCOL)
    return (apply, nested_task(pickle.loads, call), list(deps))


def halt_reason(client: Any, key: str, why: str) -> str:
    """The one line for a batch that could not import nbcluster: the worker it failed on and
    the fix, where the scheduler can say which worker (it has nbcluster), else the cluster's.

    Parameters
    ----------
    client : distributed.Client
        The run's client, to ask the scheduler where the task failed.
    key : str
        The failed batch's Dask key (still held, so the scheduler remembers it).
    why : str
        The import error, as one line (``ModuleNotFoundError: No module named 'nbcluster'``).

    Returns
    -------
    str
        The line the cell ends with: the worker, its address and the nbcluster version to
        install there; or that the whole cluster needs nbcluster, on its scheduler and workers.
    """
    workers = []
    with contextlib.suppress(Exception):  # a scheduler without nbcluster cannot run this: say what is known
        workers = client.run_on_scheduler(erred_on, key)
    if not workers:
        return (f"the cluster at {client.scheduler.address} cannot load nbcluster's tasks ({why}): "
                "nbcluster must be installed where its scheduler runs and on its workers")  # fmt: skip
    name, address = workers[0]
    return (f"worker {name} ({address}) cannot import nbcluster ({why}): install nbcluster {__version__} "
            "in the Python environment that runs it (as on the scheduler), or stop that worker")  # fmt: skip
