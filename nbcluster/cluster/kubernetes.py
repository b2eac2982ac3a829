"""The Kubernetes resources a `kubernetes` profile creates, rendered before anything runs.

nbcluster does not talk to Kubernetes itself: dask-kubernetes' operator `KubeCluster`
creates the resources, and its controller turns them into pods. This module only decides
*what* to ask for, with dask-kubernetes' own `make_cluster_spec` / `make_worker_spec`, and
lays nbcluster's settings over that:

- **image and resources** from the profile's options (`image`, `resources`, `env`,
  `worker_command`, as `KubeCluster` takes them), falling back to Dask's `kubernetes.*`
  config as `KubeCluster` does; `--threads` and `--memory` become each worker's
  `--nthreads` / `--memory-limit` and its pod's CPU and memory requests and limits.
- **TLS**: the cluster's certificate goes into a `Secret`, mounted read-only in the
  scheduler and worker pods; Dask config in their environment makes the scheduler listen on
  `tls://` and every comm require it. The operator tells workers a `tcp://` scheduler
  address unless one is set, so the workers get the `tls://` one.
- **GPU workers** (`gpus: N` in the options) are a second worker group whose pods each ask
  for one `nvidia.com/gpu` and whose workers advertise Dask's resource `{"GPU": 1}`, like
  the local backend's GPU workers; CPU workers advertise `{"CPU": threads}`.

Use (the deploy code)::

    r = render("demo", profile.options, tls=tls_files, workers=2)
    kr8s.objects.Secret(r.secret).create()               # before the pods need it
    cluster = KubeCluster(custom_cluster_spec=r.cluster, **r.kwargs)
    if r.gpu_workers:
        cluster.add_worker_group("gpu", custom_spec=r.gpu_workers)

What it leaves out: creating anything, and connecting. `KubeCluster` computes the
scheduler's address as `tcp://`; a client must use the `tls://` form of that address with
the cluster's `Security`.
"""

from __future__ import annotations

import base64
import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.config

from nbcluster._wire import Credentials
from nbcluster.errors import BadArgument

TLS_MOUNT = "/etc/nbcluster/tls"
GPU_RESOURCE = "nvidia.com/gpu"

# Options this module turns into the resources; the others go to KubeCluster unchanged.
_SPEC_OPTIONS = (
    "image", "n_workers", "resources", "env", "worker_command",
    "scheduler_service_type", "idle_timeout", "jupyter", "gpus", "namespace",
)  # fmt: skip
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class KubeResources:
    """What to create, in order: `secret`, then `cluster`, then the `gpu_workers` group."""

    cluster: dict[str, Any]  # a DaskCluster: KubeCluster(custom_cluster_spec=cluster, **kwargs)
    kwargs: dict[str, Any]  # the profile's other KubeCluster options (namespace included)
    secret: dict[str, Any] | None  # a v1 Secret with the cluster's TLS files
    gpu_workers: dict[str, Any] | None  # worker spec: add_worker_group("gpu", custom_spec=...)


def resource_name(name: str) -> str:
    """`name` as a Kubernetes resource name (lowercase letters, digits and '-').

    Parameters
    ----------
    name : str
        A cluster's name.

    Returns
    -------
    str
        At most 40 characters, a valid DNS label.

    Raises
    ------
    BadArgument
        When nothing of `name` is left (no letters or digits).
    """
    safe = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].strip("-")
    if not _DNS_LABEL.match(safe):
        raise BadArgument(f"cluster name {name!r} gives no Kubernetes name: use letters or digits in it")
    return safe


