"""The supervisor: one process per cluster, owning its scheduler and workers.

Launched as ``python -m nbcluster.cluster --ready-fd FD --log PATH`` (``cluster/__main__.py``)
by `nbcluster.start` (or ahead of time by `prewarm`), which then sends one JSON request on its
stdin: the spec, the runtime dir, the owner pid and the environment. Nobody else starts it.
Its first act is to start the forkserver that its local workers will be forked from
(`forkserver.py`, loading the workers' modules meanwhile); while it waits for the request it
imports what a start will need (`import_ahead`), so a spare taken by `start` pays none of it.

What it owns
    - the cluster's name, claimed with an ``O_EXCL`` registry entry (`registry.claim`);
    - its TLS credentials: a fresh self-signed certificate and key, written 0600 next to the
      entry (`credentials.py`). The scheduler and workers require a client certificate signed by that CA, so
      only holders of the files can connect (a gateway brings its own, see `deploy.py`);
    - the Dask deployment object of the cluster's profile (`deploy.Deployment`): the local
      backend's `NbSpecCluster` (`speccluster.py`), a dask-jobqueue cluster, an `SSHCluster`, a
      `GatewayCluster` or a `KubeCluster`;
    - for the local backend, the forkserver its nannies fork the worker processes from,
      started with exactly the environment a spawned worker would get (`forkserver.py`; a
      child in its process group, so every way it ends takes that too);
    - the control handlers (`Control`: info/scale/adapt/restart/stop), installed on the
      scheduler as `ControlPlugin` where it runs in this process (local, jobqueue), else
      served on a TLS `distributed.core.Server` of this process (``control`` in the entry);
      and the metrics plugin, on the scheduler here or registered through a client there.

State
    `_Supervision` holds it: ``deployment``, ``stop`` (an asyncio.Event set by
    `nbcluster_stop`, or by the `Lifeline` on a signal or the owner's death), the control
    server if any, and the registry entry, whose ``state`` goes ``starting`` -> ``running``
    -> ``stopping`` and which is deleted on the way out.

Lifecycle
    0. from launch on, SIGTERM/SIGINT/SIGHUP and the owner's death go to the `Lifeline`
       (``lifeline.py``): in every phase, busy or not, the process is gone within 2 s and
       takes its workers with it;
    1. check the size (and ``--dashboard``) against `limits` (again: a request that
       bypassed `start` gets no further; the site config's ceilings are read from its files
       here, so the requester's forwarded config cannot raise them), claim a name
       (``local``, ``local-2``, ... for the default), write the credentials;
    2. start the deployment (the local backend: its scheduler, then the control handlers
       and the metrics plugin, then its workers), rewrite the entry with the address (and
       ``control``, ``backend``, ``profile``);
    3. write one JSON line ({"ok": true, "entry": ...} or {"ok": false, "error": ...}) to
       the ready pipe: `nbcluster.start` blocks on that line, so there is no polling. (Where
       the scheduler runs here and starts before its workers, the local backend, a line
       {"scheduler": {"address": ..., "tls": ...}} comes first, so that the requester's
       client connects while the workers start; the ready line may still say the start
       failed.) If it is not there within ``nbcluster.timeouts.start``, the requester tears this
       process down (SIGTERM, then SIGKILL of its process group). Stdout and stderr, which
       the workers inherit, go to ``.start-<id>.log``; on success it becomes ``<name>.log``,
       on failure it is kept as ``failed-start-*.log`` (see ``startlog.py``);
    4. wait for ``stop``; the owner watch sets it within a second of the owner process
       dying (also on ``kill -9``), unless the cluster was started with ``--keep`` (no
       owner);
    5. close the deployment, delete the entry and credentials. Local nannies kill their
       workers; other backends end theirs their own way (``scancel``, the gateway's
       shutdown, retiring SSH workers), and a worker out of reach (its host cut off) ends
       through its death timeout once it cannot reach the scheduler (its nanny too: remote_watch.py).

Worked example: a kernel (pid 4242) runs ``%cluster start --workers 2``. The supervisor
claims ``local.json`` with ``{"state": "starting", "supervisor_pid": ...}``, starts
``cpu-0`` and ``cpu-1``, rewrites the entry with ``address: tls://127.0.0.1:40123`` and
``owner_pid: 4242``, and prints the entry. The kernel is killed; within a second the owner
watch sets ``stop``; the workers are closed and ``local.json`` is gone.

What it leaves out: it never runs user code, has no HTTP server of its own (Dask's
scheduler has one, the dashboard only with ``--dashboard``: on loopback, and only for
holders of the cluster's certificate, see ``private_http.py``), and keeps no state that
the scheduler or the registry can answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import dask.config
import psutil
from distributed.core import Server
from distributed.diagnostics.plugin import SchedulerPlugin

from nbcluster import _compat, config
from nbcluster._wire import ClusterState, RegistryEntry, Snapshot, TaskCounts, WorkerRow
from nbcluster.cluster import deploy, forkserver, gpu, profiles, registry, startlog
from nbcluster.cluster.adaptive import backlogs
from nbcluster.cluster.credentials import load_cryptography, write_credentials
from nbcluster.cluster.info import identity_rows, worker_row
from nbcluster.cluster.lifeline import GRACE_S, Lifeline, kill_descendants
from nbcluster.cluster.private_http import PROXY_ROUTE
from nbcluster.cluster.spec import DEFAULT_NAME, ClusterSpec, parse_count
from nbcluster.cluster.streams import SchedulerStreams
from nbcluster.errors import NbclusterError
from nbcluster.metrics.basic import basic_snapshot


def _host_memory(hosts: set[Any]) -> dict[str, int]:
    """The RAM of the hosts among `hosts` that are this machine (what psutil can see)."""
    import socket

    import psutil

    own = {"localhost", socket.gethostname()}
    for addrs in psutil.net_if_addrs().values():
        own.update(a.address for a in addrs)
    total = psutil.virtual_memory().total
    return {str(h): total for h in hosts if h in own}


class Control:
    """The `nbcluster_*` RPC handlers that every front end uses, over one `Deployment`.

    Served by the scheduler (as `ControlPlugin`) where it runs in this process, else by
    this process's own control server (see `deploy.py`).
    """

    def __init__(self, deployment: deploy.Deployment, entry: RegistryEntry, stop: asyncio.Event):
        self.deployment = deployment
        self.entry = entry
        self.stop_event = stop

    def handlers(self) -> dict[str, Any]:
        """The scheduler RPC handlers that control the cluster (``nbcluster_info``, ...).

        Returns
        -------
        dict
            Handler name to coroutine or function.
        """
        handlers = {
            "nbcluster_info": self.info,
            "nbcluster_scale": self.scale,
            "nbcluster_adapt": self.adapt,
            "nbcluster_restart": self.restart,
            "nbcluster_stop": self.stop,
        }
        if self.deployment.scheduler is None:
            handlers["nbcluster_metrics"] = self.metrics
        else:
            handlers["nbcluster_backlog"] = self.backlog
        return handlers

    def backlog(self, run: str, kind: str, items: int, seconds: float, busy: list[str] | None = None) -> None:
        """``nbcluster_backlog``: a `%%distribute` run's work held back in its kernel, and the
        workers running its direct batches, for the adaptive targets (`adaptive.Backlogs.report`).

        Parameters
        ----------
        run, kind, items, seconds, busy
            As `adaptive.Backlogs.report` takes them.
        """
        workers = [str(w) for w in busy or ()]
        backlogs(self.deployment.scheduler).report(str(run), str(kind), int(items), float(seconds), workers)

    async def info(self) -> ClusterState:
        """``nbcluster_info``: what ``%cluster status`` shows.

        Returns
        -------
        ClusterState
            The entry's fields, the workers, tasks, clients, adaptive bounds.
        """
        d, e = self.deployment, self.entry
        workers, tasks = self._local_state() if d.scheduler is not None else await self._remote_state()
        workers.sort(key=lambda w: (w["kind"], w["name"]))
        state: ClusterState = {
            "name": e["name"], "address": e["address"], "dashboard": e.get("dashboard"), "owner_pid": e["owner_pid"],
            "created": e["created"], "spec": e["spec"], "backend": e["backend"], "profile": e["profile"],
            "supervisor_pid": os.getpid(),
            "workers": workers,
            "requested": d.requested_by_kind(),
            "adaptive": d.adaptive_bounds,
            "tasks": tasks,
            "clients": self._clients(),
            "host_memory": _host_memory({w["host"] for w in workers}),
        }  # fmt: skip
        if d.notice:
            state["notice"] = d.notice
        return state

    def _clients(self) -> int | None:
        """Dask clients on the scheduler (kernels using the cluster), where it runs here."""
        s = self.deployment.scheduler
        return None if s is None else sum(1 for c in s.clients if c != "fire-and-forget")

    def _local_state(self) -> tuple[list[WorkerRow], TaskCounts]:
        s, d = self.deployment.scheduler, self.deployment
        workers = [
            worker_row(
                name=ws.name,
                address=ws.address,
                host=ws.host,
                nthreads=ws.nthreads,
                memory_limit=ws.memory_limit,
                memory=ws.metrics.get("memory", 0),
                cpu=ws.metrics.get("cpu", 0.0),
                resources=ws.resources,
                processing=len(ws.processing),
                gpu=d.gpu(str(ws.name)),
                job_id=d.job_id(str(ws.name)),
            )
            for ws in s.workers.values()
        ]
        states: dict[str, int] = {}
        for ts in s.tasks.values():
            states[ts.state] = states.get(ts.state, 0) + 1
        return workers, {
            "processing": states.get("processing", 0),
            "waiting": states.get("waiting", 0) + states.get("queued", 0) + states.get("no-worker", 0),
            "memory": states.get("memory", 0),
            "erred": states.get("erred", 0),
        }

    async def _remote_state(self) -> tuple[list[WorkerRow], TaskCounts]:
        # The scheduler's task table is not ours to walk from here: workers only.
        return identity_rows(await self.deployment.scheduler_identity()), {}

    async def scale(self, n: int, kind: str = "cpu", force: bool = False) -> dict[str, Any]:
        """``nbcluster_scale``: scale one kind of worker, within the limits.

        Parameters
        ----------
        n : int
            Workers of `kind` wanted.
        kind : str
            ``cpu`` or ``gpu``.
        force : bool
            Lift the machine-derived limits.

        Returns
        -------
        dict
            ``{"requested": {"cpu": ..., "gpu": ...}}``.

        Raises
        ------
        BadArgument
            For a bad count or kind.
        LimitExceeded
            Past a limit.
        """
        n = parse_count(n, "the number of workers")
        d = self.deployment
        d.check_kind(kind)
        # The limits hold here as well as in the caller: a direct RPC gets no further.
        requested = d.requested_by_kind()
        cpu, gpu = (n, requested["gpu"]) if kind == "cpu" else (requested["cpu"], n)
        self.spec.check_size(f"scale {n}", cpu, gpu, force=force)
        await d.scale(n, kind)
        return {"requested": d.requested_by_kind()}

    async def adapt(self, minimum: int, maximum: int, force: bool = False) -> dict[str, Any]:
        """``nbcluster_adapt``: adapt CPU workers between the bounds, within the limits.

        Parameters
        ----------
        minimum, maximum : int
            ``--min`` and ``--max``.
        force : bool
            Lift the machine-derived limits.

        Returns
        -------
        dict
            ``{"adaptive": bounds}``.

        Raises
        ------
        BadArgument
            For bad bounds.
        LimitExceeded
            When ``--max`` is past a limit.
        """
        hi = parse_count(maximum, "--max")
        gpus = getattr(self.deployment, "gpu_count", 0)
        self.spec.check_size(f"adapt --max {hi}", hi, gpus, force=force)
        self.deployment.adapt(minimum, maximum)
        return {"adaptive": self.deployment.adaptive_bounds}

    @property
    def spec(self) -> ClusterSpec:
        """The cluster's start request."""
        return self.deployment.spec

    async def restart(self, timeout: float = 60) -> str:
        """``nbcluster_restart``: fresh worker processes, and wait until they registered.

        Parameters
        ----------
        timeout : float
            Seconds for the restart and the workers to come back.

        Returns
        -------
        str
            ``"restarted"``.
        """
        before = await self._worker_count()
        if self.deployment.scheduler is None:
            await self.deployment.restart()
        else:
            # Not Dask's wait_for_workers: adaptivity may legitimately retire some meanwhile,
            # and that would fail the restart.
            await self.deployment.scheduler.restart(
                timeout=timeout, wait_for_workers=False, stimulus_id=f"nbcluster-restart-{time.time()}"
            )
        # The restart returns once the new worker processes run, before they have registered:
        # wait for them, or the status printed after a restart shows 0 workers.
        deadline = time.monotonic() + timeout
        while self.deployment.adaptive_bounds is None and time.monotonic() < deadline:
            if await self._worker_count() >= before:
                break
            await asyncio.sleep(0.1)
        return "restarted"

    async def _worker_count(self) -> int:
        if self.deployment.scheduler is None:
            return len((await self.deployment.scheduler_identity()).get("workers", {}))
        return len(self.deployment.scheduler.workers)

    async def metrics(self, since: int | None = None, detail: int | None = None) -> Snapshot:
        """``nbcluster_metrics`` for a cluster whose scheduler runs elsewhere (a batch system's).

        Parameters
        ----------
        since, detail : int, optional
            As `MetricsPlugin.nbcluster_metrics` takes them.

        Returns
        -------
        Snapshot
            The scheduler's plugin's answer, or the basic view where it has none.
        """
        # The scheduler is elsewhere: its metrics plugin answers, through our client, or
        # where it refused the plugin, the scheduler's own view of the workers.
        if not self.entry.get("metrics"):
            return basic_snapshot(await self.deployment.scheduler_identity(), since)
        return await self.deployment.scheduler_metrics(since, detail)

    async def stop(self) -> str:
        """``nbcluster_stop``: stop the cluster (the supervisor closes it, then exits).

        Returns
        -------
        str
            ``"stopping"``.
        """
        self.stop_event.set()
        return "stopping"


