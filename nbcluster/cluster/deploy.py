"""The deployment a supervisor hosts, for every backend, behind one small interface.

A `Deployment` wraps one Dask deployment object (nbcluster's own `NbSpecCluster`, a
dask-jobqueue cluster, an `SSHCluster`, a `GatewayCluster`, a dask-kubernetes `KubeCluster`)
and answers what the `nbcluster_*` control handlers need: start, scale, adapt, restart,
close, what a worker's status row needs from the backend (its GPU, its batch job), and
what was asked for. The rows themselves are `info.worker_row`; the TLS files, `credentials.py`.

Where the scheduler runs decides where the control handlers live:

- **in the supervisor** (``local`` and the dask-jobqueue backends): the scheduler is an
  object in this process, and `Control` is installed on it as a scheduler plugin, as it
  always was. Front ends call ``nbcluster_*`` at the scheduler's address.
- **elsewhere** (``ssh``, ``gateway``, ``kubernetes``): the supervisor serves the same
  handlers on a `distributed.core.Server` of its own, on ``tls://127.0.0.1`` with the
  cluster's nbcluster credentials; its address is ``control`` in the registry entry, and
  ``nbcluster_metrics`` is passed on to the scheduler, where the metrics plugin is
  registered through a client (when the scheduler refuses it, `metrics.basic.basic_snapshot` serves the
  scheduler's own view: workers, CPU and memory, no task stream). Front ends only swap the
  address.

TLS: the local and jobqueue backends use the cluster's own certificate (`credentials.write_credentials`);
jobqueue and SSH workers read the same files on their hosts (a shared home directory), and
get them as ``--tls-*`` options (jobqueue) or as inherited Dask config (SSH). A gateway
brings its own credentials, which are written 0600 beside the entry like ours.

Worker environment: nbcluster's tuning (`nbcluster.worker.pre-spawn-environ`, the malloc
setting) reaches SSH workers with the Dask config `SSHCluster` ships to the hosts, and batch
jobs through one line of the job script (`_worker_environ_prologue`), a gateway's through
its ``environment`` cluster option where it offers one (else `%cluster start` says how its
administrator can); an operator's workers get the environment their administrator configured.

Workers out of reach: a worker on another host has no ``kill -9`` path from here. `close`
asks the backend to end them (``scancel``, the gateway's shutdown, the SSH session's end, the
operator's delete); a worker that misses that (its host cut off) ends through its
``--death-timeout`` once it cannot reach the scheduler, and its nanny with it; an SSH
scheduler ends once the supervisor's client has been gone as long (`remote_watch`).

What it leaves out: the deployment projects' own config (``jobqueue.slurm``, ``gateway``),
which they read themselves; profile options pass through unchanged except where `--workers`,
`--threads` and `--memory` override them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, ClassVar, cast

import dask.config
from dask.utils import parse_timedelta
from distributed import Client, Security
from distributed.core import PooledRPCCall, Server, rpc

from nbcluster import _compat, config
from nbcluster._wire import Bounds, Credentials, GpuDevice, Requested, Snapshot
from nbcluster.cluster import kubernetes, private_http, remote_watch, speccluster
from nbcluster.cluster.credentials import security_from, tls_config, write_pem_credentials
from nbcluster.cluster.gpu import GPU
from nbcluster.cluster.profiles import JOBQUEUE, Profile
from nbcluster.cluster.spec import ClusterSpec
from nbcluster.errors import BadArgument, ClusterUnreachable

#: What a worker of a remote-host backend waits for an unreachable scheduler before exiting.
DEATH_TIMEOUT = "60s"


class Deployment:
    """One backend's cluster object; subclasses say how each operation maps onto it."""

    #: The scheduler object when it runs in this process, else None.
    scheduler: Any = None
    #: The backend's own cluster object (a Dask `Cluster`, or dask-gateway's `GatewayCluster`).
    cluster: Any = None
    adaptive_bounds: Bounds | None = None
    #: One line for the user at start (`_wire.ClusterState.notice`), if the backend has one.
    notice: str | None = None

    def __init__(self, spec: ClusterSpec, profile: Profile):
        self.spec = spec
        self.profile = profile

    async def start_scheduler(self) -> None:
        """Start the scheduler ahead of the workers, where the backend can (`start` then starts
        the workers): clients connect while the workers start. By default nothing: `start`
        does it all.
        """

    async def start(self) -> None:
        """Start the backend's cluster (in the supervisor's event loop).

        Raises
        ------
        ClusterFailed
            Or the backend's own error, when it cannot start; the supervisor reports it.
        """
        raise NotImplementedError

    @property
    def address(self) -> str:
        """The scheduler's address, as clients reach it."""
        address: str = self.cluster.scheduler_address
        return address

    @property
    def dashboard(self) -> str | None:
        """The dashboard's URL, or None without one."""
        return None

    def requested_by_kind(self) -> Requested:
        """The workers asked for, by kind.

        Returns
        -------
        Requested
            ``{"cpu": n, "gpu": m}``.
        """
        raise NotImplementedError

    def check_kind(self, kind: str) -> None:
        """Check this backend can scale workers of `kind`.

        Parameters
        ----------
        kind : str
            ``cpu`` or ``gpu``.

        Raises
        ------
        BadArgument
            For a kind the backend does not scale (most have CPU workers only).
        """
        if kind != "cpu":
            raise BadArgument(
                f"the {self.profile.backend} backend has one kind of worker: scale it without --kind "
                "(GPU workers come from the profile's options)"
            )

    async def scale(self, n: int, kind: str = "cpu") -> None:
        """Scale the workers of `kind` to `n` (turning adaptive scaling off).

        Parameters
        ----------
        n : int
            Workers wanted.
        kind : str
            ``cpu`` or ``gpu`` (checked by `check_kind` first).
        """
        raise NotImplementedError

    #: What the backend's own ``adapt`` takes besides the bounds.
    adapt_options: ClassVar[dict[str, Any]] = {}

    def adapt(self, minimum: int, maximum: int) -> None:
        """Let the workers follow the load between the bounds (the backend's own ``adapt``).

        Parameters
        ----------
        minimum, maximum : int
            The bounds (checked).
        """
        self.cluster.adapt(minimum=minimum, maximum=maximum, **self.adapt_options)
        self.adaptive_bounds = {"minimum": minimum, "maximum": maximum}

    def job_id(self, worker_name: str) -> str | None:
        """The batch job a worker runs in.

        Parameters
        ----------
        worker_name : str
            The worker's name.

        Returns
        -------
        str or None
            None where there are no jobs.
        """
        return None

    def gpu(self, worker_name: str) -> GpuDevice | None:
        """The GPU nbcluster gave a worker.

        Parameters
        ----------
        worker_name : str
            The worker's name.

        Returns
        -------
        GpuDevice or None
            None for a CPU worker, or where the backend assigns devices itself.
        """
        return None

    # Where the scheduler runs elsewhere (`scheduler` is None), the supervisor asks it
    # through these.
    async def scheduler_identity(self) -> dict[str, Any]:
        """The remote scheduler's ``identity`` answer.

        Returns
        -------
        dict
            Its workers and their metrics.
        """
        raise NotImplementedError

    async def scheduler_metrics(self, since: int | None, detail: int | None) -> Snapshot:
        """The remote scheduler's metrics plugin's snapshot.

        Parameters
        ----------
        since, detail : int or None
            As `MetricsPlugin.nbcluster_metrics` takes them.

        Returns
        -------
        Snapshot
            Its answer.
        """
        raise NotImplementedError

    async def restart(self) -> None:
        """Restart the workers of a cluster whose scheduler runs elsewhere."""
        raise NotImplementedError

    async def close(self, timeout: float) -> None:
        """Stop the cluster: its workers, jobs or pods, and its scheduler.

        Parameters
        ----------
        timeout : float
            Seconds a graceful close may take.
        """
        raise NotImplementedError


