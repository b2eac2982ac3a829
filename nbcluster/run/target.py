"""Where a run's items go: its link to the cluster, and which workers may take them.

`Link(needs, client=..., cluster=..., find=...)` is made before anything else of a run, and
opened (`open()`) only when items leave the kernel: a `--local` run never needs a cluster.
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from nbcluster import _compat
from nbcluster._wire import ROSTER_TOPIC
from nbcluster.cluster import registry
from nbcluster.errors import BadArgument, ClusterUnreachable, NoCluster

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
_LOCK = threading.Lock()  # the kernel's thread opens links, runs' watch threads refresh them


def _ncores(client: Any, within: float) -> dict[str, int]:
    """The scheduler's workers and their threads: its answer of the last `within` seconds
    (`TOLD_S` where it tells of changes, and none came since), else asked now.

    A notebook's cells come seconds apart, so with `FRESH_S` alone nearly every cell asked,
    a round trip of 2 ms before its first item could go out (a third of a small cell).
    """
    now = time.monotonic()
    with _LOCK:
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
    with _LOCK:
        known.cores, known.at, known.told, known.seen = cores, now, told and known.roster, seen
    return cores


def _follow(client: Any, known: _Roster, now: float) -> bool:
    """Subscribe `client` to the roster news, once per connection to its scheduler (a client
    that reconnected is subscribed to nothing); whether it was subscribed `SETTLED_S` ago."""
    if (stream := client.scheduler_comm) is None:
        return False
    with _LOCK:
        if known.stream is not None and known.stream() is stream:
            return now - known.since >= SETTLED_S
        known.stream, known.since = weakref.ref(stream), now

    def heard(event: Any) -> None:  # holds the roster, not the client: the client holds it
        with _LOCK:
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
        self.cores: dict[str, int] = {}  # threads by worker, as last asked
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
            self.cores = _ncores(self.client, within)
            return {}, max(1, sum(self.cores.values())), list(self.cores)
        return placement(self.needs, _compat.workers(self.client))

    def usable_threads(self) -> int:
        """How many items the workers that fit can run at once now (at least 1), asked now.

        Returns
        -------
        int
            The threads of the eligible workers.

        Raises
        ------
        nbcluster.errors.BadArgument
            When no worker fits any more (see `placement`).
        """
        return self._place()[1]

    def workers(self) -> dict[str, int]:
        """Every worker of the cluster and its threads, as last asked (where every worker fits).

        Returns
        -------
        dict of str to int
            Threads by worker address: asked when the link opened, and again by each
            `usable_threads`.
        """
        return self.open().cores

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
