"""The supervisor: one process per cluster, owning its scheduler and workers.

Launched as ``python -m nbcluster.cluster.supervisor --ready-fd FD --log PATH`` by
`nbcluster.start` (or ahead of time by `prewarm`), which then sends one JSON request on its
stdin: the spec, the runtime dir, the owner pid and the environment. Nobody else starts it.

What it owns
    - the cluster's name, claimed with an ``O_EXCL`` registry entry (`registry.claim`);
    - its TLS credentials: a fresh self-signed certificate and key, written 0600 next to the
      entry. The scheduler and workers listen on ``tls://127.0.0.1`` and require a client
      certificate signed by that CA, so only holders of the files can connect;
    - the Dask deployment object (a `SpecCluster`, see `backends.py`) with the scheduler
      running in this process and each worker in its own nanny-managed process;
    - nbcluster's scheduler plugins: `ControlPlugin` (scale/adapt/restart/stop/info RPC
      handlers, below) and, when available, the metrics plugin.

State
    ``cluster`` (the SpecCluster), ``stop`` (an asyncio.Event set by `nbcluster_stop`, or by
    the `Lifeline` on a signal or the owner's death), and the registry entry, whose
    ``state`` goes ``starting`` -> ``running`` -> ``stopping`` and which is deleted on the
    way out.

Lifecycle
    0. from launch on, SIGTERM/SIGINT/SIGHUP and the owner's death go to the `Lifeline`
       (``lifeline.py``): in every phase, busy or not, the process is gone within 2 s and
       takes its workers with it;
    1. check the size against `limits` (again: a request that bypassed `start` gets no
       further), claim a name (``local``, ``local-2``, ... for the default), write the
       credentials;
    2. start the SpecCluster, add the plugins, rewrite the entry with the address;
    3. write one JSON line ({"ok": true, "entry": ...} or {"ok": false, "error": ...}) to
       the ready pipe: `nbcluster.start` blocks on that line, so there is no polling. If
       it is not there within ``nbcluster.timeouts.start``, the requester tears this
       process down (SIGTERM, then SIGKILL of its process group). Stdout and stderr, which
       the workers inherit, go to ``.start-<id>.log``; on success it becomes ``<name>.log``,
       on failure it is kept as ``failed-start-*.log`` (see ``startlog.py``);
    4. wait for ``stop``; the owner watch sets it within a second of the owner process
       dying (also on ``kill -9``), unless the cluster was started with ``--keep`` (no
       owner);
    5. close the cluster (nannies kill their workers), delete the entry and credentials.

Worked example: a kernel (pid 4242) runs ``%cluster start --workers 2``. The supervisor
claims ``local.json`` with ``{"state": "starting", "supervisor_pid": ...}``, starts
``cpu-0`` and ``cpu-1``, rewrites the entry with ``address: tls://127.0.0.1:40123`` and
``owner_pid: 4242``, and prints the entry. The kernel is killed; within a second the owner
watch sets ``stop``; the workers are closed and ``local.json`` is gone.

What it leaves out: it never runs user code, has no HTTP server of its own (the Dask
dashboard only with ``--dashboard``, on loopback), and keeps no state that the scheduler
or the registry can answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import dask.config
import psutil
from distributed.diagnostics.plugin import SchedulerPlugin

from nbcluster import config
from nbcluster.cluster import backends, gpu, registry, startlog
from nbcluster.cluster.kinds import worker_kind
from nbcluster.cluster.lifeline import GRACE_S, Lifeline, kill_descendants
from nbcluster.cluster.spec import ClusterSpec, parse_count
from nbcluster.errors import NbclusterError


class ControlPlugin(SchedulerPlugin):
    """The `nbcluster_*` scheduler RPC handlers that every front end uses."""

    name = "nbcluster-control"

    def __init__(self, cluster: backends.NbSpecCluster, entry: dict[str, Any], stop: asyncio.Event):
        self.cluster = cluster
        self.entry = entry
        self.stop_event = stop

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update(
            nbcluster_info=self.info,
            nbcluster_scale=self.scale,
            nbcluster_adapt=self.adapt,
            nbcluster_restart=self.restart,
            nbcluster_stop=self.stop,
        )

    def info(self) -> dict[str, Any]:
        s = self.scheduler
        devices = self.cluster.devices
        workers = []
        for ws in s.workers.values():
            device = devices.get(ws.name)
            workers.append(
                {
                    "name": str(ws.name),
                    "address": ws.address,
                    "kind": worker_kind(ws.resources),
                    "nthreads": ws.nthreads,
                    "memory_limit": ws.memory_limit,
                    "memory": ws.metrics.get("memory", 0),
                    "cpu": ws.metrics.get("cpu", 0.0),
                    "resources": dict(ws.resources or {}),
                    "processing": len(ws.processing),
                    "gpu": device.to_dict() if device else None,
                }
            )
        workers.sort(key=lambda w: (w["kind"], w["name"]))
        states: dict[str, int] = {}
        for ts in s.tasks.values():
            states[ts.state] = states.get(ts.state, 0) + 1
        adaptive = self.cluster.adaptive_bounds
        return {
            **{k: self.entry.get(k) for k in ("name", "address", "dashboard", "owner_pid", "created", "spec")},
            "supervisor_pid": os.getpid(),
            "workers": workers,
            "requested": self.cluster.requested_by_kind(),
            "adaptive": adaptive,
            "tasks": {
                "processing": states.get("processing", 0),
                "waiting": states.get("waiting", 0) + states.get("queued", 0) + states.get("no-worker", 0),
                "memory": states.get("memory", 0),
                "erred": states.get("erred", 0),
            },
        }

    async def scale(self, n: int, kind: str = "cpu", force: bool = False) -> dict[str, Any]:
        n = parse_count(n, "the number of workers")
        # The limits hold here as well as in the caller: a direct RPC gets no further.
        counts = {**self.cluster.requested_by_kind(), kind: n}
        self.cluster.nb_spec.check_size(f"scale {n}", counts.get("cpu", 0), counts.get("gpu", 0), force=force)
        await self.cluster.scale_kind(n, kind)
        return {"requested": self.cluster.requested_by_kind()}

    async def adapt(self, minimum: int, maximum: int, force: bool = False) -> dict[str, Any]:
        hi = parse_count(maximum, "--max")
        self.cluster.nb_spec.check_size(f"adapt --max {hi}", hi, len(self.cluster.all_devices), force=force)
        self.cluster.adapt_bounded(minimum, maximum)
        return {"adaptive": self.cluster.adaptive_bounds}

    async def restart(self, timeout: float = 60) -> str:
        # Not waiting for "as many workers as before": adaptivity may legitimately retire
        # some meanwhile. Each nanny still returns only once its new worker process is up.
        await self.scheduler.restart(
            timeout=timeout, wait_for_workers=False, stimulus_id=f"nbcluster-restart-{time.time()}"
        )
        return "restarted"

    async def stop(self) -> str:
        self.stop_event.set()
        return "stopping"


def _load_metrics_plugin() -> SchedulerPlugin | None:
    # The metrics plugin is optional here so a broken or missing one never stops a cluster
    # from starting; the live graphs just stay empty.
    try:
        from nbcluster.metrics.plugin import MetricsPlugin
    except ImportError:
        return None
    return MetricsPlugin()


def _claim_name(directory: Path, spec: ClusterSpec, entry: dict[str, Any]) -> str:
    if spec.name:
        if registry.claim(directory, spec.name, {**entry, "name": spec.name}):
            return spec.name
        raise NbclusterError(
            f"a cluster named {spec.name!r} is already running: `%cluster use {spec.name}` "
            "to use it, or pick another --name"
        )
    for i in range(1, 1000):
        name = spec_default_name(i)
        if registry.claim(directory, name, {**entry, "name": name}):
            return name
    raise NbclusterError("no free cluster name: stop some clusters (`nbcluster list`)")


def spec_default_name(i: int) -> str:
    from nbcluster.cluster.spec import DEFAULT_NAME

    return DEFAULT_NAME if i == 1 else f"{DEFAULT_NAME}-{i}"


class _Reporter:
    """Writes the one ready line to the pipe `nbcluster.start` waits on, then closes it.

    A separate pipe, not stdout: worker processes inherit stdout and stderr (the log file),
    and must never write into a pipe that nobody reads any more.
    """

    def __init__(self, fd: int):
        self.fd: int | None = fd

    def __call__(self, message: dict[str, Any]) -> None:
        assert self.fd is not None, "reported twice"
        os.write(self.fd, (json.dumps(message) + "\n").encode())
        os.close(self.fd)
        self.fd = None


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
    me = psutil.Process()
    owner_started = psutil.Process(owner_pid).create_time() if owner_pid else None
    entry: dict[str, Any] = {
        "state": "starting",
        "supervisor_pid": me.pid,
        "supervisor_started": me.create_time(),
        "owner_pid": owner_pid,
        "started_by": os.getppid(),
        "owner_started": owner_started,
        "created": time.time(),
        "spec": spec.to_dict(),
    }
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None

    def on_stop() -> None:
        # Running: stop.set() is the graceful path. Starting: cut the start short.
        stop.set()
        if entry["state"] == "starting":
            main_task.cancel()

    lifeline.attach(asyncio.get_running_loop(), on_stop)
    if owner_pid:
        lifeline.watch_owner(owner_pid, owner_started)
    try:
        # Checked here too, so a request that did not come through `start` cannot bypass it.
        spec.check_limits(force=force)
        name = _claim_name(directory, spec, entry)
    except NbclusterError as e:
        # A mistake the message fully explains (or the name is taken): no log worth keeping.
        log.unlink(missing_ok=True)
        report({"ok": False, "error": str(e)})
        return 1
    entry["name"] = name
    lifeline.claimed(directory, name)
    cluster = None
    try:
        security, tls = backends.write_credentials(directory, name)
        entry["tls"] = tls
        devices = gpu.select(spec.gpus, gpu.discover())
        # For every nanny this process will make (scale-ups later too): this process
        # exists for this one cluster, so the setting is global here.
        dask.config.set({"distributed.nanny.pre-spawn-environ": config.worker_pre_spawn_environ()})
        cluster = backends.local_cluster(spec, devices, security)
        await cluster
        for plugin in (ControlPlugin(cluster, entry, stop), _load_metrics_plugin()):
            if plugin is not None:
                # add_plugin on a running scheduler does not call start(); we must.
                cluster.scheduler.add_plugin(plugin)
                await plugin.start(cluster.scheduler)
        entry.update(
            state="running",
            address=cluster.scheduler_address,
            dashboard=backends.dashboard_url(cluster) if spec.dashboard else None,
            gpus=[d.to_dict() for d in devices],
        )
        registry.update(directory, name, entry)
        with contextlib.suppress(OSError):  # no failure to keep: it is the cluster's log now
            log.rename(directory / f"{name}.log")
        report({"ok": True, "entry": entry})
    except (Exception, asyncio.CancelledError) as e:
        if isinstance(e, asyncio.CancelledError):
            message = f"stopped during start-up ({lifeline.reason or 'cancelled'})"
        elif isinstance(e, NbclusterError):
            message = str(e)
        else:
            message = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        if cluster is not None:
            budget = lifeline_grace() if lifeline.reason else 10
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(cluster.close(timeout=budget), budget)
        kill_descendants()  # whatever the close did not finish: no worker outlives a failed start
        registry.remove(directory, name)
        kept = startlog.keep_failed(log) if entry["state"] == "starting" else None
        with contextlib.suppress(OSError, AssertionError):  # the requester may be gone
            report({"ok": False, "error": f"{message}; its log: {kept or '(none)'}"})
        return 1

    try:
        await stop.wait()
    finally:
        # The entry goes first: from now on nobody should hand this cluster new work.
        registry.update(directory, name, {**entry, "state": "stopping"})
        # A signal or a dead owner leaves GRACE_S before the lifeline's watchdog ends the
        # process anyway; an explicit `nbcluster_stop` may take its time.
        budget = lifeline_grace() if lifeline.reason else 20
        with contextlib.suppress(Exception):
            await asyncio.wait_for(cluster.close(timeout=min(budget, 10)), budget)
        registry.remove(directory, name)
    return 0


def lifeline_grace() -> float:
    """What a graceful close may take when the stop came from a signal or the owner: less
    than the lifeline's grace period, so the close, not the watchdog, usually ends it."""
    return GRACE_S * 0.8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbcluster.cluster.supervisor")
    parser.add_argument("--ready-fd", type=int, required=True, help="pipe for the one ready line")
    parser.add_argument("--log", type=Path, required=True, help="this process's stdout/stderr file")
    args = parser.parse_args(argv)
    os.set_inheritable(args.ready_fd, False)
    lifeline = Lifeline(args.log)
    lifeline.install_signals()  # from the first moment: a spare is stopped with SIGTERM too
    # The request comes on stdin, so a supervisor can be launched ahead of time (its
    # imports are most of a start-up) and told what to start later. EOF means the process
    # that launched us is gone before asking: nothing to do.
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