class LocalDeployment(Deployment):
    """nbcluster's own SpecCluster: CPU and GPU worker processes on this machine."""

    cluster: speccluster.NbSpecCluster

    def __init__(self, spec: ClusterSpec, profile: Profile, devices: list[GPU], security: Security):
        super().__init__(spec, profile)
        self.cluster = speccluster.local_cluster(spec, devices, security)

    async def start_scheduler(self) -> None:
        await _compat.start_spec_scheduler(self.cluster)
        self.scheduler = self.cluster.scheduler

    async def start(self) -> None:
        await self.cluster  # the workers (and the scheduler, if `start_scheduler` was skipped)
        self.scheduler = self.cluster.scheduler

    @property
    def dashboard(self) -> str | None:
        """The dashboard on loopback (it requires the cluster's certificate), if asked for."""
        return speccluster.dashboard_url(self.cluster) if self.spec.dashboard else None

    # Read-only here, where the base class has a plain attribute: the cluster keeps the
    # bounds (NbSpecCluster.adapt_bounded), and nothing sets them on this object.
    @property
    def adaptive_bounds(self) -> Bounds | None:  # type: ignore[override]
        """The cluster's adaptive bounds, or None while it is not adaptive."""
        return self.cluster.adaptive_bounds

    def requested_by_kind(self) -> Requested:
        return self.cluster.requested_by_kind()

    def check_kind(self, kind: str) -> None:
        pass  # both kinds; scale_kind names a missing GPU

    async def scale(self, n: int, kind: str = "cpu") -> None:
        await self.cluster.scale_kind(n, kind)

    def adapt(self, minimum: int, maximum: int) -> None:
        self.cluster.adapt_bounded(minimum, maximum)

    def gpu(self, worker_name: str) -> GpuDevice | None:
        device = self.cluster.devices.get(worker_name)
        return device.to_dict() if device else None

    @property
    def gpu_count(self) -> int:
        """The GPU workers the cluster can have (one per `--gpus-per-worker` GPUs)."""
        return len(self.cluster.device_groups)

    async def close(self, timeout: float) -> None:
        # An asynchronous cluster's close() is its coroutine (Dask types it for both modes).
        await cast("Awaitable[None]", self.cluster.close(timeout=timeout))


