"""The `ssh` backend: Dask's `SSHCluster` through a profile, against a real sshd on loopback.

Two "hosts" that are the same address, 127.0.0.1: the scheduler runs on the first host
given, the workers on the others, each started by sshd (`ssh_service`), never by nbcluster.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from tests.os_helpers import silent_port
from tests.shell_helpers import cell, magic, one_clear_line
from tests.ssh_service import SSHServer, keypair, ssh_server  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(240)


def profile(server: SSHServer, **connect: Any) -> dict[str, Any]:
    return {
        "backend": "ssh",
        "description": "Two hosts over SSH (both this machine)",
        "options": {
            "hosts": ["127.0.0.1", "127.0.0.1", "127.0.0.1"],  # the scheduler's, then the workers'
            "connect_options": {**server.connect_options(), **connect},
            "worker_options": {"host": "127.0.0.1", "nthreads": 1},
            "scheduler_options": {"host": "127.0.0.1", "port": 0},
            "remote_python": sys.executable,
        },
    }




def started_by_sshd(server: SSHServer) -> list[psutil.Process]:
    assert server.proc is not None
    return psutil.Process(server.proc.pid).children(recursive=True)


def test_distribute_runs_on_ssh_workers_and_stop_ends_them(ssh_server: SSHServer, shell: InteractiveShell) -> None:  # noqa: F811
    with dask.config.set({"nbcluster.profiles.lab": profile(ssh_server)}):
        magic(shell, "start --profile lab --name lab")
        try:
            handle = nbcluster.current()
            info = handle.info()
            assert len(info.workers) == 2, info.workers
            assert {w.get("host") for w in info.workers} == {"127.0.0.1"}, info.workers
            # Per-cluster TLS: the workers over SSH present the cluster's certificate.
            assert handle.address.startswith("tls://"), handle.address

            remote = {p.pid for p in started_by_sshd(ssh_server)}
            out = cell(shell, '%%distribute --over "x in range(40)"\nimport os\n(x + 1, os.getpid())')
            assert [value for value, _ in out] == list(range(1, 41))
            ran_in = {pid for _, pid in out}
            assert ran_in <= remote, f"items ran in processes sshd did not start: {ran_in - remote}"
            # A restart returns with the workers back, so the status it prints shows them.
            assert len(magic(shell, "restart").workers) == 2
        finally:
            spawned = started_by_sshd(ssh_server)
            magic(shell, "stop lab")
        # SSH workers exit with the cluster: sshd's sessions leave nothing behind.
        _, alive = psutil.wait_procs(spawned, timeout=30)
        assert not alive, f"processes started over SSH outlived %cluster stop by 30 s: {alive}"
        assert nbcluster.clusters() == []


def test_a_key_the_host_refuses_is_one_clear_line(
    ssh_server: SSHServer, shell: InteractiveShell, tmp_path: Path,  # noqa: F811
) -> None:  # fmt: skip
    stranger = keypair(tmp_path / "stranger")
    with dask.config.set({"nbcluster.profiles.lab": profile(ssh_server, client_keys=[str(stranger)])}):
        started = time.monotonic()
        with pytest.raises(UsageError) as info:
            magic(shell, "start --profile lab")
    message = str(info.value).strip()
    assert one_clear_line(message), message
    assert "SSH to 127.0.0.1" in message and "Permission denied" in message and "'lab'" in message, message
    assert time.monotonic() - started < 10 + 5  # the connect timeout, and the start's own cost
    assert nbcluster.clusters() == [] and started_by_sshd(ssh_server) == []


def test_a_host_that_never_answers_fails_within_the_connect_timeout(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    # A port that accepts connections and then says nothing, as a host behind a dropping
    # firewall does: only the connect timeout ends the wait.
    with silent_port() as port:
        server = SSHServer(tmp_path / "unused", port=port)
        server.client_key = keypair(tmp_path / "key")
        settings = {"nbcluster.profiles.lab": profile(server), "nbcluster.timeouts.connect": "3s"}
        with dask.config.set(settings):
            started = time.monotonic()
            with pytest.raises(UsageError) as info:
                magic(shell, "start --profile lab")
            took = time.monotonic() - started
    message = str(info.value).strip()
    assert "\n" not in message and "no SSH answer from 127.0.0.1" in message, message
    assert "nbcluster.timeouts.connect" in message and "'lab'" in message, message
    assert 3 <= took < 3 + 10, took
    assert nbcluster.clusters() == []
