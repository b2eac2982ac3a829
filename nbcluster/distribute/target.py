"""Where a run's items go: its link to the cluster, and which workers may take them.

`Link(needs, client=..., cluster=...)` is made before anything else of a run, and opened
(`open()`) only when items leave the kernel: a `--local` run never needs a cluster. Opening
finds the client (the one given, the named cluster's, or the current one), asks the
scheduler for its workers once, and works out the placement of the run's items from their
`Needs`: the Dask resource restrictions, the workers that can take them and how many items
can run at once there (the batch sizing's `threads`).

Where every worker fits (no `Needs`), an answer of the scheduler's from the last `FRESH_S`
seconds stands in for asking: cells run back to back (a loop of `distribute` calls, a
pipeline) then send their first items without waiting for a round trip. Being a second
late about the workers costs little: each run's watch thread asks afresh twice a second
and resizes the run (`usable_threads`). `--everywhere`, which runs once on each worker, asks
afresh (`eligible_now`).

A link whose cluster went away is `close()`d by the engine; a retry `open()`s it again, to
whatever cluster is current by then.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any, NamedTuple

from nbcluster._current import handle_for
from nbcluster.cluster import registry
from nbcluster.errors import BadArgument, ClusterUnreachable, NoCluster

#: Seconds for which the scheduler's last word on its workers stands, for opening a link.
FRESH_S = 1.0

_ASKED: weakref.WeakKeyDictionary[Any, tuple[float, dict[str, int]]] = weakref.WeakKeyDictionary()
_ASKED_LOCK = threading.Lock()  # the kernel's thread opens links, runs' watch threads refresh


def _ncores(client: Any, within: float) -> dict[str, int]:
    """The scheduler's workers and their threads: its answer of the last `within` seconds, else asked now."""
    now = time.monotonic()
    with _ASKED_LOCK:
        asked = _ASKED.get(client)
    if asked is not None and now - asked[0] < within and client.status == "running":
        return asked[1]
    cores = {str(address): int(n) for address, n in client.ncores().items()}
    with _ASKED_LOCK:
        _ASKED[client] = (now, cores)
    return cores


class Needs(NamedTuple):
    """What each item asks of a worker: `--gpus`, `--cpus`, `--cpu-only`."""

    gpus: float | None = None
    cpus: float | None = None
    cpu_only: bool = False


