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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.config
from distributed import Client, Security
from distributed.core import ConnectionPool

from nbcluster import _aio, config
from nbcluster.cluster import registry, startlog
from nbcluster.cluster.backends import security_from
from nbcluster.cluster.deploy import basic_snapshot, identity_rows
from nbcluster.cluster.info import ClusterInfo
from nbcluster.cluster.kinds import check_kind
from nbcluster.cluster.spec import ClusterSpec, check_name, parse_bounds, parse_count
from nbcluster.errors import BadArgument, ClusterFailed, ClusterNotFound, ClusterUnreachable

# Control connections, pooled per event loop and scheduler: the sidebar polls every open
# cluster twice a second, and a TLS handshake per poll would cost more than the poll.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], ConnectionPool]] = (
    weakref.WeakKeyDictionary()
)

STOP_TIMEOUT_S = 30


def connect_timeout() -> float:
    """`nbcluster.timeouts.connect`: how long reaching a scheduler may take."""
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
    """One running cluster, as seen from a client process."""

    def __init__(self, entry: dict[str, Any], *, directory: Path | None = None, reused: bool = False):
        self.entry = entry
        self.directory = directory
        #: True when `start` found this cluster already running instead of starting it.
        self.reused = reused
        self._client: Client | None = None

    # -- identity ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.entry["name"]

    @property
    def address(self) -> str:
        return self.entry["address"]

    @property
    def managed(self) -> bool:
        """False for a scheduler nbcluster did not start (no control handlers there)."""
        return not self.entry.get("external")

    @property
    def security(self) -> Security | None:
        tls = self.entry.get("tls")
        return security_from(tls) if tls else None

    @property
    def dashboard_link(self) -> str | None:
        return self.entry.get("dashboard")

    def __repr__(self) -> str:
        return f"<ClusterHandle {self.name!r} {self.address}>"

    # -- talking to the scheduler -----------------------------------------------------

    def _route(self, op: str) -> tuple[str, dict[str, str] | None]:
        """Where `op` goes, with which credentials: nbcluster's handlers to the control
        address where the supervisor serves them itself, the rest to the scheduler."""
        if op.startswith("nbcluster_") and self.entry.get("control"):
            return self.entry["control"], self.entry.get("control_tls")
        return self.address, self.entry.get("tls")

    async def _pool(self, address: str, tls: dict[str, str] | None) -> ConnectionPool:
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
        """Call scheduler handler `op` (e.g. ``"nbcluster_scale"``) and return its answer.

        A scheduler that cannot be reached, or does not answer within `timeout`, raises
        `ClusterUnreachable`; an error raised by the handler itself (say a `BadArgument`)
        comes through as that error.
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
        return _aio.run(self.arpc(op, timeout=timeout, **kwargs))

    def _need_managed(self, what: str) -> None:
        if not self.managed:
            raise BadArgument(
                f"{what} is unavailable for {self.address}: it is an external cluster (started elsewhere), "
                "so scale or stop it with the tool that started it"
            )

    async def ainfo(self) -> dict[str, Any]:
        if not self.managed:
            ident = await self.arpc("identity")
            return {
                "name": self.name, "address": self.address, "external": True, "tasks": {},
                "workers": identity_rows(ident),
            }  # fmt: skip
        info = await self.arpc("nbcluster_info")
        info["workers"] = list(info["workers"])  # msgpack turns lists into tuples
        return info

    def info(self) -> ClusterInfo:
        """Live state: workers (with GPUs), cores, memory, running tasks."""
        return ClusterInfo(_aio.run(self.ainfo()))

    async def ametrics(self, since: int | None = None, detail: int | None = None) -> dict[str, Any]:
        if not self.managed and not self.entry.get("metrics"):
            return basic_snapshot(await self.arpc("identity"), since)
        return await self.arpc("nbcluster_metrics", since=since, detail=detail)

    def metrics(self, since: int | None = None, detail: int | None = None) -> dict[str, Any]:
        """New task-stream records and resource samples since a cursor (see nbcluster.metrics);
        `detail` caps the workers described one by one (the busiest; all are summarised)."""
        return _aio.run(self.ametrics(since, detail))

    @property
    def spec(self) -> ClusterSpec:
        """What the cluster was started with (threads and memory per worker)."""
        return ClusterSpec.from_dict(self.entry.get("spec") or {})

    def scale(self, n: int, kind: str = "cpu", *, force: bool = False) -> None:
        """Have `n` workers of `kind` ("cpu" or "gpu"); returns once they are up or gone.

        `n` is checked against `nbcluster.limits` here and again in the supervisor, before
        any worker is started; `force=True` lifts the machine-derived limits (see `limits`).
        """
        self._need_managed("scale")
        n, kind = parse_count(n, "the number of workers"), check_kind(kind)
        # Only this kind is known here; the supervisor checks both kinds together.
        cpu, gpu = (n, 0) if kind == "cpu" else (0, n)
        self.spec.check_size(f"scale {n}", cpu, gpu, force=force)
        self.rpc("nbcluster_scale", timeout=120, n=n, kind=kind, force=force)

    def adapt(self, minimum: int = 0, maximum: int = 4, *, force: bool = False) -> None:
        """Let the cluster grow and shrink its CPU workers between the bounds by load.

        `maximum` is checked against `nbcluster.limits` like a `scale` (`force` as there).
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
        self._need_managed("stop")
        self.close_client()
        pid = self.entry.get("supervisor_pid")
        # A supervisor that cannot answer still gets terminated by _wait_gone.
        with contextlib.suppress(ClusterUnreachable):
            self.rpc("nbcluster_stop", timeout=10)
        _wait_gone(pid, self.entry.get("supervisor_started"))
        _reap_children()
        if _keep_warm and self.directory is not None:
            # Replenish now rather than right after a start, where the spare's imports
            # would compete with the new cluster's workers for the cores.
            prewarm(self.directory)

    # -- the Dask client --------------------------------------------------------------

    @property
    def client(self) -> Client:
        """A `distributed.Client` connected to this cluster (made on first use)."""
        if self._client is None or self._client.status in ("closed", "closing"):
            _comm_for(self.address)
            try:
                self._client = Client(
                    self.address, security=self.security, set_as_default=False, timeout=connect_timeout()
                )
            except (OSError, asyncio.TimeoutError):
                raise ClusterUnreachable(
                    f"cannot connect a Dask client to {self.address}: is the cluster still running? "
                    "`%cluster list` shows the running ones"
                ) from None
        return self._client

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _wait_gone(pid: int | None, started: float | None) -> None:
    """Wait for a supervisor to exit (SIGTERM after STOP_TIMEOUT_S, SIGKILL 10 s later).

    On its pidfd, which is readable once the process has exited: a supervisor that is not
    our child stays a zombie until the process that started it reaps it, and waiting for
    the pid to disappear would wait out the whole timeout (it did: 40 s per CLI stop).
    """
    if not registry.process_alive(pid, started):
        return
    assert pid is not None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        for timeout, then in ((STOP_TIMEOUT_S, signal.SIGTERM), (10, signal.SIGKILL)):
            if select.select([fd], [], [], timeout)[0]:
                return
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, then)
    finally:
        os.close(fd)