class ControlPlugin(SchedulerPlugin):
    """Installs `Control`'s handlers on a scheduler running in this process."""

    name = "nbcluster-control"

    def __init__(self, control: Control):
        self.control = control
        # The metrics plugin reads `cluster.devices` here to label simulated GPUs.
        self.cluster = getattr(control.deployment, "cluster", None)

    async def start(self, scheduler: Any) -> None:
        """Dask's plugin hook: serve `Control`'s handlers on the scheduler.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The cluster's scheduler.
        """
        scheduler.handlers.update(self.control.handlers())


async def _plug_in(scheduler: Any, control: Control) -> None:
    """Install nbcluster's scheduler plugins on a scheduler running in this process."""
    from nbcluster.metrics.plugin import MetricsPlugin

    for plugin in (ControlPlugin(control), SchedulerStreams(), MetricsPlugin()):
        # add_plugin on a running scheduler does not call start(); we must.
        scheduler.add_plugin(plugin)
        await plugin.start(scheduler)


def _claim_name(directory: Path, spec: ClusterSpec, entry: RegistryEntry) -> str:
    if spec.name:
        if registry.claim(directory, spec.name, {**entry, "name": spec.name}):
            return spec.name
        raise NbclusterError(
            f"a cluster named {spec.name!r} is already running: `%cluster use {spec.name}` "
            "to use it, or pick another --name"
        )
    # Named after the profile (``hpc``, ``hpc-2``, ...), so a list tells where each runs.
    base = spec.profile if spec.profile != "local" else DEFAULT_NAME
    for i in range(1, 1000):
        name = base if i == 1 else f"{base}-{i}"
        if registry.claim(directory, name, {**entry, "name": name}):
            return name
    raise NbclusterError("no free cluster name: stop some clusters (`nbcluster list`)")


