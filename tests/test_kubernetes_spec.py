"""The Kubernetes backend, checked as a spec: no API server can run on the test machine.

The resources a `kubernetes` profile would create are rendered with dask-kubernetes' own
`make_cluster_spec`, then checked against the schema of dask-kubernetes' own custom
resource definitions (as the API server would: wrong types are refused, unknown fields are
silently dropped, so both count as failures here) and for what the profile asked: the
image, the resources, the TLS secret, and GPU limits on the GPU workers only.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import dask.config
import jsonschema
import pytest
import yaml

from nbcluster.cluster import kubernetes
from nbcluster.cluster.credentials import write_credentials
from nbcluster.errors import BadArgument

IMAGE = "ghcr.io/dask/dask:2026.8.0-py3.11"
PROFILE = {
    "backend": "kubernetes",
    "description": "Department Kubernetes, GPU nodes",
    "options": {
        "image": IMAGE,
        "namespace": "physics",
        "n_workers": 3,
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}},
        "env": {"EXTRA_PIP_PACKAGES": "scipy", "OMP_NUM_THREADS": 1},
        "gpus": 2,
        "resource_timeout": 120,
    },
}


def _schema(kind: str) -> dict[str, Any]:
    import dask_kubernetes

    crds = Path(dask_kubernetes.__file__).parent / "operator/deployment/helm/dask-kubernetes-operator/crds"
    crd = yaml.safe_load((crds / f"{kind}.yaml").read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def _pruned(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would drop: not in a structural schema's `properties`."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out = []
    if isinstance(obj, dict) and "properties" in schema:
        for key, value in obj.items():
            if key not in schema["properties"]:
                if not schema.get("additionalProperties"):
                    out.append(f"{path}/{key}")
                continue
            out += _pruned(value, schema["properties"][key], f"{path}/{key}")
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            out += _pruned(value, schema["additionalProperties"], f"{path}/{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, value in enumerate(obj):
            out += _pruned(value, schema["items"], f"{path}[{i}]")
    return out


def _accepted(obj: dict[str, Any], kind: str) -> None:
    schema = _schema(kind)
    # The CRDs' schemas describe `spec` and `status`; metadata is Kubernetes' own.
    body = {k: v for k, v in obj.items() if k in ("spec", "status")}
    jsonschema.validate(body, schema)
    assert _pruned(body, schema) == [], f"the API server would drop these fields of the {kind}"


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    [container] = pod["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.fixture
def tls(tmp_path: Path) -> dict[str, str]:
    return write_credentials(tmp_path, "demo")[1]


@pytest.fixture
def profile():
    with dask.config.set({"nbcluster.profiles.gpu-k8s": PROFILE}):
        yield dask.config.get("nbcluster.profiles.gpu-k8s")


def test_profile_renders_a_daskcluster_the_operator_accepts(profile, tls):
    r = kubernetes.render("Demo_1", profile["options"], tls=tls)

    assert r.cluster["kind"] == "DaskCluster" and r.cluster["apiVersion"] == "kubernetes.dask.org/v1"
    assert r.cluster["metadata"] == {"name": "demo-1", "namespace": "physics"}
    _accepted(r.cluster, "daskcluster")
    group = {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskWorkerGroup",
             "spec": {"cluster": "demo-1", "worker": r.gpu_workers}}  # fmt: skip
    _accepted(group, "daskworkergroup")
    # Options that are not about the resources go to KubeCluster as they were written.
    assert r.kwargs == {"resource_timeout": 120, "namespace": "physics"}


def test_image_resources_and_sizes(profile, tls):
    r = kubernetes.render("demo", profile["options"], tls=tls)
    scheduler = _container(r.cluster["spec"]["scheduler"])
    worker = _container(r.cluster["spec"]["worker"])

    assert scheduler["image"] == worker["image"] == _container(r.gpu_workers)["image"] == IMAGE
    assert worker["resources"] == scheduler["resources"] == PROFILE["options"]["resources"]
    assert r.cluster["spec"]["worker"]["replicas"] == 3
    assert _env(worker)["OMP_NUM_THREADS"] == "1"  # Kubernetes takes strings only
    assert worker["args"][-4:] == ["--nthreads", "1", "--resources", "CPU=1"]

    # --workers/--threads/--memory override the profile for the workers, not the scheduler.
    r = kubernetes.render("demo", profile["options"], tls=tls, workers=5, threads=2, memory="3GiB")
    scheduler = _container(r.cluster["spec"]["scheduler"])
    worker = _container(r.cluster["spec"]["worker"])
    assert r.cluster["spec"]["worker"]["replicas"] == 5
    assert worker["resources"]["limits"] == {"cpu": "2", "memory": str(3 * 2**30)}
    assert worker["resources"]["requests"] == {"cpu": "2", "memory": str(3 * 2**30)}
    assert scheduler["resources"] == PROFILE["options"]["resources"]
    assert worker["args"][-6:] == ["--nthreads", "2", "--resources", "CPU=2", "--memory-limit", str(3 * 2**30)]
    _accepted(r.cluster, "daskcluster")


def test_tls_secret_is_mounted_and_required_everywhere(profile, tls):
    r = kubernetes.render("demo", profile["options"], tls=tls)

    assert r.secret is not None and r.secret["metadata"] == {"name": "demo-tls", "namespace": "physics"}
    files = {"ca.pem": tls["ca_file"], "cert.pem": tls["cert"], "key.pem": tls["key"]}
    for key, path in files.items():
        assert base64.b64decode(r.secret["data"][key]) == Path(path).read_bytes()

    pods = {"scheduler": r.cluster["spec"]["scheduler"], "worker": r.cluster["spec"]["worker"],
            "gpu worker": r.gpu_workers}  # fmt: skip
    for role, pod in pods.items():
        assert {"name": "nbcluster-tls", "secret": {"secretName": "demo-tls", "defaultMode": 0o400}} in pod["spec"][
            "volumes"
        ], role
        container = _container(pod)
        assert {"name": "nbcluster-tls", "mountPath": kubernetes.TLS_MOUNT, "readOnly": True} in container[
            "volumeMounts"
        ]
        env = _env(container)
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True", role
        mounted = {Path(v).name for k, v in env.items() if k.startswith("DASK_DISTRIBUTED__COMM__TLS__")}
        assert mounted == set(files), role
    assert _container(pods["scheduler"])["args"][-2:] == ["--protocol", "tls"]
    # The operator would hand workers a tcp:// address; a TLS-only scheduler refuses it.
    for role in ("worker", "gpu worker"):
        assert _env(_container(pods[role]))["DASK_SCHEDULER_ADDRESS"] == (
            "tls://demo-scheduler.physics.svc.cluster.local:8786"
        )

    plain = kubernetes.render("demo", profile["options"], tls=None)
    assert plain.secret is None
    assert "volumes" not in plain.cluster["spec"]["worker"]["spec"]
    assert "DASK_SCHEDULER_ADDRESS" not in _env(_container(plain.cluster["spec"]["worker"]))


def test_gpu_limits_only_on_gpu_workers(profile, tls):
    r = kubernetes.render("demo", profile["options"], tls=tls, memory="8GiB")

    gpu = _container(r.gpu_workers)
    assert r.gpu_workers["replicas"] == 2
    assert gpu["resources"]["limits"][kubernetes.GPU_RESOURCE] == "1"
    assert gpu["resources"]["requests"][kubernetes.GPU_RESOURCE] == "1"
    assert gpu["resources"]["limits"]["memory"] == str(8 * 2**30)
    assert gpu["args"][-6:] == ["--nthreads", "1", "--resources", "GPU=1", "--memory-limit", str(8 * 2**30)]
    for pod in (r.cluster["spec"]["scheduler"], r.cluster["spec"]["worker"]):
        resources = _container(pod)["resources"]
        assert all(kubernetes.GPU_RESOURCE not in part for part in resources.values())

    no_gpu = kubernetes.render("demo", {**profile["options"], "gpus": 0}, tls=tls)
    assert no_gpu.gpu_workers is None


def test_dask_kubernetes_config_fills_what_the_profile_leaves_out(tls):
    with dask.config.set({"kubernetes.image": "example.org/lab/dask:1", "kubernetes.namespace": "teaching"}):
        r = kubernetes.render("demo", {}, tls=tls)
    assert _container(r.cluster["spec"]["worker"])["image"] == "example.org/lab/dask:1"
    assert r.cluster["metadata"]["namespace"] == r.kwargs["namespace"] == "teaching"
    _accepted(r.cluster, "daskcluster")


@pytest.mark.parametrize(
    ("options", "kwargs", "message"),
    [
        ({"resources": {"limit": {"cpu": 1}}}, {}, "takes `limits` and `requests`"),
        ({"gpus": "two"}, {}, "gpus must be a whole number"),
        ({}, {"memory": "lots"}, "--memory 'lots' is not a size"),
        ({}, {"workers": -1}, "--workers must be a whole number"),
    ],
)
def test_bad_options_give_one_line(tls, options, kwargs, message):
    with pytest.raises(BadArgument, match=message) as info:
        kubernetes.render("demo", options, tls=tls, **kwargs)
    assert "\n" not in str(info.value)


def test_a_name_with_nothing_kubernetes_can_use_is_refused(tls):
    with pytest.raises(BadArgument, match="gives no Kubernetes name"):
        kubernetes.render("___", {}, tls=tls)
