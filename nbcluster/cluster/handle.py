"""`ClusterHandle`: the client side of one cluster, and `start`/`connect`/`clusters`.

A handle is a registry entry plus the means to talk to its scheduler: control calls go to
nbcluster's scheduler RPC handlers over TLS with the cluster's own credentials, and
`handle.client` is an ordinary `distributed.Client`. A handle caches nothing the scheduler
can answer: `info()` asks every time.

Where the scheduler runs elsewhere (SSH, a gateway, Kubernetes), the supervisor serves the
same ``nbcluster_*`` handlers on its own address, ``control`` in the entry, with
``control_tls`` (see ``deploy.py``): `arpc` sends them there, and everything else
(``identity``, the Dask client) to the scheduler. A scheduler nbcluster did not start
(`connect` to an address) is *external*: its status is the scheduler's own ``identity``,
its metrics come from nbcluster's plugin where the scheduler accepted it, and scale, adapt,
restart and stop are refused with the reason.

`start` decides whether a running cluster is reused and checks the request; the process
itself comes from the launcher (``launcher.py``: the supervisor, its pre-warmed spare, the
reaping of those that exited). The entry a handle holds is `_wire.Entry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distributed import Client, Security
from distributed.core import ConnectionPool

from nbcluster import _aio, config
from nbcluster._compat import quick_sends
from nbcluster._wire import ClusterState, Credentials, Entry, ExternalEntry, RegistryEntry, Snapshot
from nbcluster.cluster import gpu, launcher, registry
from nbcluster.cluster.credentials import security_from
from nbcluster.cluster.info import ClusterInfo, identity_rows
from nbcluster.cluster.kinds import check_kind
from nbcluster.cluster.spec import RENAMED_GPUS, ClusterSpec, check_name, parse_bounds, parse_count
from nbcluster.errors import BadArgument, ClusterNotFound, ClusterUnreachable
from nbcluster.metrics.basic import basic_snapshot
from nbcluster.metrics.plugin import MetricsPlugin

# Control connections, pooled per event loop and scheduler: the sidebar polls every open
# cluster twice a second, and a TLS handshake per poll would cost more than the poll.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], ConnectionPool]] = (
    weakref.WeakKeyDictionary()
)


def connect_timeout() -> float:
    """`nbcluster.timeouts.connect`: how long reaching a scheduler may take.

    Returns
    -------
    float
        Seconds, from Dask config.
    """
    return config.seconds("timeouts.connect")


def _comm_for(address: str) -> None:
    """Make the comm for `address` known to Dask: a gateway's ``gateway://`` is registered
    by importing dask-gateway (in every process that connects, not only the supervisor)."""
    if address.startswith("gateway://"):
        try:
            import dask_gateway  # noqa: F401
        except ImportError:
            raise BadArgument(
                f"{address} is a dask-gateway address: `pip install 'nbcluster[gateway]'`"
            ) from None


class ClusterHandle:
    """One running cluster, as seen from a client process.

    Made by `nbcluster.start`, `nbcluster.connect`, `nbcluster.use` and
    `nbcluster.clusters`, never directly. It holds no state of the cluster's: each call asks
    the scheduler, so any number of handles, in any processes, agree.

    Examples
    --------
    >>> cluster = nbcluster.start(workers=2)
    >>> cluster.scale(4)
    >>> cluster.client.submit(sum, [1, 2]).result()
    3
    >>> cluster.stop()
    """

    def __init__(self, entry: Entry, *, directory: Path | None = None, reused: bool = False):
        self.entry = entry
        self.directory = directory
        #: True when `start` found this cluster already running instead of starting it.
        self.reused = reused
        self._client: Client | None = None

    # -- identity ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The cluster's name (for an external scheduler, its address)."""
        return self.entry["name"]

    @property
    def address(self) -> str:
        """The scheduler's address, such as ``tls://127.0.0.1:40123``."""
        return self.entry["address"]

    @property
    def managed(self) -> bool:
        """False for a scheduler nbcluster did not start (no control handlers there)."""
        return not self.entry["external"]

    @property
    def security(self) -> Security | None:
        """The `distributed.Security` a client needs (the cluster's own TLS files), or None."""
        tls = self.entry.get("tls")
        return security_from(tls) if tls else None

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard's own address, or None unless started with ``dashboard=True``.

        It asks for the cluster's certificate: a browser opens it through Jupyter instead,
        at ``<base_url>nbcluster/dashboard/NAME/status`` (the link `info` shows).
        """
        return None if self.entry["external"] else self.entry.get("dashboard")

    def __repr__(self) -> str:
        return f"<ClusterHandle {self.name!r} {self.address}>"

    # -- talking to the scheduler -----------------------------------------------------

    def _route(self, op: str) -> tuple[str, Credentials | None]:
        """Where `op` goes, with which credentials: nbcluster's handlers to the control
        address where the supervisor serves them itself, the rest to the scheduler."""
        entry = self.entry
        if op.startswith("nbcluster_") and not entry["external"] and "control" in entry:
            return entry["control"], entry.get("control_tls")
        return self.address, entry.get("tls")

    async def _pool(self, address: str, tls: Credentials | None) -> ConnectionPool:
        """This loop's pooled connections to this address (see `_pools`)."""
        by_key = _pools.setdefault(asyncio.get_running_loop(), {})
        key = (address, json.dumps(tls, sort_keys=True))
        pool = by_key.get(key)
        if pool is None:
            _comm_for(address)
            args = (security_from(tls) if tls else Security()).get_connection_args("client")
            pool = by_key[key] = ConnectionPool(limit=4, connection_args=args, timeout=connect_timeout())
            await pool.start()
        return pool

    async def arpc(self, op: str, timeout: float = 30, **kwargs: Any) -> Any:
        """Call the scheduler's handler `op` and return its answer (a coroutine).

        Parameters
        ----------
        op : str
            The handler, such as ``"nbcluster_info"`` or Dask's own ``"identity"``.
        timeout : float, default 30
            Seconds the answer may take.
        **kwargs
            The handler's arguments.

        Returns
        -------
        object
            The handler's answer, as msgpack carried it (lists may arrive as tuples).

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            If the scheduler cannot be reached or does not answer within `timeout`. An error
            the handler raises itself (say a `BadArgument`) comes through as that error.
        """
        address, tls = self._route(op)
        pool = await self._pool(address, tls)
        call = asyncio.ensure_future(getattr(pool(address), op)(**kwargs))
        try:
            done, _ = await asyncio.wait({call}, timeout=timeout)
            if not done:
                call.cancel()
                raise ClusterUnreachable(
                    f"cluster {self.name!r} at {self.address} did not answer {op} within {timeout:.0f} s"
                )
            return call.result()
        except (OSError, ClusterUnreachable) as e:
            # A stopped or stuck scheduler's connections are useless. When two calls fail at
            # once (20 sidebars polling a cluster being deleted), Dask's ConnectionPool.remove
            # cancels a pending connect twice and the second raises RuntimeError ("Cannot
            # change state of expiring Timeout"): the first already did the job.
            with contextlib.suppress(RuntimeError):
                pool.remove(address)
            if isinstance(e, ClusterUnreachable):
                raise
            raise ClusterUnreachable(
                f"cluster {self.name!r} at {self.address} does not answer ({type(e).__name__}): "
                "it may have stopped; `%cluster list` shows the running ones"
            ) from None

    def rpc(self, op: str, timeout: float = 30, **kwargs: Any) -> Any:
        """`arpc`, blocking: call the scheduler's handler `op` and return its answer.

        Parameters
        ----------
        op, timeout, **kwargs
            As `arpc` takes them.

        Returns
        -------
        object
            As `arpc` returns it.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            As `arpc` raises it.
        """
        return _aio.run(self.arpc(op, timeout=timeout, **kwargs))

    def _need_managed(self, what: str) -> None:
        if not self.managed:
            raise BadArgument(
                f"{what} is unavailable for {self.address}: it is an external cluster (started elsewhere), "
                "so scale or stop it with the tool that started it"
            )

    async def ainfo(self) -> ClusterState:
        """The scheduler's live answer to ``nbcluster_info`` (a coroutine; `info` blocks).

        Returns
        -------
        nbcluster._wire.ClusterState
            Workers (with host, job id, GPU), task counts, spec, backend and owner.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            If the scheduler does not answer.
        """
        if not self.managed:
            ident = await self.arpc("identity")
            return {
                "name": self.name, "address": self.address, "external": True, "tasks": {},
                "workers": identity_rows(ident), "dashboard": None, "owner_pid": None, "created": None,
            }  # fmt: skip
        info: ClusterState = await self.arpc("nbcluster_info")
        info["workers"] = list(info["workers"])  # msgpack turns lists into tuples
        return info

    def info(self) -> ClusterInfo:
        """The cluster's live state, as ``%cluster status`` shows it.

        Returns
        -------
        nbcluster.cluster.info.ClusterInfo
            Workers (with GPUs), cores, memory and running tasks; a table in a notebook,
            and its ``data`` the `ainfo` answer.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            If the scheduler does not answer.

        Examples
        --------
        >>> cluster = nbcluster.start(workers=2)
        >>> len(cluster.info().data["workers"])
        2
        """
        return ClusterInfo(_aio.run(self.ainfo()))

    async def ametrics(self, since: int | None = None, detail: int | None = None) -> Snapshot:
        """`metrics`, as a coroutine.

        Parameters
        ----------
        since, detail : int, optional
            As `metrics` takes them.

        Returns
        -------
        nbcluster._wire.Snapshot
            As `metrics` returns it.
        """
        if self.entry["external"] and not self.entry.get("metrics"):
            return basic_snapshot(await self.arpc("identity"), since)
        snapshot: Snapshot | None = await self.arpc("nbcluster_metrics", since=since, detail=detail)
        if snapshot is None:
            # Dask answers None for a handler it no longer has: a stopping scheduler's plugins
            # take theirs away before its connections close.
            raise ClusterUnreachable(f"cluster {self.name!r} is stopping: it no longer serves its metrics")
        return snapshot

    def metrics(self, since: int | None = None, detail: int | None = None) -> Snapshot:
        """New task-stream records and resource samples since a cursor (see `nbcluster.metrics`).

        The scheduler keeps them in bounded rings, so memory stays flat however long the
        cluster runs; a ``gap`` in the answer says records were dropped since `since`.

        Parameters
        ----------
        since : int, optional
            The ``cursor`` of the previous snapshot (default: everything kept).
        detail : int, optional
            How many workers to describe one by one (the busiest; all are summarised).

        Returns
        -------
        nbcluster._wire.Snapshot
            What is new since `since`, with the ``cursor`` to pass next time.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            If the scheduler does not answer, or is stopping.

        Examples
        --------
        >>> cluster = nbcluster.start(workers=2)
        >>> first = cluster.metrics()
        >>> later = cluster.metrics(since=first["cursor"])
        >>> later["cursor"] >= first["cursor"]
        True
        """
        return _aio.run(self.ametrics(since, detail))

    @property
    def spec(self) -> ClusterSpec:
        """What the cluster was started with (threads and memory per worker)."""
        return ClusterSpec() if self.entry["external"] else ClusterSpec.from_dict(self.entry.get("spec") or {})

    def scale(self, n: int, kind: str = "cpu", *, force: bool = False) -> None:
        """Have `n` workers of `kind`; returns once they are up or gone.

        This turns adaptive scaling off. `n` is checked against ``nbcluster.limits`` here
        and again in the supervisor, before any worker is started.

        Parameters
        ----------
        n : int
            The number of workers of that kind.
        kind : {"cpu", "gpu"}, default "cpu"
            The worker kind.
        force : bool, default False
            Go past the limits derived from the machine (never those set in config).

        Raises
        ------
        nbcluster.errors.BadArgument
            A bad number or kind, a size above the limits, or an external cluster.

        Examples
        --------
        >>> cluster = nbcluster.start(workers=2)
        >>> cluster.scale(3)
        >>> len(cluster.info().data["workers"])
        3
        >>> # not executed: it needs a GPU; tests/test_gpu.py scales GPU workers
        >>> cluster.scale(1, kind="gpu")  # doctest: +SKIP
        """
        self._need_managed("scale")
        n, kind = parse_count(n, "the number of workers"), check_kind(kind)
        # Only this kind is known here; the supervisor checks both kinds together.
        cpu, gpu = (n, 0) if kind == "cpu" else (0, n)
        self.spec.check_size(f"scale {n}", cpu, gpu, force=force)
        self.rpc("nbcluster_scale", timeout=120, n=n, kind=kind, force=force)

    def adapt(self, minimum: int = 0, maximum: int = 4, *, force: bool = False) -> None:
        """Let the cluster grow and shrink its CPU workers between the bounds, by load.

        An explicit `scale` turns this off again.

        Parameters
        ----------
        minimum : int, default 0
            The fewest CPU workers.
        maximum : int, default 4
            The most CPU workers; checked against ``nbcluster.limits`` like a `scale`.
        force : bool, default False
            Go past the limits derived from the machine (never those set in config).

        Raises
        ------
        nbcluster.errors.BadArgument
            Bounds that are not counts, `minimum` above `maximum`, a size above the limits,
            or an external cluster.

        Examples
        --------
        >>> cluster = nbcluster.start(workers=2)
        >>> cluster.adapt(minimum=1, maximum=8)
        >>> cluster.scale(2)  # a fixed size again
        """
        self._need_managed("adapt")
        lo, hi = parse_bounds(minimum, maximum)
        self.spec.check_size(f"adapt --max {hi}", hi, force=force)
        self.rpc("nbcluster_adapt", minimum=lo, maximum=hi, force=force)

    def restart(self) -> None:
        """Restart every worker process (clears their memory); the cluster stays."""
        self._need_managed("restart")
        self.rpc("nbcluster_restart", timeout=120)

    def stop(self) -> None:
        """Stop the cluster and all its worker processes; returns when they are gone."""
        entry = self.entry
        if entry["external"]:
            self._need_managed("stop")
            return
        self.close_client()
        # A supervisor that cannot answer still gets terminated by wait_gone.
        with contextlib.suppress(ClusterUnreachable):
            self.rpc("nbcluster_stop", timeout=10)
        launcher.wait_gone(entry["supervisor_pid"], entry["supervisor_started"])
        launcher.reap_children()
        if launcher.keep_warm() and self.directory is not None:
            # Replenish now rather than right after a start, where the spare's imports
            # would compete with the new cluster's workers for the cores.
            launcher.prewarm(self.directory)

    # -- the Dask client --------------------------------------------------------------

    @property
    def client(self) -> Client:
        """A `distributed.Client` connected to this cluster (made on first use)."""
        if self._client is None or self._client.status in ("closed", "closing"):
            self._client = _new_client(self.address, self.security)
        return self._client

    def close_client(self) -> None:
        """Close this handle's `client`, if it made one; the cluster keeps running.

        The client is dropped even where closing it fails: one whose scheduler has just gone
        may be reconnecting, and Dask's close then raises the reconnect's error.
        """
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _new_client(address: str, security: Security | None) -> Client:
    """A `distributed.Client` of this process, connected to `address` (ClusterUnreachable if not)."""
    _comm_for(address)
    try:
        client = Client(address, security=security, set_as_default=False, timeout=connect_timeout())
    except (OSError, asyncio.TimeoutError):
        raise ClusterUnreachable(
            f"cannot connect a Dask client to {address}: is the cluster still running? "
            "`%cluster list` shows the running ones"
        ) from None
    quick_sends(client)  # a cell's batches go to the scheduler at once (cluster/streams.py)
    return client