class _Reporter:
    """Writes the one ready line to the pipe `nbcluster.start` waits on, then closes it.

    A separate pipe, not stdout: worker processes inherit stdout and stderr (the log file),
    and must never write into a pipe that nobody reads any more.
    """

    def __init__(self, fd: int):
        self.fd: int | None = fd

    def scheduler_up(self, scheduler: dict[str, Any]) -> None:
        """Say where the scheduler listens, before the one ready line (it may not come).

        Parameters
        ----------
        scheduler : dict
            ``address`` and ``tls`` (the credential files), as the entry will have them.
        """
        assert self.fd is not None, "reported after the ready line"
        os.write(self.fd, (json.dumps({"scheduler": scheduler}) + "\n").encode())

    def __call__(self, message: dict[str, Any]) -> None:
        assert self.fd is not None, "reported twice"
        os.write(self.fd, (json.dumps(message) + "\n").encode())
        os.close(self.fd)
        self.fd = None


class _Supervision:
    """One supervisor's run, in the order of the lifecycle above: `claim`, `start`, `serve`
    (or `fail`). It holds the state the steps share: the entry, the stop event, the
    deployment and, for a remote scheduler, the control server."""

    def __init__(self, spec: ClusterSpec, directory: Path, owner_pid: int | None, report: _Reporter,
                 log: Path, lifeline: Lifeline):  # fmt: skip
        self.spec, self.directory, self.report, self.log, self.lifeline = (
            spec,
            directory,
            report,
            log,
            lifeline,
        )
        me = psutil.Process()
        self.entry: RegistryEntry = {
            "name": "",  # until `claim` (which writes the entry) has one
            "external": False,
            "state": "starting",
            "supervisor_pid": me.pid,
            "supervisor_started": me.create_time(),
            "owner_pid": owner_pid,
            "started_by": os.getppid(),
            "owner_started": psutil.Process(owner_pid).create_time() if owner_pid else None,
            "created": time.time(),
            "spec": spec.to_dict(),
            "backend": spec.backend,
            "profile": spec.profile,
        }
        self.stop = asyncio.Event()
        self.name = ""
        self.deployment: deploy.Deployment | None = None
        self.control_server: Server | None = None

    def watch(self) -> None:
        """From now on a signal or the owner's death stops this run: gracefully once running,
        by cutting the start short before that."""
        main_task = asyncio.current_task()
        assert main_task is not None

        def on_stop() -> None:
            self.stop.set()
            if self.entry["state"] == "starting":
                main_task.cancel()

        self.lifeline.attach(asyncio.get_running_loop(), on_stop)
        if self.entry["owner_pid"]:
            self.lifeline.watch_owner(self.entry["owner_pid"], self.entry["owner_started"])

    def claim(self, force: bool) -> bool:
        try:
            # Checked here too, so a request that did not come through `start` cannot bypass it.
            self.spec.check_limits(force=force)
            self.name = _claim_name(self.directory, self.spec, self.entry)
        except NbclusterError as e:
            # A mistake the message fully explains (or the name is taken): no log worth keeping.
            self.log.unlink(missing_ok=True)
            self.report({"ok": False, "error": str(e)})
            return False
        self.entry["name"] = self.name
        self.lifeline.claimed(self.directory, self.name)
        return True

    async def start(self) -> None:
        security, tls = write_credentials(self.directory, self.name)
        self.entry["tls"] = tls
        profile = profiles.get(self.spec.profile)
        devices = gpu.select(self.spec.gpus, gpu.discover(), self.spec.gpus_per_worker) if profile.local else []
        # For every nanny this process will make (scale-ups later too): this process
        # exists for this one cluster, so the setting is global here.
        config.drop_copied_dask_environ(os.environ)
        dask.config.set({"distributed.nanny.pre-spawn-environ": config.worker_pre_spawn_environ()})
        # Its nannies fork their workers from the forkserver, if it still fits (forkserver.py).
        if profile.local:
            forkserver.use()
        else:
            forkserver.stop()
        _compat.quick_worker_handshake()
        self.deployment = d = deploy.make(
            self.spec, profile, directory=self.directory, name=self.name, devices=devices,
            security=security, tls=tls,
        )  # fmt: skip
        control = Control(d, self.entry, self.stop)
        await d.start_scheduler()
        early = d.scheduler is not None
        if early:
            # Up before its workers (the local backend): the requester's client connects
            # while they start, instead of after.
            await _plug_in(d.scheduler, control)
            self.report.scheduler_up({"address": d.address, "tls": tls})
        await d.start()
        if d.scheduler is not None:
            if not early:  # a scheduler that came up with its workers (dask-jobqueue's)
                await _plug_in(d.scheduler, control)
        else:
            self.control_server = await deploy.serve_control(control.handlers(), security)
            self.entry["control"] = self.control_server.address
            # The scheduler's credentials, where the backend brings its own (a gateway).
            self.entry["tls"] = getattr(d, "tls", None) or tls
            self.entry["control_tls"] = tls
            self.entry["metrics"] = await _register_metrics(d)
        self.entry.update(
            {"state": "running", "address": d.address, "dashboard": d.dashboard, "gpus": [x.to_dict() for x in devices]}
        )
        registry.update(self.directory, self.name, self.entry)
        with contextlib.suppress(OSError):  # no failure to keep: it is the cluster's log now
            self.log.rename(self.directory / f"{self.name}.log")
        self.report({"ok": True, "entry": self.entry})

    async def fail(self, e: BaseException) -> None:
        """Undo a start that did not finish, and say why in one line."""
        if isinstance(e, asyncio.CancelledError):
            message = f"stopped during start-up ({self.lifeline.reason or 'cancelled'})"
        elif isinstance(e, NbclusterError):
            message = str(e)
        else:
            message = _one_line(e)
            if self.spec.backend != "local":
                message = f"the {self.spec.backend} backend could not start the cluster: {message}"
            traceback.print_exc()
        await self._close(unhurried=10)
        kill_descendants()  # whatever the close did not finish: no worker outlives a failed start
        registry.remove(self.directory, self.name)
        kept = startlog.keep_failed(self.log) if self.entry["state"] == "starting" else None
        with contextlib.suppress(OSError, AssertionError):  # the requester may be gone
            self.report({"ok": False, "error": f"{message}; its log: {kept or '(none)'}"})

    async def serve(self) -> None:
        """Run until stopped, then remove everything this cluster started."""
        try:
            await self.stop.wait()
        finally:
            # The entry goes first: from now on nobody should hand this cluster new work.
            registry.update(self.directory, self.name, {**self.entry, "state": "stopping"})
            await self._close(unhurried=20)
            registry.remove(self.directory, self.name)

    async def _close(self, unhurried: float) -> None:
        # A signal or a dead owner leaves GRACE_S before the lifeline's watchdog ends the
        # process anyway: the close takes less, so it, not the watchdog, usually ends it. An
        # explicit stop may take `unhurried` seconds.
        budget = GRACE_S * 0.8 if self.lifeline.reason else unhurried
        if self.control_server is not None:
            self.control_server.stop()
        if self.deployment is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.deployment.close(timeout=min(budget, 10)), budget)


