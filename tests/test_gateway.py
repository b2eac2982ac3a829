"""The `gateway` backend against a real dask-gateway server on loopback (`gateway_service`).

The profile names the gateway's address; the credentials sit in dask-gateway's own
`gateway.auth` config, in a YAML file of a `DASK_CONFIG` folder, as a user keeps them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import config
from nbcluster.cluster.info import ClusterList
from tests.gateway_service import GatewayServer, gateway_server  # noqa: F401 - fixture
from tests.lifecycle_helpers import JupyterServer
from tests.os_helpers import silent_port
from tests.shell_helpers import cell, magic, one_clear_line

pytestmark = pytest.mark.timeout(300)


def use_gateway(server: GatewayServer, folder: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Any:
    """This process and the clusters it starts see `server.config(**kwargs)`."""
    monkeypatch.setenv("DASK_CONFIG", str(server.write_config(folder, **kwargs)))
    return dask.config.set(server.config(**kwargs))




def test_profile_starts_scales_lists_and_stops_a_gateway_cluster(
    gateway_server: GatewayServer, shell: InteractiveShell, runtime_dir: Path, tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with use_gateway(gateway_server, tmp_path / "dask", monkeypatch):
        magic(shell, "start --profile campus --name campus")
        try:
            handle = nbcluster.current()
            # The spare supervisor's forkserver for local workers went: the workers are the gateway's.
            supervisor = psutil.Process(handle.entry["supervisor_pid"])
            assert not [p for p in supervisor.children() if "multiprocessing.forkserver" in " ".join(p.cmdline())]
            magic(shell, "scale 2")
            # The gateway starts workers after the request returns, as a batch system would.
            handle.client.wait_for_workers(2, timeout=120)
            info = handle.info()
            assert len(info.workers) == 2, info.workers
            # The workers are the gateway's processes, not ones nbcluster spawned here.
            gateway_workers = {p.pid for p in gateway_server.clusters_running() if "worker" in p.cmdline()}
            assert len(gateway_workers) == 2

            out = cell(shell, '%%distribute --over "x in range(30)"\nimport os\n(x * x, os.getppid())')
            assert [value for value, _ in out] == [x * x for x in range(30)]
            # Each item ran in a worker process whose parent is one of the gateway's workers.
            ran_under = {parent for _, parent in out}
            assert ran_under <= gateway_workers | {p.pid for p in _children(gateway_workers)}, ran_under

            listing = magic(shell, "list")
            assert isinstance(listing, ClusterList) and "campus" in repr(listing)
            with JupyterServer(tmp_path / "server", env={"NBCLUSTER_RUNTIME_DIR": str(runtime_dir)}) as server:
                status, body = server.api("GET", "api/clusters")
            assert status == 200, body
            [row] = [c for c in body["clusters"] if c["name"] == "campus"]
            assert row["state"] == "running" and len(row["workers"]) == 2, row
        finally:
            running = gateway_server.clusters_running()
            magic(shell, "stop campus")
        # Stop shuts the gateway cluster down: its scheduler and workers exit on the gateway's
        # first signal (SIGINT), not on the SIGTERM it sends when `sigint_timeout` (10 s) runs out...
        _, alive = psutil.wait_procs(running, timeout=10)
        assert not alive, f"gateway processes outlived %cluster stop by 10 s: {alive}"
        # ...and the gateway no longer lists it.
        assert _gateway_clusters(gateway_server) == []
        assert nbcluster.clusters() == []


def test_wrong_password_is_one_clear_line(
    gateway_server: GatewayServer, shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:  # fmt: skip
    with use_gateway(gateway_server, tmp_path / "dask", monkeypatch, password="not-the-password"):
        started = time.monotonic()
        with pytest.raises(UsageError) as info:
            magic(shell, "start --profile campus")
    message = str(info.value).strip()
    assert one_clear_line(message), message
    assert "refused the credentials" in message and "gateway.auth" in message and "'campus'" in message, message
    assert time.monotonic() - started < 10 + 5  # the connect timeout, and the start's own cost
    assert nbcluster.clusters() == [] and gateway_server.clusters_running() == []


def _children(pids: set[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            out += psutil.Process(pid).children(recursive=True)
    return out


def _gateway_clusters(server: GatewayServer) -> list[str]:
    """The clusters the gateway runs, from its REST API (its Python client's `__del__`
    fails once closed, a warning in every test that uses it)."""
    token = base64.b64encode(f"student:{server.password}".encode()).decode()
    request = urllib.request.Request(f"{server.address}/api/v1/clusters/", headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return list(json.load(response))


def test_a_gateway_that_never_answers_fails_within_the_connect_timeout(shell: InteractiveShell) -> None:
    # Accepts the connection, then says nothing: only the connect timeout ends the wait.
    with silent_port() as port:
        address = f"http://127.0.0.1:{port}"
        profile = {"backend": "gateway", "description": "silent", "options": {"address": address}}
        settings = {"nbcluster.profiles.campus": profile, "nbcluster.timeouts.connect": "3s"}
        with dask.config.set(settings):
            started = time.monotonic()
            with pytest.raises(UsageError) as info:
                magic(shell, "start --profile campus")
            took = time.monotonic() - started
    message = str(info.value).strip()
    assert "\n" not in message and f"the gateway at {address} did not answer within 3 s" in message, message
    assert 3 <= took < 3 + 10, took
    assert nbcluster.clusters() == []


# -- nbcluster's worker environment on the gateway's workers --------------------------------

ENVIRONMENT_ITEM = (
    '%%distribute --over "x in range(2)"\nimport os\n'
    "{k: os.environ.get(k) for k in ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_')}"
)


def expected_environment() -> dict[str, str | None]:
    wanted = config.worker_pre_spawn_environ()
    names = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    return {k: None if wanted.get(k) is None else str(wanted[k]) for k in names}


def start_and_read_environment(
    server: GatewayServer, shell: InteractiveShell, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[dict[str, str | None]]]:
    """`%cluster start` on `server`'s profile (what it printed), and what one worker's items see."""
    with use_gateway(server, folder, monkeypatch):
        started = repr(magic(shell, "start --profile campus --name campus"))
        try:
            magic(shell, "scale 1")
            nbcluster.current().client.wait_for_workers(1, timeout=120)
            return started, list(cell(shell, ENVIRONMENT_ITEM))
        finally:
            magic(shell, "stop campus")


def test_gateway_workers_get_nbclusters_worker_environment(
    gateway_server: GatewayServer, shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:  # fmt: skip
    # The module's gateway offers the `environment` option (gateway_service.OFFER_ENVIRONMENT).
    started, seen = start_and_read_environment(gateway_server, shell, tmp_path / "dask", monkeypatch)
    assert expected_environment()["MALLOC_MMAP_THRESHOLD_"] is not None
    assert seen == [expected_environment()] * 2, seen
    assert "offers no `environment`" not in started, started


def test_a_gateway_without_the_option_says_how_its_administrator_adds_it(
    shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with GatewayServer(tmp_path / "bare", extra_config="") as bare:
        started, seen = start_and_read_environment(bare, shell, tmp_path / "dask-bare", monkeypatch)
    [line] = [line for line in started.splitlines() if "offers no `environment` cluster option" in line]
    assert f"The gateway at {bare.address} " in line and "its administrator can offer one" in line, line
    # Dask's own environment there: what the line warns of.
    assert seen[0]["MALLOC_MMAP_THRESHOLD_"] is None, seen
    # The line's own code, in a gateway's config, gives the workers nbcluster's environment.
    code = line.rsplit("`", 2)[-2].replace("; ", "\n") + "\n"
    with GatewayServer(tmp_path / "told", extra_config=code) as told:
        started, seen = start_and_read_environment(told, shell, tmp_path / "dask-told", monkeypatch)
    assert seen == [expected_environment()] * 2, seen
    assert "offers no `environment`" not in started, started