def _reap_children() -> None:
    """Collect the exit status of supervisors this process started and that have exited
    (stopped from elsewhere), so that none stays a zombie while this process lives."""
    _children[:] = [proc for proc in _children if proc.poll() is None]


# -- finding and starting clusters ------------------------------------------------------


def _looks_like_address(text: str) -> bool:
    return "://" in text or (":" in text and text.rsplit(":", 1)[-1].isdigit())


def _tls_files(security: Sequence[str] | None) -> dict[str, str] | None:
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

    `security` is ``(CA, CERT, KEY)`` (or ``"CA,CERT,KEY"``): the files for a ``tls://``
    scheduler run by someone else. Such an external cluster gets nbcluster's metrics plugin
    where its scheduler accepts it (it must import nbcluster), else the basic view.
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
    handle = ClusterHandle(
        {"name": target, "address": target, "external": True, "tls": tls}, directory=directory
    )
    timeout = connect_timeout()
    try:
        handle.rpc("identity", timeout=timeout)
    except ClusterUnreachable:
        hint = " Check the --security files: the scheduler may have refused them." if tls else ""
        raise ClusterUnreachable(
            f"no scheduler answers at {target} within {timeout:g} s (nbcluster.timeouts.connect): check "
            f"the address, or `%cluster list` for nbcluster's clusters.{hint}"
        ) from None
    handle.entry["metrics"] = _install_metrics(handle)
    return handle