def _one_line(e: BaseException) -> str:
    """An unexpected error as one line: the cause at the bottom of the chain (the backends
    wrap theirs: "Cluster failed to start: ..."), its type and first line; the log has the rest."""
    while e.__cause__ is not None and not isinstance(e, TimeoutError):  # asyncio's is "from" a CancelledError
        e = e.__cause__
    if isinstance(e, TimeoutError):
        return f"no answer within {config.seconds('timeouts.connect'):g} s (nbcluster.timeouts.connect)"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


async def _register_metrics(d: deploy.Deployment) -> bool:
    """The metrics plugin on a scheduler elsewhere, through a client, where it accepts it
    (it must be able to import nbcluster); False leaves the basic status view."""
    from nbcluster.metrics.plugin import MetricsPlugin

    client = getattr(d, "client", None)
    if client is None:
        return False
    try:
        await client.register_plugin(MetricsPlugin())
    except Exception as e:
        print(
            f"metrics plugin not registered on the scheduler ({_one_line(e)}); status only", file=sys.stderr
        )
        return False
    return True


async def run(
    spec: ClusterSpec,
    directory: Path,
    owner_pid: int | None,
    report: _Reporter,
    log: Path,
    *,
    lifeline: Lifeline,
    force: bool = False,
) -> int:
    """Claim a name, start the cluster, report, then serve it until stopped (see the module
    docstring for each step).

    Parameters
    ----------
    spec : ClusterSpec
        The checked start request.
    directory : Path
        The registry folder.
    owner_pid : int or None
        The process whose exit stops the cluster; None keeps it.
    report : callable
        Sends the one ready (or failure) line to the process that launched us.
    log : Path
        This supervisor's start log.
    lifeline : Lifeline
        How the process ends on a signal or its owner's exit.
    force : bool
        Lift the machine-derived limits.

    Returns
    -------
    int
        The exit status: 0 for a cluster that ran.
    """
    run = _Supervision(spec, directory, owner_pid, report, log, lifeline)
    run.watch()
    if not run.claim(force):
        return 1
    try:
        await run.start()
    except (Exception, asyncio.CancelledError) as e:
        await run.fail(e)
        return 1
    await run.serve()
    return 0