# -- finding and starting clusters ------------------------------------------------------


def _looks_like_address(text: str) -> bool:
    return "://" in text or (":" in text and text.rsplit(":", 1)[-1].isdigit())


def _tls_files(security: Sequence[str] | None) -> Credentials | None:
    """``(CA, CERT, KEY)`` paths, checked, as an entry's ``tls``."""
    if security is None:
        return None
    if isinstance(security, str):
        security = security.split(",")
    parts = [str(p).strip() for p in security]
    if len(parts) != 3 or not all(parts):
        raise BadArgument(
            "--security takes three files, CA,CERT,KEY: e.g. --security ca.pem,cert.pem,key.pem"
        )
    for part in parts:
        path = Path(part).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise BadArgument(f"--security: cannot read {part}: give the path of a PEM file you can read")
    ca, cert, key = (str(Path(p).expanduser().resolve()) for p in parts)
    return {"ca_file": ca, "cert": cert, "key": key}


def connect(
    name_or_address: str,
    *,
    security: Sequence[str] | str | None = None,
    runtime_dir: str | os.PathLike[str] | None = None,
) -> ClusterHandle:
    """A handle on a running cluster, by registry name or scheduler address.

    A scheduler nbcluster did not start (an address) is an external cluster: it can be used
    and watched, but not scaled or stopped from here. It gets nbcluster's metrics plugin
    where its scheduler accepts it (it must import nbcluster), else the basic view.

    Parameters
    ----------
    name_or_address : str
        A name from `clusters`, or a scheduler address such as ``tls://host:8786``.
    security : tuple of str or str, optional
        ``(CA, CERT, KEY)`` (or ``"CA,CERT,KEY"``): PEM files for a ``tls://`` scheduler
        run by someone else.
    runtime_dir : str or path, optional
        The registry folder (default: ``NBCLUSTER_RUNTIME_DIR``, else Jupyter's runtime
        folder).

    Returns
    -------
    ClusterHandle
        The cluster; unlike `nbcluster.use`, it does not become the current one.

    Raises
    ------
    nbcluster.errors.ClusterNotFound
        No running cluster of that name (the message names those that run).
    nbcluster.errors.ClusterUnreachable
        The address does not answer within ``nbcluster.timeouts.connect``.

    Examples
    --------
    >>> nbcluster.connect("local").name
    'local'
    """
    directory = registry.runtime_dir(runtime_dir)
    target = str(name_or_address).strip()
    tls = _tls_files(security)
    if not _looks_like_address(target):
        if tls is not None:
            raise BadArgument(
                "--security is for an address (tls://HOST:PORT); a cluster nbcluster started has its own"
            )
        return _registered(directory, target)
    for entry in registry.entries(directory):
        if entry.get("address") == target:
            return ClusterHandle(entry, directory=directory)
    if (
        target.startswith("tls://")
        and tls is None
        and Security().get_connection_args("client").get("ssl_context") is None
    ):
        raise ClusterUnreachable(
            f"no scheduler answers at {target} that nbcluster can reach without credentials: "
            f"`%cluster use {target} --security CA,CERT,KEY` with the files its administrator gave you"
        )
    external: ExternalEntry = {"name": target, "address": target, "external": True, "tls": tls}
    handle = ClusterHandle(external, directory=directory)
    timeout = connect_timeout()
    try:
        handle.rpc("identity", timeout=timeout)
    except ClusterUnreachable:
        hint = " Check the --security files: the scheduler may have refused them." if tls else ""
        raise ClusterUnreachable(
            f"no scheduler answers at {target} within {timeout:g} s (nbcluster.timeouts.connect): check "
            f"the address, or `%cluster list` for nbcluster's clusters.{hint}"
        ) from None
    external["metrics"] = _install_metrics(handle)
    return handle