def render(
    name: str,
    options: dict[str, Any],
    *,
    tls: Credentials | None,
    workers: int | None = None,
    threads: int | None = None,
    memory: str | int | None = None,
) -> KubeResources:
    """The resources a `kubernetes` profile with `options` creates for cluster `name`.

    Parameters
    ----------
    name : str
        The nbcluster cluster name; made into a Kubernetes name with `resource_name`.
    options : dict
        The profile's `options`: `KubeCluster` keyword arguments, plus `gpus`, the number
        of GPU workers (default 0).
    tls : Credentials or None
        The cluster's credentials (`ca_file`, `cert`, `key` paths, as `write_credentials`
        returns them); None renders a cluster without TLS.
    workers, threads, memory : optional
        `--workers`, `--threads` and `--memory`: the CPU workers' count, and each worker's
        threads and memory (its pod's request and limit too). None keeps the profile's.

    Returns
    -------
    KubeResources
        The DaskCluster resource, KubeCluster's other options, the TLS secret and the GPU worker group.

    Raises
    ------
    BadArgument
        Without dask-kubernetes installed, or for a name that gives no Kubernetes name.
    """
    try:
        # Importing it also registers its `kubernetes.*` config defaults, read below.
        from dask_kubernetes.operator import make_cluster_spec, make_worker_spec
    except ImportError:
        raise BadArgument(
            "the kubernetes backend needs dask-kubernetes: `pip install 'nbcluster[kubernetes]'`"
        ) from None
    k8s_name = resource_name(name)
    namespace = options.get("namespace") or dask.config.get("kubernetes.namespace") or "default"
    option = _with_config_defaults(options)
    n_workers = workers if workers is not None else option["n_workers"]
    gpus = _count(options.get("gpus", 0), "gpus")
    threads = _count(threads, "--threads") if threads is not None else None

    common = {"image": option["image"], "env": _env_list(option["env"])}
    cluster = make_cluster_spec(
        name=k8s_name,
        n_workers=_count(n_workers, "--workers"),
        resources=_resources(option["resources"], threads, memory),
        worker_command=option["worker_command"],
        scheduler_service_type=option["scheduler_service_type"],
        idle_timeout=option["idle_timeout"],
        jupyter=option["jupyter"],
        **common,
    )
    cluster["metadata"]["namespace"] = namespace
    cpu = threads or 1
    _worker_args(cluster["spec"]["worker"], cpu, {"CPU": cpu}, memory)
    # The scheduler's own pod keeps the profile's resources, not the workers' sizes.
    cluster["spec"]["scheduler"]["spec"]["containers"][0]["resources"] = option["resources"]

    gpu_workers = None
    if gpus:
        gpu_workers = make_worker_spec(
            n_workers=gpus,
            resources=_gpu_resources(option["resources"], memory),
            worker_command=option["worker_command"],
            **common,
        )
        _worker_args(gpu_workers, 1, {"GPU": 1}, memory)

    secret = None
    if tls is not None:
        secret = _secret(f"{k8s_name}-tls", namespace, tls)
        address = f"tls://{k8s_name}-scheduler.{namespace}.svc.cluster.local:8786"
        _use_tls(cluster["spec"]["scheduler"]["spec"], secret, scheduler=True)
        for worker in (cluster["spec"]["worker"], gpu_workers):
            if worker is not None:
                _use_tls(worker["spec"], secret, address=address)

    kwargs = {k: v for k, v in options.items() if k not in _SPEC_OPTIONS}
    kwargs["namespace"] = namespace
    return KubeResources(cluster=cluster, kwargs=kwargs, secret=secret, gpu_workers=gpu_workers)


def _with_config_defaults(options: dict[str, Any]) -> dict[str, Any]:
    # The same fallbacks as KubeCluster's own constructor, so that a profile and Dask's
    # `kubernetes:` config section mean what they would without nbcluster.
    keys = {
        "image": "kubernetes.image",
        "n_workers": "kubernetes.count.start",
        "resources": "kubernetes.resources",
        "env": "kubernetes.env",
        "worker_command": "kubernetes.worker-command",
        "scheduler_service_type": "kubernetes.scheduler-service-type",
        "idle_timeout": "kubernetes.idle-timeout",
        "jupyter": "kubernetes.scheduler-jupyter",
    }
    merged = {k: dask.config.get(key, override_with=options.get(k)) for k, key in keys.items()}
    merged["idle_timeout"] = merged["idle_timeout"] or 0
    resources = merged["resources"] or {}
    unknown = set(resources) - {"limits", "requests"}
    if unknown or not all(isinstance(v, dict) for v in resources.values()):
        raise BadArgument(
            "the kubernetes profile's `resources` takes `limits` and `requests`, each a mapping "
            "such as {cpu: 1, memory: 2Gi}"
        )
    merged["resources"] = copy.deepcopy(resources)
    return merged


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadArgument(f"{what} must be a whole number of 0 or more, not {value!r}")
    return value