def import_ahead() -> None:
    """Import what starting a local cluster imports, before the request comes.

    A spare supervisor waits for its request (`launcher.prewarm`): what it imports then, a
    start does not pay (the certificate's `cryptography`, the scheduler's HTTP routes, the
    nannies' multiprocessing pieces: about 0.1 s). A
    supervisor launched for a request at once (no spare) would load the same a moment later.
    """
    import importlib
    import multiprocessing.synchronize  # noqa: F401  (a nanny's process start)

    import distributed.diagnostics.websocket  # noqa: F401  (the scheduler's plugins)

    load_cryptography()
    # Else the scheduler's first accepted connection loads the system's CA store for nothing.
    _compat.accepted_tls_streams_keep_their_context()
    for module in dask.config.get("distributed.scheduler.http.routes"):
        if module != PROXY_ROUTE:  # the local backend serves none (private_http.py)
            # A route that cannot be imported fails the start that needs it, with Dask's error.
            with contextlib.suppress(ImportError):
                importlib.import_module(module)


def main(argv: list[str] | None = None) -> int:
    """``python -m nbcluster.cluster``: read one start request on stdin and run it.

    Parameters
    ----------
    argv : list of str, optional
        ``--ready-fd FD --log PATH [--no-forkserver]`` (default: `sys.argv`; the last is
        ``cluster/__main__.py``'s, read before this runs).

    Returns
    -------
    int
        The exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m nbcluster.cluster")
    parser.add_argument("--ready-fd", type=int, required=True, help="pipe for the one ready line")
    parser.add_argument("--log", type=Path, required=True, help="this process's stdout/stderr file")
    parser.add_argument(
        "--no-forkserver", action="store_true", help="start no forkserver ahead (the workers run elsewhere)"
    )
    args = parser.parse_args(argv)
    os.set_inheritable(args.ready_fd, False)
    lifeline = Lifeline(args.log)
    lifeline.install_signals()  # from the first moment: a spare is stopped with SIGTERM too
    # The request comes on stdin, so a supervisor can be launched ahead of time (its
    # imports are most of a start-up) and told what to start later. EOF means the process
    # that launched us is gone before asking: nothing to do.
    import_ahead()
    # Loaded: the collector, off meanwhile (nbcluster/__init__.py), need never scan those objects.
    gc.freeze()
    gc.enable()
    line = sys.stdin.readline()
    if not line:
        args.log.unlink(missing_ok=True)
        return 0
    request = json.loads(line)
    # The requester's environment as it is now, not as it was when we were launched.
    os.environ.clear()
    os.environ.update(request["env"])
    # Dask's config as the requester sees it: its DASK_* variables, its DASK_CONFIG folder,
    # and its nbcluster settings (which include any `dask.config.set` made there).
    folder = os.environ.get("DASK_CONFIG")
    if folder and folder not in dask.config.paths:
        dask.config.paths.append(folder)
    dask.config.refresh()
    dask.config.update(dask.config.config, request.get("config") or {}, priority="new")
    spec = ClusterSpec.from_dict(request["spec"])
    directory = registry.runtime_dir(request["runtime_dir"])
    try:
        return asyncio.run(
            run(
                spec, directory, request.get("owner"), _Reporter(args.ready_fd), args.log,
                lifeline=lifeline, force=bool(request.get("force")),
            )
        )  # fmt: skip
    finally:
        lifeline.done()


if __name__ == "__main__":
    sys.exit(main())