def _install_metrics(handle: ClusterHandle) -> bool:
    """nbcluster's metrics plugin on an external scheduler, where it allows it."""
    async def register() -> None:
        _comm_for(handle.address)
        async with Client(
            handle.address,
            security=handle.security,
            asynchronous=True,
            set_as_default=False,
            timeout=connect_timeout(),
        ) as client:
            await client.register_plugin(MetricsPlugin())

    try:
        _aio.run(asyncio.wait_for(register(), connect_timeout()))
    except Exception:
        return False  # refused (no nbcluster there, or pickled plugins off): the basic view
    return True


def _registered(directory: Path, name: str) -> ClusterHandle:
    check_name(name)
    entry = registry.read(directory, name)
    if entry is None or entry.get("state") != "running":
        known = [e["name"] for e in registry.entries(directory)]
        running = f" Running: {', '.join(known)}." if known else " None is running."
        raise ClusterNotFound(
            f"no cluster named {name!r}.{running} Start it with `%cluster start --name {name}`."
        )
    return ClusterHandle(entry, directory=directory)


def clusters(*, runtime_dir: str | os.PathLike[str] | None = None) -> list[ClusterHandle]:
    """Every running cluster in the registry, whoever started it, oldest first.

    Parameters
    ----------
    runtime_dir : str or path, optional
        The registry folder (default: ``NBCLUSTER_RUNTIME_DIR``, else Jupyter's runtime
        folder).

    Returns
    -------
    list of ClusterHandle
        One per cluster; entries whose supervisor has gone are pruned on the way.

    Examples
    --------
    >>> cluster = nbcluster.start()
    >>> [c.name for c in nbcluster.clusters()]
    ['local']
    """
    directory = registry.runtime_dir(runtime_dir)
    launcher.reap_children()
    return [ClusterHandle(e, directory=directory) for e in registry.entries(directory)]