class _SpecBased(Deployment):
    """A backend whose object is a Dask `SpecCluster` (dask-jobqueue, SSH): one worker spec
    per worker, so scale/adapt are the SpecCluster's own."""

    cluster: Any

    def requested_by_kind(self) -> Requested:
        return {"cpu": len(self.cluster.worker_spec), "gpu": 0}

    async def scale(self, n: int, kind: str = "cpu") -> None:
        self.check_kind(kind)
        self._stop_adaptive()
        self.cluster.scale(n)
        # SpecCluster.scale only schedules the change; waiting for it makes `scale` return
        # once the jobs are submitted (or cancelled), so squeue already shows them.
        await _compat.apply_scale(self.cluster)

    adapt_options: ClassVar[dict[str, Any]] = {"interval": "500ms", "wait_count": 3}

    def _stop_adaptive(self) -> None:
        _compat.stop_adaptive(self.cluster)
        self.adaptive_bounds = None

    async def close(self, timeout: float) -> None:
        self._stop_adaptive()
        await self.cluster.close(timeout=timeout)


class JobqueueDeployment(_SpecBased):
    """A dask-jobqueue cluster: the scheduler runs here, each worker is a batch job."""

    def __init__(self, spec: ClusterSpec, profile: Profile, security: Security):
        super().__init__(spec, profile)
        options = dict(profile.options)
        if spec.threads is not None:
            # One worker per job with that many threads (jobqueue would split the cores
            # into several worker processes).
            options.update(cores=spec.threads, processes=1)
        if spec.memory is not None:
            options["memory"] = f"{spec.memory}B"
        scheduler_options = {
            "dashboard": spec.dashboard, "dashboard_address": "127.0.0.1:0", **(options.get("scheduler_options") or {}),
        }  # fmt: skip
        options.update(
            scheduler_options=scheduler_options, scheduler_cls=private_http.PrivateScheduler,
            security=security, protocol="tls://", n_workers=0,
            asynchronous=True, job_script_prologue=[*_worker_environ_prologue(), *_prologue(profile)],
            worker_extra_args=[*_extra_args(profile), "--preload-nanny", shlex.quote(remote_watch.preload_text())],
        )  # fmt: skip
        # The workers present the cluster's certificate files (`--tls-*` in the job
        # script): they must be readable where the jobs run, which a shared home provides.
        self.cluster = profile.deployment_class()(**options)
        self.initial = spec.workers if spec.workers is not None else int(profile.options.get("n_workers", 1))

    async def start(self) -> None:
        await self.cluster
        self.scheduler = self.cluster.scheduler
        if self.initial:
            await self.scale(self.initial)

    async def scale(self, n: int, kind: str = "cpu") -> None:
        try:
            await super().scale(n, kind)
        except RuntimeError as e:
            # dask-jobqueue's message is the whole command and its output; the batch
            # system's own error is the line that says what is wrong.
            raise BadArgument(f"the batch system refused the job: {_submit_error(str(e))}") from None

    @property
    def dashboard(self) -> str | None:
        """The dashboard on loopback (it requires the cluster's certificate), if asked for."""
        return speccluster.dashboard_url(self.cluster) if self.spec.dashboard else None

    def job_id(self, worker_name: str) -> str | None:
        job = self.cluster.workers.get(worker_name)
        return getattr(job, "job_id", None)

    def job_script(self) -> str:
        """The batch script a worker job is submitted with (``sbatch``'s, ``qsub``'s).

        Returns
        -------
        str
            dask-jobqueue's script.
        """
        script: str = self.cluster.job_script()
        return script


