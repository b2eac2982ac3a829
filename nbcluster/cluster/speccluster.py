"""`NbSpecCluster`: the local backend's Dask cluster object, which a supervisor hosts.

The local backend is the one built in: a `SpecCluster` whose workers are of two kinds,

- ``cpu-N``: nanny processes advertising the resource ``{"CPU": threads}``;
- ``gpu-N``: one nanny process per ``--gpus-per-worker`` GPUs (default 1), pinned with
  ``CUDA_VISIBLE_DEVICES`` to its own devices, advertising ``{"GPU": gpus_per_worker}``, with
  ``gpu_threads`` threads per GPU (default 4) so that items asking a fraction of a GPU
  (``--gpus 0.25``) share it: the ``GPU`` resource caps how many run at once.

A process has one ``CUDA_VISIBLE_DEVICES``, so every item on a GPU worker sees all of that
worker's GPUs; `nbcluster.run.transport.placement` refuses an item that asks fewer GPUs than a
multi-GPU worker holds, rather than let it see (and use) devices it was not given.

Because only CPU workers have ``CPU``, a task asking for ``CPU`` never lands on a GPU
worker, and one asking for ``GPU`` only lands on GPU workers; a task asking for nothing
may run anywhere. Scaling is per kind (`NbSpecCluster.scale_kind`), and so is adaptivity
(`adaptive.KindAdaptive`).

GPU workers come from the built-in spec above, or with ``gpu_backend="dask-cuda"`` from
dask-cuda's own worker spec (CPU affinity, its memory management), with nbcluster's
resource tag and TLS settings laid over it.

Multi-machine deployments (dask-jobqueue, dask-kubernetes, dask-gateway, SSH) are Dask's
own projects, named by profiles (`profiles.py`) and hosted through `deploy.py`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from distributed import Nanny, Security, SpecCluster
from distributed.core import Status

from nbcluster import _compat, config
from nbcluster._wire import Bounds, Kind, Requested
from nbcluster.cluster import forkserver
from nbcluster.cluster.adaptive import KindAdaptive
from nbcluster.cluster.gpu import GPU, SIMULATE_ENV, groups
from nbcluster.cluster.kinds import GPU_RESOURCE, check_kind, worker_kind
from nbcluster.cluster.private_http import PrivateScheduler, PrivateWorker
from nbcluster.cluster.spec import ClusterSpec, parse_bounds
from nbcluster.cluster.streams import WorkerStream
from nbcluster.cluster.switch_interval import ShortSwitchInterval
from nbcluster.cluster.worker_memory import MemoryTrim
from nbcluster.errors import BadArgument


class NbSpecCluster(SpecCluster):
    """A SpecCluster with CPU and GPU worker kinds, scaled per kind."""

    def __init__(self, *, spec: ClusterSpec, devices: list[GPU], security: Security, **kwargs: Any):
        self.nb_spec = spec
        self.all_devices = devices
        # The devices of each possible GPU worker (`--gpus-per-worker` of them).
        self.device_groups = groups(devices, spec.gpus_per_worker)
        # worker name -> its first GPU (what a status row shows), for the GPU workers in the plan
        self.devices: dict[str, GPU] = {}
        # worker name -> all its GPUs
        self.worker_devices: dict[str, tuple[GPU, ...]] = {}
        self.adaptive_bounds: Bounds | None = None
        self._kind_adaptives: list[KindAdaptive] = []
        self._security = security
        workers: dict[str, Any] = {}
        for i in range(spec.workers or 0):
            workers[f"cpu-{i}"] = self._cpu_template()  # `new_spec` is set by SpecCluster below
        for group in self.device_groups:
            workers.update(self._gpu_spec(group))
        scheduler = {
            # The HTTP servers (dashboard, /json, /metrics) require the cluster's
            # certificate, like its comms (private_http.py).
            "cls": PrivateScheduler,
            "options": {
                "protocol": "tls",
                "host": "127.0.0.1",
                "port": 0,
                "security": security,
                "dashboard": spec.dashboard,
                "dashboard_address": "127.0.0.1:0",
                # The workers serve no pages (``dashboard: False``): nothing to relay to.
                "worker_proxy": False,
            },
        }
        super().__init__(
            workers=workers,
            scheduler=scheduler,
            worker=self._cpu_template(),
            security=security,
            name=spec.name,
            **kwargs,
        )

    # Overrides of SpecCluster's own hooks (`_update_worker_status`, `_close`): a subclass's
    # methods, which _compat.py cannot hold; what they call of Dask's private API goes there.
    def _update_worker_status(self, op: str, msg: Any) -> None:
        # SpecCluster hard-closes a worker that has not registered again
        # `distributed.deploy.lost-worker-timeout` (15 s) after it left: meant for a lost
        # batch job. Here each worker has a nanny that restarts its process itself, and an
        # item that kills its worker each time can leave it down at that very instant: the
        # close then took the nanny too, for good, and the cluster sat with no workers.
        # While the nanny runs, its worker is coming back: no timer.
        if op == "remove":
            name = (self.scheduler_info.get("workers", {}).get(msg) or {}).get("name")
            nanny = self.workers.get(name)
            if isinstance(nanny, Nanny) and nanny.status == Status.running:
                _compat.base_update_worker_status(self, op, msg)
                return
        super()._update_worker_status(op, msg)

    def _cpu_template(self) -> dict[str, Any]:
        threads = self.nb_spec.threads or 1
        return {"cls": Nanny, "options": self._options(threads, {"CPU": threads}, {})}

    def _options(self, threads: int, resources: dict[str, float], env: dict[str, str]) -> dict[str, Any]:
        switch = None if config.get("worker.switch-interval") is None else config.seconds("worker.switch-interval")
        options = {
            "nthreads": threads,
            "memory_limit": self.nb_spec.memory or "auto",
            "resources": resources,
            "env": env,
            "host": "127.0.0.1",
            "protocol": "tls",
            "security": self._security,
            "dashboard": False,
            "worker_class": PrivateWorker,
            # Gives back what the heap keeps for reuse (see worker_memory.py); lets the event
            # loop have the GIL soon after it asks (switch_interval.py).
            "plugins": (MemoryTrim(config.seconds("worker.trim-interval")), WorkerStream(), ShortSwitchInterval(switch)),
        }
        # Dask's config with nbcluster's worker settings over it (``worker.dask-config``); a
        # worker forked from the supervisor's forkserver (forkserver.py) still says spawn.
        worker_config = config.worker_dask_config()
        options["config"] = forkserver.worker_config(worker_config) if forkserver.in_use() else worker_config
        return options

    def _gpu_spec(self, group: tuple[GPU, ...]) -> dict[str, Any]:
        device = group[0]
        name = f"gpu-{device.index}"
        # The UUID pins the very device even if another tool renumbers them; simulated
        # devices have none that CUDA would understand.
        visible = ",".join(str(d.index if d.simulated or not d.uuid else d.uuid) for d in group)
        env = {"CUDA_VISIBLE_DEVICES": visible}
        if device.simulated:
            env[SIMULATE_ENV + "_DEVICE"] = ",".join(str(d.index) for d in group)
        count = len(group)
        options = self._options(self.nb_spec.gpu_threads * count, {GPU_RESOURCE: count}, env)
        if self.nb_spec.gpu_backend == "dask-cuda":
            cuda = _dask_cuda_options(group, options["nthreads"])
            plugins = (*cuda.get("plugins", ()), *options["plugins"])  # dask-cuda's and ours
            options = {**cuda, **options, "plugins": plugins}
        self.devices[name] = device
        self.worker_devices[name] = group
        return {name: {"cls": Nanny, "options": options}}

    def _new_spec(self, kind: str, taken: dict[str, Any]) -> dict[str, Any]:
        if kind == "gpu":
            used = {d.index for n, d in self.devices.items() if n in taken}
            free = [g for g in self.device_groups if g[0].index not in used]
            if not free:
                raise BadArgument(
                    f"no free GPU for another GPU worker: this cluster has {len(self.all_devices)} GPU(s)"
                )
            return self._gpu_spec(free[0])
        return self._new_cpu_specs(1, taken)

    def _new_cpu_specs(self, count: int, taken: dict[str, Any]) -> dict[str, Any]:
        # The lowest free names, found in one pass: a name at a time, each search from
        # cpu-0, was quadratic (500,000 names tried on the event loop to scale 1 -> 1,000).
        # The template is Dask's `new_spec` (from `worker=`, `_cpu_template()` unless
        # replaced), so an entry may stand for a group of workers as in dask-jobqueue.
        out: dict[str, Any] = {}
        i = 0
        while len(out) < count:
            if f"cpu-{i}" not in taken:
                out[f"cpu-{i}"] = dict(self.new_spec)  # Dask shares it; its options are copied before use
            i += 1
        return out

    def members(self, name: str) -> list[str]:
        """The workers that the spec entry `name` stands for: itself, or its group's.

        Parameters
        ----------
        name : str
            An entry of the worker spec.

        Returns
        -------
        list of str
            Worker names as the scheduler knows them (``name + suffix`` for a group, the
            way `SpecCluster.plan` names them).
        """
        group = self.worker_spec[name].get("group")
        return [str(name) + suffix for suffix in group] if group else [name]

    def kind_of(self, name: str) -> Kind:
        """The kind of a worker in the spec, started or not.

        Parameters
        ----------
        name : str
            The worker's name in the spec.

        Returns
        -------
        Kind
            ``cpu`` or ``gpu``.
        """
        return worker_kind(self.worker_spec[name]["options"].get("resources"))

    def requested_by_kind(self) -> Requested:
        """The workers in the spec, by kind (started or not; a group counts its members).

        Returns
        -------
        Requested
            ``{"cpu": n, "gpu": m}``.
        """
        counts: Requested = {"cpu": 0, "gpu": 0}
        for name in self.worker_spec:
            counts[self.kind_of(name)] += len(self.members(name))
        return counts

    async def scale_kind(self, n: int, kind: str = "cpu", *, adaptive: bool = False) -> None:
        """Scale the workers of one kind, dropping ones not started yet before busy ones.

        A spec entry that stands for a group of workers (``"group"``, see `members`) is
        added or dropped whole: the kind then has at least `n` workers, the fewest groups
        that make it.

        Parameters
        ----------
        n : int
            Workers of `kind` wanted.
        kind : str
            ``cpu`` or ``gpu``.
        adaptive : bool
            True when adaptive scaling asks; an explicit scale turns adaptive off.

        Raises
        ------
        BadArgument
            For an unknown kind, or more GPU workers than the cluster has GPUs.
        """
        check_kind(kind)
        if kind == "gpu" and n > len(self.device_groups):
            each = f" ({self.nb_spec.gpus_per_worker} per GPU worker)" if self.nb_spec.gpus_per_worker > 1 else ""
            raise BadArgument(
                f"cannot scale to {n} GPU workers: this cluster has {len(self.all_devices)} GPU(s){each}"
            )
        if not adaptive:
            # An explicit scale is the user taking control back from adaptivity.
            self.stop_adaptive()
        mine = {name: len(self.members(name)) for name in self.worker_spec if self.kind_of(name) == kind}
        have = sum(mine.values())
        if have > n:
            running = {v["name"] for v in self.scheduler_info.get("workers", {}).values()}
            # Drop workers that have not started yet before ones that hold work, then the
            # largest entries (a group) first, but never below `n`: a group that would
            # overshoot stays whole.
            order = sorted(mine, key=lambda name: (self.members(name)[0] in running, -mine[name], str(name)))
            for name in order:
                if have - mine[name] >= n:
                    have -= mine[name]
                    del self.worker_spec[name]
                    self.devices.pop(name, None)
                    self.worker_devices.pop(name, None)
        if have < n:
            if kind == "gpu":
                for _ in range(n - have):
                    self.worker_spec.update(self._new_spec(kind, taken=self.worker_spec))
            else:
                size = len(self.new_spec.get("group") or [None])  # workers one new entry adds
                self.worker_spec.update(self._new_cpu_specs(-(-(n - have) // size), self.worker_spec))
        await _compat.apply_scale(self)

    def stop_adaptive(self) -> None:
        """Stop adaptive scaling of every kind (the workers stay as they are)."""
        for adaptive in self._kind_adaptives:
            adaptive.stop(reason="nbcluster")
        self._kind_adaptives = []
        self.adaptive_bounds = None

    def adapt_bounded(self, minimum: Any, maximum: Any) -> None:
        """CPU workers adapt between the bounds; GPU workers (if any) between 0 and all the GPUs make.

        Parameters
        ----------
        minimum, maximum : object
            ``--min`` and ``--max`` as given (checked by `parse_bounds`).

        Raises
        ------
        BadArgument
            For bounds that are not counts, or a minimum above the maximum.
        """
        lo, hi = parse_bounds(minimum, maximum)
        self.stop_adaptive()
        options = {"interval": "500ms", "wait_count": 3}
        self._kind_adaptives = [KindAdaptive(self, "cpu", minimum=lo, maximum=hi, **options)]
        if self.all_devices:
            self._kind_adaptives.append(
                KindAdaptive(self, "gpu", minimum=0, maximum=len(self.device_groups), **options)
            )
        self.adaptive_bounds = {"minimum": lo, "maximum": hi}
        if self.all_devices:
            self.adaptive_bounds["gpu_maximum"] = len(self.device_groups)

    async def _close(self) -> None:
        self.stop_adaptive()
        await super()._close()


def _dask_cuda_options(group: tuple[GPU, ...], threads: int) -> dict[str, Any]:
    """dask-cuda's options for a worker on the one device of `group` (its plugins, memory
    settings); `ClusterSpec.from_user` refuses dask-cuda workers of several GPUs."""
    device = group[0]
    try:
        from dask_cuda.worker_spec import worker_spec
    except ImportError:
        raise BadArgument(
            "--gpu-backend dask-cuda needs dask-cuda: `pip install dask-cuda`, or leave the "
            "option out to use nbcluster's built-in GPU workers"
        ) from None
    [spec] = worker_spec(CUDA_VISIBLE_DEVICES=[device.index], threads_per_worker=threads).values()
    return dict(spec["options"])


def local_cluster(spec: ClusterSpec, devices: list[GPU], security: Security) -> NbSpecCluster:
    """The local backend's cluster, not started yet (`await` it): CPU workers for the cores
    GPU workers leave. Kept apart from starting so that the caller holds the object, and
    can close it, whenever a start is cut short.

    Parameters
    ----------
    spec : ClusterSpec
        The checked start request.
    devices : list of GPU
        The GPUs to give the GPU workers, `ClusterSpec.gpus_per_worker` each.
    security : distributed.Security
        The cluster's TLS credentials.

    Returns
    -------
    NbSpecCluster
        Asynchronous, not started.
    """
    if spec.workers is None and devices:
        cores = os.cpu_count() or 1
        spec = dataclasses.replace(spec, workers=max(cores - len(groups(devices, spec.gpus_per_worker)), 1))
    spec = spec.resolved()
    return NbSpecCluster(spec=spec, devices=devices, security=security, asynchronous=True)


def dashboard_url(cluster: SpecCluster) -> str | None:
    """The dashboard of a started local cluster, on loopback.

    Parameters
    ----------
    cluster : distributed.SpecCluster
        A started cluster.

    Returns
    -------
    str or None
        ``https://127.0.0.1:PORT/status`` (it requires the cluster's certificate), or None
        without a dashboard.
    """
    assert cluster.scheduler is not None  # asked of a started cluster
    port = cluster.scheduler.http_server.port if cluster.scheduler.http_server else None
    # https: the dashboard requires the cluster's certificate (private_http.py).
    return f"https://127.0.0.1:{port}/status" if port else None