def _env_list(env: Any) -> list[dict[str, str]]:
    # Kubernetes takes only strings as environment values.
    if isinstance(env, dict):
        return [{"name": str(k), "value": str(v)} for k, v in env.items()]
    return list(env or [])


def _bytes(memory: str | int) -> int:
    from dask.utils import parse_bytes

    try:
        return parse_bytes(memory)
    except ValueError:
        raise BadArgument(f"--memory {memory!r} is not a size: use e.g. 2GiB or 512MB") from None


def _resources(base: dict[str, Any], threads: int | None, memory: str | int | None) -> dict[str, Any]:
    # Quantities as strings, as the CRD's schema has them; memory in plain bytes, since
    # Dask's "1GB" is no Kubernetes quantity.
    sizes: dict[str, str] = {}
    if threads is not None:
        sizes["cpu"] = str(threads)
    if memory is not None:
        sizes["memory"] = str(_bytes(memory))
    if not sizes:
        return base
    out = copy.deepcopy(base)
    for part in ("requests", "limits"):
        out[part] = {**out.get(part, {}), **sizes}
    return out


def _gpu_resources(base: dict[str, Any], memory: str | int | None) -> dict[str, Any]:
    out = _resources(base, 1, memory)
    # Kubernetes schedules extended resources from limits; a request must then equal it.
    out.setdefault("limits", {})[GPU_RESOURCE] = "1"
    out.setdefault("requests", {})[GPU_RESOURCE] = "1"
    return out


def _worker_args(worker: dict[str, Any], threads: int, resources: dict[str, int], memory: Any) -> None:
    container = worker["spec"]["containers"][0]
    args = ["--nthreads", str(threads), "--resources", ",".join(f"{k}={v}" for k, v in resources.items())]
    if memory is not None:
        args += ["--memory-limit", str(_bytes(memory))]
    container["args"] = [*container["args"], *args]


def _secret(name: str, namespace: str, tls: Credentials) -> dict[str, Any]:
    files = {"ca.pem": tls["ca_file"], "cert.pem": tls["cert"], "key.pem": tls["key"]}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(Path(p).read_bytes()).decode() for k, p in files.items()},
    }


def _use_tls(
    pod: dict[str, Any], secret: dict[str, Any], *, scheduler: bool = False, address: str = ""
) -> None:
    pod.setdefault("volumes", []).append(
        {"name": "nbcluster-tls", "secret": {"secretName": secret["metadata"]["name"], "defaultMode": 0o400}}
    )
    container = pod["containers"][0]
    container.setdefault("volumeMounts", []).append(
        {"name": "nbcluster-tls", "mountPath": TLS_MOUNT, "readOnly": True}
    )
    tls = "DASK_DISTRIBUTED__COMM__TLS__"
    env = {
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME": "tls",
        f"{tls}CA_FILE": f"{TLS_MOUNT}/ca.pem",
    }
    for role in ("SCHEDULER", "WORKER", "CLIENT"):
        env[f"{tls}{role}__CERT"] = f"{TLS_MOUNT}/cert.pem"
        env[f"{tls}{role}__KEY"] = f"{TLS_MOUNT}/key.pem"
    if address:
        env["DASK_SCHEDULER_ADDRESS"] = address
    container["env"] = [*(container.get("env") or []), *_env_list(env)]
    if scheduler:
        container["args"] = [*container["args"], "--protocol", "tls"]