def _worker_environ_prologue() -> list[str]:
    """A job script line giving the job's nanny nbcluster's worker environment.

    The nanny reads `distributed.nanny.pre-spawn-environ` from its own Dask config, not
    from this process's: without this line the jobs' workers ran without the malloc setting
    (`nbcluster.worker.pre-spawn-environ`), numpy items 2-3x slower than in a fresh process
    (bench/scaleout.py). A variable set in the submitting environment still wins: sbatch
    and its peers pass it on, and the nanny prefers it to its config.
    """
    return [f"export {PRE_SPAWN_VARIABLE}={shlex.quote(_pre_spawn_literal())}"]


#: The variable that gives a nanny started elsewhere nbcluster's worker environment.
PRE_SPAWN_VARIABLE = "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"


def _pre_spawn_literal() -> str:
    """`config.worker_pre_spawn_environ` as the value of `PRE_SPAWN_VARIABLE`."""
    # A Python literal (Dask parses DASK_ variables with literal_eval), in double quotes
    # so that a job script stays readable; None removes one of Dask's variables.
    items = (
        f"{json.dumps(k)}: {'None' if v is None else json.dumps(str(v))}"
        for k, v in config.worker_pre_spawn_environ().items()
    )
    return "{" + ", ".join(items) + "}"


def remote_watch_config(supervisor_timeout: float) -> dict[str, list[str]]:
    """Dask config adding `remote_watch` to every nanny and scheduler that reads it.

    It comes after any preload of their own, and as source text, not a module name: it runs
    where nbcluster is not installed.

    Parameters
    ----------
    supervisor_timeout : float
        A scheduler ends this many seconds after the supervisor's client left.

    Returns
    -------
    dict of str to list of str
        ``distributed.nanny.preload`` and ``distributed.scheduler.preload``, each the
        existing list with the watch appended once.
    """
    out = {}
    texts = {"nanny": remote_watch.preload_text(), "scheduler": remote_watch.preload_text(supervisor_timeout)}
    for role, text in texts.items():
        own = list(dask.config.get(f"distributed.{role}.preload", default=None) or [])
        out[f"distributed.{role}.preload"] = own if text in own else [*own, text]
    return out


def _prologue(profile: Profile) -> list[str]:
    """The profile's own job script prologue, else its dask-jobqueue config's."""
    own = profile.options.get("job_script_prologue")
    if own is None:
        own = dask.config.get(f"jobqueue.{profile.backend}.job-script-prologue", default=None)
    return list(own or [])


def _extra_args(profile: Profile) -> list[str]:
    """The profile's own worker arguments, else its dask-jobqueue config's.

    nbcluster adds the nanny watch (`remote_watch`) as ``--preload-nanny``: ``dask worker``
    always passes its own (empty) list of nanny preloads, so Dask config cannot add one.
    """
    own = profile.options.get("worker_extra_args")
    if own is None:
        own = dask.config.get(f"jobqueue.{profile.backend}.worker-extra-args", default=None)
    return list(own or [])


