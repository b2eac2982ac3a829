"""A real dask-gateway server on loopback, for the gateway backend's tests.

`GatewayServer` writes a `dask-gateway-server` config in a temporary folder
(`UnsafeLocalBackend`: clusters are processes on this machine; `SimpleAuthenticator`: any
user name, one shared password), starts the server with its proxy on two free loopback
ports, and waits for its health route. Leaving the `with` block stops it, and kills any
scheduler or worker process it left (they are its children), also when the test failed.

    with GatewayServer(tmp_path) as gateway:
        Gateway(gateway.address, auth=BasicAuth("student", gateway.password))
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests import os_helpers
from tests.os_helpers import free_port
from tests.waiting import until

#: Server config letting users set their clusters' environment (a `Mapping` cluster option).
OFFER_ENVIRONMENT = (
    "from dask_gateway_server.options import Mapping, Options\n"
    "c.Backend.cluster_options = Options(Mapping('environment', default={}))\n"
)


class GatewayServer:
    """dask-gateway-server on 127.0.0.1; `address` is what `Gateway(...)` takes."""

    def __init__(self, folder: Path, *, extra_config: str | None = None):
        self.folder = folder
        # Lines of the server's config after the test defaults (default: users may pass an
        # `environment`, as nbcluster's notice tells an administrator to allow).
        self.extra_config = OFFER_ENVIRONMENT if extra_config is None else extra_config
        self.password = secrets.token_hex(8)
        self.port, private = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.port}"
        self._private = private
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = folder / "gateway.log"

    def config(self, profile: str = "campus", password: str | None = None) -> dict[str, Any]:
        """Dask settings (for `dask.config.set`) with a `gateway` profile for this server: the
        address in the profile's options (they go to `GatewayCluster`), the credentials in
        dask-gateway's own `gateway.auth` section, as a user would keep them."""
        auth = {"username": "student", "password": self.password if password is None else password}
        return {
            f"nbcluster.profiles.{profile}": {
                "backend": "gateway",
                "description": "Test dask-gateway on loopback",
                "options": {"address": self.address},
            },
            "gateway.auth.type": "basic",
            "gateway.auth.kwargs": auth,
        }

    def write_config(self, folder: Path, **kwargs: Any) -> Path:
        """`config(**kwargs)` as a YAML file in `folder`, for `DASK_CONFIG` of a kernel or server."""
        nested: dict[str, Any] = {}
        for dotted, value in self.config(**kwargs).items():
            *parents, last = dotted.split(".")
            node = nested
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "gateway.yaml"
        path.write_text(yaml.safe_dump(nested))
        return folder

    def __enter__(self) -> GatewayServer:
        command = shutil.which("dask-gateway-server", path=str(Path(sys.executable).parent))
        if command is None:
            pytest.fail("dask-gateway-server is missing: `pip install 'dask-gateway-server[local]'`")
        dask = str(Path(sys.executable).parent / "dask")
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "gateway_config.py"
        config.write_text(
            "c.DaskGateway.backend_class = 'dask_gateway_server.backends.local.UnsafeLocalBackend'\n"
            "c.DaskGateway.authenticator_class = 'dask_gateway_server.auth.SimpleAuthenticator'\n"
            f"c.SimpleAuthenticator.password = {self.password!r}\n"
            f"c.DaskGateway.address = '127.0.0.1:{self._private}'\n"
            f"c.Proxy.address = '127.0.0.1:{self.port}'\n"
            f"c.ClusterConfig.scheduler_cmd = [{dask!r}, 'scheduler']\n"
            f"c.ClusterConfig.worker_cmd = [{dask!r}, 'worker']\n"
            f"c.LocalBackend.clusters_directory = {str(self.folder / 'clusters')!r}\n"
            # Small workers: the test machine has 2 cores and other tests running.
            "c.ClusterConfig.worker_cores = 1\nc.ClusterConfig.worker_memory = '1 G'\n"
            "c.ClusterConfig.scheduler_memory = '1 G'\n" + self.extra_config
        )
        with self.log.open("wb") as out:
            # PYTHONPATH reaches the clusters' processes (the backend's inherited_environment).
            self.proc = subprocess.Popen(
                [command, "-f", str(config)], cwd=self.folder, stdout=out, stderr=subprocess.STDOUT,
                env=os.environ.copy(),
            )  # fmt: skip
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _wait_healthy(self, timeout: float = 30) -> None:
        # No event to await from another process: poll its health route until it answers.
        proc = self.proc
        assert proc is not None

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.address}/api/health", timeout=2) as r:
                return bool(json.load(r).get("status") == "pass")

        if until(lambda: proc.poll() is not None or healthy(), timeout, 0.1, ignore=(OSError,)) and proc.poll() is None:
            return
        pytest.fail(f"dask-gateway-server did not come up at {self.address}: {self.log.read_text()[-800:]}")

    def clusters_running(self) -> list[psutil.Process]:
        """The scheduler and worker processes the gateway runs now."""
        assert self.proc is not None
        return [p for p in os_helpers.family(self.proc.pid, gone_ok=True) if p.pid != self.proc.pid and _is_dask_process(_cmd(p))]

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None:
            return
        family = os_helpers.family(self.proc.pid, gone_ok=True)
        # SIGTERM lets the gateway stop its clusters; whatever is left after that is killed.
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for p in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(family, timeout=10)
        self.proc = None


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


@pytest.fixture(scope="module")
def gateway_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """A dask-gateway server on loopback for the tests of one module; stopped afterwards."""
    with GatewayServer(tmp_path_factory.mktemp("gateway")) as server:
        yield server


def _is_dask_process(cmd: list[str]) -> bool:
    # The gateway's clusters run `dask scheduler` / `dask worker`; its proxy is no cluster.
    return len(cmd) > 2 and Path(cmd[1]).name == "dask" and cmd[2] in ("scheduler", "worker")