class Link:
    """A run's connection to its cluster; see the module docstring."""

    def __init__(self, needs: Needs, *, client: Any = None, cluster: str | None = None):
        self.needs = needs
        self.cluster = cluster
        self.client = client
        self.handle: Any = None  # the cluster's handle, when the link found the client itself
        self.submit_kwargs: dict[str, Any] = {}
        self.threads = 1
        self._eligible: list[str] | None = None
        self.is_open = False

    def open(self) -> Link:
        """Connect (once) and place the items; a mistake or an absent cluster is one message.

        Returns
        -------
        Link
            This link, open: its client, submit keywords and usable threads set.

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
        self._eligible = None
        if self.client is None:
            try:
                self.handle = handle_for(self.cluster)
            except NoCluster as e:
                raise NoCluster(f"{e}; or run the items in this kernel with --local") from None
            self.client = self.handle.client
        try:
            if self.needs == Needs():
                # Every worker fits. Asked with `ncores`, a few bytes a worker (not a description of
                # each), and not again within `FRESH_S` of the last answer: a loop of cells asked it
                # once a cell, 3.8 ms each here (py-spy), before its first item could go out.
                cores = _ncores(self.client, FRESH_S)
                self.submit_kwargs, self.threads, self._eligible = {}, max(1, sum(cores.values())), list(cores)
            else:
                workers = self.client.scheduler_info()["workers"]
                self.submit_kwargs, self.threads, self._eligible = placement(self.needs, workers)
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(f"the cluster's scheduler does not answer: {e}") from None
        self.is_open = True
        return self

    def usable_threads(self) -> int:
        """How many items the workers that fit can run at once now (at least 1), asked now.

        Returns
        -------
        int
            The threads of the eligible workers. Where every worker fits, from the scheduler's
            `ncores`: not every worker described (0.78 s a call at 1,000 workers;
            bench/RESULTS.md, "scale: engine").

        Raises
        ------
        nbcluster.errors.BadArgument
            When no worker fits any more (see `placement`).
        """
        if self.needs == Needs():
            return max(1, sum(_ncores(self.client, 0.0).values()))
        return placement(self.needs, self.client.scheduler_info()["workers"])[1]

    def workers(self) -> dict[str, int]:
        """Every worker of the cluster and its threads, as the scheduler said within `FRESH_S`.

        Returns
        -------
        dict of str to int
            Threads by worker address (`usable_threads` has just asked, in a run's watch
            thread).
        """
        return _ncores(self.open().client, FRESH_S)

    @property
    def eligible(self) -> list[str]:
        """The addresses of the workers that qualified when the link opened (within `FRESH_S`)."""
        return self.open()._eligible or []

    def eligible_now(self) -> list[str]:
        """The addresses of the workers that qualify, asked of the scheduler now (`--everywhere`).

        Returns
        -------
        list of str
            Their addresses; empty when the cluster has no worker that fits.
        """
        self.open()
        return placement(self.needs, self.client.scheduler_info()["workers"])[2]

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
        if self.client.status != "running":
            return "its scheduler stopped answering"
        return None

    def close(self) -> None:
        """Drop a cluster that went away; its client stops trying to reconnect at once."""
        client, self.is_open = self.client, False
        if self.handle is not None:  # found by this link: open() finds the current one afresh
            self.client, self.handle = None, None
        with contextlib.suppress(Exception):
            client.close(timeout=2)


def placement(needs: Needs, workers: dict[str, Any]) -> tuple[dict[str, Any], int, list[str]]:
    """Resource restrictions for `--gpus/--cpus/--cpu-only`, usable threads, eligible workers.

    nbcluster's CPU workers advertise `{"CPU": threads}` and GPU workers `{"GPU": 1}`, so
    `--cpu-only` is simply a `CPU` restriction: it can never land on a GPU worker.

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
        workers for ``--cpu-only``/``--cpus``; the message says what they offer.
    """
    resources: dict[str, float] = {}
    if needs.gpus:
        resources["GPU"] = needs.gpus
    if needs.cpus:
        resources["CPU"] = needs.cpus
    offered = {k for w in workers.values() for k in (w.get("resources") or {})}
    if needs.cpu_only and "CPU" not in resources:
        if "CPU" in offered:
            resources["CPU"] = 1
        elif "GPU" in offered:
            raise BadArgument(
                "--cpu-only: this cluster's workers do not say which ones are CPU workers (none "
                "advertises a CPU resource); start the cluster with nbcluster, or drop --cpu-only"
            )
    if "CPU" in resources and "CPU" not in offered and workers:
        raise BadArgument(
            "--cpus needs workers that advertise a CPU resource (nbcluster's clusters do); this "
            "cluster's workers advertise none"
        )
    eligible, threads = [], 0
    for address, info in workers.items():
        have = info.get("resources") or {}
        if all(have.get(k, 0) >= v for k, v in resources.items()):
            eligible.append(address)
            slots = min([int(have[k] // v) for k, v in resources.items()], default=info.get("nthreads", 1))
            threads += max(1, min(slots, info.get("nthreads", 1)))
    if resources and workers and not eligible:
        wanted = ", ".join(f"{k}={v:g}" for k, v in resources.items())
        fix = " Start GPU workers with `%cluster start --gpus N`." if "GPU" in resources else ""
        raise BadArgument(f"no worker offers {wanted} per item (workers offer: {_offers(workers)}).{fix}")
    kwargs = {"resources": resources} if resources else {}
    return kwargs, max(threads, 1), eligible


def _offers(workers: dict[str, Any]) -> str:
    kinds = sorted(
        {
            ", ".join(f"{k}={v:g}" for k, v in (w.get("resources") or {}).items()) or "no resources"
            for w in workers.values()
        }
    )
    return "; ".join(kinds)