def _install_metrics(handle: ClusterHandle) -> bool:
    """nbcluster's metrics plugin on an external scheduler, where it allows it."""
    from nbcluster.metrics.plugin import MetricsPlugin

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
    """Every running cluster in the registry, whoever started it, oldest first."""
    directory = registry.runtime_dir(runtime_dir)
    _reap_children()
    return [ClusterHandle(e, directory=directory) for e in registry.entries(directory)]


def start(
    workers: int | None = None,
    threads: int | None = None,
    memory: str | int | None = None,
    gpus: int | str | None = None,
    name: str | None = None,
    keep: bool = False,
    dashboard: bool = False,
    gpu_backend: str | None = None,
    *,
    profile: str | None = None,
    force: bool = False,
    owner_pid: int | None = None,
    runtime_dir: str | os.PathLike[str] | None = None,
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
    """
    spec = ClusterSpec.from_user(
        workers=workers,
        threads=threads,
        memory=memory,
        gpus=gpus,
        name=name,
        keep=keep,
        dashboard=dashboard,
        gpu_backend=gpu_backend,
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
        from nbcluster.cluster import gpu

        gpu.select(spec.gpus, gpu.discover())
    return ClusterHandle(_spawn(spec, directory, owner, force=force), directory=directory)


def _find_reusable(directory: Path, spec: ClusterSpec) -> dict[str, Any] | None:
    if spec.name:
        return registry.read(directory, spec.name)
    # An unnamed cluster is reused by the process that started it, so re-running a
    # notebook's `%cluster start` never piles up local, local-2, ...
    for entry in registry.entries(directory):
        theirs = entry.get("spec", {})
        if (
            theirs.get("name") is None
            and theirs.get("profile", "local") == spec.profile
            and entry.get("started_by") == os.getpid()
        ):
            return entry
    return None


@dataclass
class _Launched:
    """A supervisor process that has started (and imported) but not yet been asked for a cluster."""

    proc: subprocess.Popen[bytes]
    ready_r: int
    log: Path

    def discard(self) -> None:
        os.close(self.ready_r)
        if self.proc.stdin:
            self.proc.stdin.close()  # EOF: the supervisor exits without starting anything
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_spare: _Launched | None = None
#: Supervisors started from this process that run clusters (see `_reap_children`).
_children: list[subprocess.Popen[bytes]] = []
_keep_warm = False
_spare_lock = threading.Lock()


def _launch(directory: Path) -> _Launched:
    startlog.prune_stale(directory)
    log = startlog.new_path(directory)
    ready_r, ready_w = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "nbcluster.cluster.supervisor",
        "--ready-fd",
        str(ready_w),
        "--log",
        str(log),
    ]
    fd = startlog.open_locked(log)
    try:
        # A new session: a kernel interrupt (SIGINT to the kernel's process group) must not
        # reach the cluster; the owner watch is what ties the two together.
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=fd, stderr=fd, pass_fds=(ready_w,), start_new_session=True
        )
    finally:
        os.close(fd)
        os.close(ready_w)
    return _Launched(proc, ready_r, log)


def prewarm(runtime_dir: str | os.PathLike[str] | None = None) -> None:
    """Keep one supervisor launched ahead of time, so `start` skips its Python start-up.

    `%load_ext nbcluster` calls this: a spare costs one idle process (it exits when this
    process does) and saves about half a second on a `%cluster start`. A spare used by a
    start is replaced when a cluster is next stopped from this process.
    """
    global _spare, _keep_warm
    directory = registry.runtime_dir(runtime_dir)
    with _spare_lock:
        _keep_warm = True
        if _spare is not None and _spare.proc.poll() is None and _spare.log.parent == directory:
            return
        if _spare is not None:
            _spare.discard()
        _spare = _launch(directory)


def discard_spare() -> None:
    """Stop the spare supervisor, if any, and stop keeping one."""
    global _spare, _keep_warm
    with _spare_lock:
        _keep_warm = False
        if _spare is not None:
            _spare.discard()
            _spare = None


def _take(directory: Path) -> _Launched:
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None and spare.proc.poll() is None and spare.log.parent == directory:
        return spare
    if spare is not None:
        spare.discard()
    return _launch(directory)


def _spawn(spec: ClusterSpec, directory: Path, owner: int | None, *, force: bool = False) -> dict[str, Any]:
    timeout = config.seconds("timeouts.start")  # a bad setting stops us before a process is taken
    launched = _take(directory)
    proc = launched.proc
    # The caller's nbcluster settings too: a `dask.config.set` in a notebook applies to the
    # clusters it starts, as it would to a LocalCluster started there. So do the sections
    # of the deployment projects a profile leaves the rest to (`jobqueue.slurm`, `gateway`).
    settings = {k: dask.config.config[k] for k in _FORWARDED_CONFIG if k in dask.config.config}
    request = {
        "spec": spec.to_dict(), "runtime_dir": str(directory), "owner": owner, "env": dict(os.environ),
        "force": force, "config": settings,
    }  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.close()
        line = _read_line(launched.ready_r, timeout)
    except BaseException as error:
        # Too slow, or interrupted (Ctrl-C, a server shutting down): nothing half-started
        # may stay behind, whatever phase the supervisor is in.
        _tear_down(proc)
        if isinstance(error, TimeoutError):
            log = startlog.keep_failed(launched.log)
            raise ClusterFailed(
                f"the cluster was not ready within {timeout:g} s (nbcluster.timeouts.start) and was "
                f"stopped; its log: {log or '(none)'}"
            ) from None
        raise
    finally:
        os.close(launched.ready_r)
    if not line:
        proc.wait(10)
        log = startlog.keep_failed(launched.log)
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log else []
        raise ClusterFailed(
            f"the cluster supervisor exited before the cluster was up (exit code {proc.poll()}); "
            f"its log: {log or '(none)'}. Last lines: {' | '.join(tail) or '(none)'}"
        )
    message = json.loads(line)
    if not message.get("ok"):
        proc.wait(10)
        raise ClusterFailed(f"the cluster did not start: {message.get('error')}")
    _reap_children()
    _children.append(proc)
    return message["entry"]


#: Dask config sections a supervisor gets from the process that asks it for a cluster.
_FORWARDED_CONFIG = ("nbcluster", "jobqueue", "gateway", "kubernetes")


def _tear_down(proc: subprocess.Popen[bytes]) -> None:
    """Stop a supervisor and its workers: SIGTERM (it exits within 2 s), then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(3)
    # It runs in a session of its own (see `_launch`), so its process group is it and its
    # workers: anything still there after the grace period is killed with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_line(fd: int, timeout: float) -> str:
    """The supervisor's one-line report; '' if it exited first; TimeoutError if too slow."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return ""
            data += chunk
    return data.decode()