def start(
    workers: int | None = None,
    threads: int | None = None,
    memory: str | int | None = None,
    gpu_workers: int | str | None = None,
    name: str | None = None,
    keep: bool = False,
    dashboard: bool = False,
    gpu_backend: str | None = None,
    *,
    gpus_per_worker: int | None = None,
    gpu_threads: int | None = None,
    profile: str | None = None,
    force: bool = False,
    owner_pid: int | None = None,
    runtime_dir: str | os.PathLike[str] | None = None,
    client: bool = False,
    gpus: int | str | None = None,
) -> ClusterHandle:
    """Start a cluster in its own supervisor process, or reuse the one already running.

    With `name`, a running cluster of that name is reused (a notebook re-run is safe);
    without one, this owner's unnamed cluster is reused, else the first free of ``local``,
    ``local-2``, ... is started. The cluster stops when the owner process (default: this
    one) exits, unless `keep`.

    The size is checked against `nbcluster.limits` before anything starts; `force=True`
    lifts the limits derived from the machine, not those set in Dask config. A cluster not
    ready within `nbcluster.timeouts.start` is torn down, and the error names its log.

    `profile` names where the cluster runs (`nbcluster.profiles` in Dask config, default
    ``local``): a batch system, a gateway, SSH hosts or Kubernetes. `workers`, `threads`
    and `memory` override the profile's options where they apply (jobs, cores and memory
    per job for dask-jobqueue). Stop cancels whatever the backend started.

    Parameters
    ----------
    workers : int, optional
        CPU worker processes (default: one per core, or ``nbcluster.defaults.workers``).
    threads : int, optional
        Threads per worker (default: 1).
    memory : str or int, optional
        Memory limit per worker, such as ``"4GiB"`` or bytes (default: a share of RAM).
    gpu_workers : int or "auto", optional
        GPU workers to start, one per device: ``"auto"`` for every GPU found, or a number.
    name : str, optional
        The cluster's name (default: ``local``, then ``local-2``, ...; on a profile, the
        profile's name).
    keep : bool, default False
        Keep running after the owner process exits (stop it with ``nbcluster stop NAME``).
    dashboard : bool, default False
        Start Dask's dashboard (opened through Jupyter's proxy).
    gpu_backend : str, optional
        GPU worker implementation: ``"builtin"`` (default) or ``"dask-cuda"``.
    gpus_per_worker : int, optional
        GPUs each GPU worker holds (default 1); its ``CUDA_VISIBLE_DEVICES`` lists them all,
        so an item on it sees them all (items asking fewer are refused, see
        `nbcluster.Needs`).
    gpu_threads : int, optional
        Threads per GPU of a GPU worker (default 4): items asking a fraction of a GPU
        (``gpus=0.25``) share it, four at once; items asking none may run there too.
    profile : str, optional
        Where to run: a profile of ``nbcluster.profiles`` in Dask config (default: local).
    force : bool, default False
        Go past the limits derived from this machine (never those set in config).
    owner_pid : int, optional
        The process whose exit stops the cluster (default: this one).
    runtime_dir : str or path, optional
        The registry folder (default: ``NBCLUSTER_RUNTIME_DIR``, else Jupyter's runtime
        folder).
    client : bool, default False
        Also connect the handle's `ClusterHandle.client`, while the workers start (the
        local backend; elsewhere once the cluster runs).
    gpus : int or "auto", optional
        The old name of `gpu_workers`, kept for one release: it warns (`FutureWarning`) and
        means the same.

    Returns
    -------
    ClusterHandle
        The running cluster; ``reused`` is True when it was already running.

    Raises
    ------
    nbcluster.errors.BadArgument
        A value that is not valid, or a size above the limits, with what to do.
    nbcluster.errors.ClusterFailed
        The cluster did not start (or not within ``nbcluster.timeouts.start``); the message
        names its log.

    Examples
    --------
    >>> cluster = nbcluster.start(workers=2, memory="1GiB")
    >>> cluster.info().data["workers"][0]["nthreads"]
    1
    >>> cluster.stop()
    """
    if gpus is not None:
        if gpu_workers is not None:
            raise BadArgument("give gpu_workers only: gpus is its old name")
        warnings.warn(RENAMED_GPUS, FutureWarning, stacklevel=2)
        gpu_workers = gpus
    spec = ClusterSpec.from_user(
        workers=workers,
        threads=threads,
        memory=memory,
        gpu_workers=gpu_workers,
        name=name,
        keep=keep,
        dashboard=dashboard,
        gpu_backend=gpu_backend,
        gpus_per_worker=gpus_per_worker,
        gpu_threads=gpu_threads,
        profile=profile,
        force=force,
    )
    directory = registry.runtime_dir(runtime_dir)
    owner = None if keep else (owner_pid or os.getpid())
    reusable = _find_reusable(directory, spec)
    if reusable is not None:
        return ClusterHandle(reusable, directory=directory, reused=True)
    if spec.gpus not in (None, 0):
        # Fail here, with the fix, rather than in the supervisor's log.
        gpu.select(spec.gpus, gpu.discover(), spec.gpus_per_worker)
    early: list[Client] = []

    def connect(scheduler: dict[str, Any]) -> None:
        # The workers' start is most of a cluster's: the client connects meanwhile. If it
        # cannot, the ready line says why, or `client` connects later as usual.
        with contextlib.suppress(ClusterUnreachable):
            early.append(_new_client(scheduler["address"], security_from(scheduler["tls"])))

    try:
        entry = launcher.spawn(spec, directory, owner, force=force, on_scheduler=connect if client else None)
    except BaseException:
        for made in early:
            made.close()
        raise
    handle = ClusterHandle(entry, directory=directory)
    if early:
        handle._client = early[0]
    return handle


def _find_reusable(directory: Path, spec: ClusterSpec) -> RegistryEntry | None:
    if spec.name:
        # Only a running cluster can be used: one still starting has no address yet, and its
        # name stays claimed, so this start then says it is taken (concurrent starts).
        entry = registry.read(directory, spec.name)
        return entry if entry is not None and entry.get("state") == "running" else None
    # An unnamed cluster is reused by the process that started it, so re-running a
    # notebook's `%cluster start` never piles up local, local-2, ...
    for entry in registry.entries(directory):
        theirs = entry.get("spec")
        if (
            theirs is not None
            and theirs["name"] is None
            and theirs["profile"] == spec.profile
            and entry.get("started_by") == os.getpid()
        ):
            return entry
    return None