def _submit_error(text: str) -> str:
    """The submit command's own error line (``sbatch: error: ...``) in dask-jobqueue's message."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and not line.startswith("Command")]
    return errors[-1] if errors else (lines[-1] if lines else "no reason given")


class _Remote(Deployment):
    """A backend whose scheduler runs elsewhere: the supervisor talks to it as a client."""

    client: Client | None = None
    security: Security

    async def connect_client(self) -> None:
        timeout = config.seconds("timeouts.connect")
        self.client = await Client(
            self.address, security=self.security, asynchronous=True, set_as_default=False, timeout=timeout,
            name=remote_watch.SUPERVISOR_CLIENT,  # what an SSH scheduler's watch looks for
        )  # fmt: skip

    async def scheduler_identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = await self._scheduler_rpc().identity()
        return identity

    async def scheduler_metrics(self, since: int | None, detail: int | None) -> Snapshot:
        snapshot: Snapshot = await self._scheduler_rpc().nbcluster_metrics(since=since, detail=detail)
        return snapshot

    def _scheduler_rpc(self) -> rpc | PooledRPCCall:
        # Both are set once connect_client has returned, which start does before anything else.
        assert self.client is not None and self.client.scheduler is not None
        return self.client.scheduler

    async def restart(self) -> None:
        assert self.client is not None
        await self.client.restart(wait_for_workers=False)

    async def retire_workers(self) -> None:
        """End the workers through the scheduler, where nothing else can.

        A remote worker has no ``kill`` path from here, and one that only loses its scheduler
        keeps trying to reconnect until its death timeout; retiring it makes its nanny exit now.
        """
        if self.client is None:
            return
        with contextlib.suppress(Exception):
            workers = list((await self.scheduler_identity()).get("workers", {}))
            if workers:
                await self._scheduler_rpc().retire_workers(workers=workers, close_workers=True, remove=True)

    async def close_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()


class SSHDeployment(_Remote, _SpecBased):
    """`SSHCluster`: the scheduler on the first host, one worker per further host."""

    def __init__(self, spec: ClusterSpec, profile: Profile, security: Security, tls: Credentials):
        super().__init__(spec, profile)
        self.security = security
        options = dict(profile.options)
        timeout = config.seconds("timeouts.connect")
        options["connect_options"] = {"connect_timeout": timeout, **(options.get("connect_options") or {})}
        scheduler_options = {
            "protocol": "tls",
            "dashboard": spec.dashboard,
            **(options.get("scheduler_options") or {}),
        }
        worker_options = {
            "protocol": "tls",
            "death_timeout": DEATH_TIMEOUT,
            **(options.get("worker_options") or {}),
        }
        if spec.threads is not None:
            worker_options["nthreads"] = spec.threads
        if spec.memory is not None:
            worker_options["memory_limit"] = spec.memory
        options.update(scheduler_options=scheduler_options, worker_options=worker_options)
        # SSHCluster ships this process's Dask config to every remote process: the TLS
        # settings go that way (file paths: they must exist on the hosts, a shared home),
        # and the watches that end a nanny whose scheduler is gone and a scheduler whose
        # supervisor is gone (remote_watch.py).
        dask.config.set(tls_config(tls))
        dask.config.set(remote_watch_config(parse_timedelta(worker_options["death_timeout"])))
        self.cluster = profile.deployment_class()(**options, security=security, asynchronous=True)
        self.initial = spec.workers

    async def start(self) -> None:
        try:
            await self.cluster
        except RuntimeError as e:
            # SpecCluster wraps the SSH failure; its cause is what the user can act on.
            raise ClusterUnreachable(self._ssh_failure(e.__cause__ or e)) from None
        if not self.cluster.new_spec and self.cluster.worker_spec:
            # SSHCluster has no template for new workers: a scale-up repeats the last host.
            self.cluster.new_spec = dict(self.cluster.worker_spec[max(self.cluster.worker_spec)])
        await self.connect_client()
        if self.initial is not None:
            await self.scale(self.initial)

    def _ssh_failure(self, cause: BaseException) -> str:
        options = self.profile.options
        hosts = ", ".join(dict.fromkeys(options.get("hosts") or []))
        port = (options.get("connect_options") or {}).get("port", 22)
        if isinstance(cause, asyncio.TimeoutError):
            timeout = config.seconds("timeouts.connect")
            return (
                f"no SSH answer from {hosts} (port {port}) within {timeout:g} s (nbcluster.timeouts.connect): "
                f"check the hosts and port in profile {self.profile.name!r}"
            )
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        return f"SSH to {hosts} (port {port}) failed: {reason}; check profile {self.profile.name!r}"

    async def close(self, timeout: float) -> None:
        await self.retire_workers()
        await self.close_client()
        await _SpecBased.close(self, timeout)


#: What `%cluster start` says when a gateway takes no environment from its users.
GATEWAY_NOTICE = (
    "The gateway at {address} offers no `environment` cluster option, so its workers run without "
    "nbcluster's worker environment (numpy items up to 1.7x slower); its administrator can offer one "
    "in the gateway's config: `from dask_gateway_server.options import Mapping, Options; "
    'c.Backend.cluster_options = Options(Mapping("environment", default={{}}))`'
)


class GatewayDeployment(_Remote):
    """A dask-gateway cluster: the gateway runs the scheduler and workers, with its own TLS."""

    def __init__(self, spec: ClusterSpec, profile: Profile, directory: Path, name: str):
        super().__init__(spec, profile)
        self.options = dict(profile.options)
        self.directory, self.name = directory, name
        self.cluster: Any = None
        self.tls: Credentials | None = None

    async def start(self) -> None:
        cls = self.profile.deployment_class()
        from dask_gateway import Gateway

        timeout = config.seconds("timeouts.connect")
        gateway_keys = ("address", "proxy_address", "public_address", "auth")
        gateway = Gateway(
            **{k: self.options[k] for k in gateway_keys if k in self.options}, asynchronous=True
        )
        try:
            # Reachable, and the credentials good, before anything is created.
            await asyncio.wait_for(gateway.list_clusters(), timeout)
        except asyncio.TimeoutError:
            raise BadArgument(
                f"the gateway at {gateway.address} did not answer within {timeout:g} s (nbcluster.timeouts.connect)"
            ) from None
        except Exception as e:
            status = getattr(e, "status", None)
            if status in (401, 403):
                raise BadArgument(
                    f"the gateway at {gateway.address} refused the credentials ({status}): check the "
                    f"auth option of profile {self.profile.name!r} or `gateway.auth` in Dask config"
                ) from None
            raise
        else:
            offered = await gateway.cluster_options()
        finally:
            await gateway.close()
        options = {**self.options, **self._environment(offered, gateway.address)}
        self.cluster = await cls(**options, asynchronous=True)
        self.tls = write_pem_credentials(self.directory, self.name, self.cluster.security)
        self.security = security_from(self.tls)
        if self.spec.workers:
            await self.scale(self.spec.workers)
        await self.connect_client()

    def _environment(self, offered: Any, address: str) -> dict[str, Any]:
        """nbcluster's worker environment as the gateway's ``environment`` cluster option,
        where it offers one (the profile's own variables win); else `notice` says how to offer it."""
        if "environment" not in offered:
            self.notice = GATEWAY_NOTICE.format(address=address)
            return {}
        own = self.options.get("environment", offered.get("environment")) or {}
        return {"environment": {PRE_SPAWN_VARIABLE: _pre_spawn_literal(), **own}}

    @property
    def dashboard(self) -> str | None:
        """The gateway's dashboard link (served by the gateway's proxy)."""
        link: str | None = self.cluster.dashboard_link
        return link

    def requested_by_kind(self) -> Requested:
        return {"cpu": self._requested, "gpu": 0}

    _requested = 0

    async def scale(self, n: int, kind: str = "cpu") -> None:
        self.check_kind(kind)
        await self.cluster.scale(n)
        self._requested, self.adaptive_bounds = n, None

    async def close(self, timeout: float) -> None:
        # No retiring first: the gateway ends its own workers on shutdown. With workers
        # retired under it, its scheduler outlived the gateway's SIGINT until the SIGTERM
        # 10 s later: gone after 13 s instead of 2-4 s (bench/scaleout.py, stop).
        await self.close_client()
        if self.cluster is not None:
            await asyncio.wait_for(self.cluster.shutdown(), timeout)


class KubernetesDeployment(_Remote):
    """dask-kubernetes' operator `KubeCluster`, from the resources `kubernetes.render` makes."""

    def __init__(
        self, spec: ClusterSpec, profile: Profile, security: Security, tls: Credentials, name: str
    ):
        super().__init__(spec, profile)
        self.security, self.tls, self.name = security, tls, name
        self.cluster: Any = None
        self.secret: Any = None

    async def start(self) -> None:
        cls = self.profile.deployment_class()
        r = kubernetes.render(
            self.name, self.profile.options, tls=self.tls, workers=self.spec.workers,
            threads=self.spec.threads, memory=self.spec.memory,
        )  # fmt: skip
        if r.secret is not None:
            import kr8s.asyncio.objects

            # Awaiting the object binds it to the cluster's API (kubeconfig) before creating it.
            self.secret = await kr8s.asyncio.objects.Secret(r.secret)
            await self.secret.create()
        self.cluster = await cls(custom_cluster_spec=r.cluster, asynchronous=True, **r.kwargs)
        if r.gpu_workers:
            await self.cluster.add_worker_group("gpu", custom_spec=r.gpu_workers)
        await self.connect_client()

    @property
    def address(self) -> str:
        """The scheduler's ``tls://`` address."""
        # The operator reports tcp://; the pods listen on TLS (see kubernetes.py).
        address: str = self.cluster.scheduler_address
        return address.replace("tcp://", "tls://", 1)

    def requested_by_kind(self) -> Requested:
        return {"cpu": len(self.cluster.scheduler_info.get("workers", {})), "gpu": 0}

    async def scale(self, n: int, kind: str = "cpu") -> None:
        self.check_kind(kind)
        await self.cluster.scale(n)

    async def close(self, timeout: float) -> None:
        await self.retire_workers()
        await self.close_client()
        try:
            if self.cluster is not None:
                await asyncio.wait_for(self.cluster.close(), timeout)
        finally:
            if self.secret is not None:
                await self.secret.delete()


def make(
    spec: ClusterSpec, profile: Profile, *, directory: Path, name: str, devices: list[GPU],
    security: Security, tls: Credentials,
) -> Deployment:  # fmt: skip
    """The deployment for `profile`, not started yet (``await deployment.start()``): the
    caller holds it, and can close it, whenever a start is cut short.

    Parameters
    ----------
    spec : ClusterSpec
        The checked start request.
    profile : Profile
        Where it runs.
    directory : Path
        The registry folder (a gateway's credentials are written there).
    name : str
        The cluster's name.
    devices : list of GPU
        Local GPUs to give one worker each.
    security : distributed.Security
        The cluster's TLS credentials.
    tls : Credentials
        The same, as file paths.

    Returns
    -------
    Deployment
        The backend's deployment.

    Raises
    ------
    BadArgument
        For an unknown backend.
    """
    if profile.local or profile.backend in JOBQUEUE:
        # The scheduler (and local workers) run here: their HTTP servers, the dashboard
        # among them, answer only holders of the cluster's certificate (private_http.py).
        # This process exists for this one cluster, so the setting is global here.
        dask.config.set(private_http.settings(tls))
    if profile.local:
        return LocalDeployment(spec, profile, devices, security)
    if profile.backend in JOBQUEUE:
        return JobqueueDeployment(spec, profile, security)
    if profile.backend == "ssh":
        return SSHDeployment(spec, profile, security, tls)
    if profile.backend == "gateway":
        return GatewayDeployment(spec, profile, directory, name)
    if profile.backend == "kubernetes":
        return KubernetesDeployment(spec, profile, security, tls, name)
    raise BadArgument(f"unknown backend {profile.backend!r}")  # profiles.get checked already


async def serve_control(handlers: dict[str, Any], security: Security) -> Server:
    """The supervisor's own control endpoint, for backends whose scheduler is elsewhere:
    the same handlers, behind the cluster's TLS (a client certificate from its CA).

    Parameters
    ----------
    handlers : dict
        `Control.handlers`.
    security : distributed.Security
        The cluster's TLS credentials.

    Returns
    -------
    distributed.core.Server
        Listening on loopback.
    """
    server = Server(handlers)
    await server.listen("tls://127.0.0.1:0", **security.get_listen_args("scheduler"))
    return server
