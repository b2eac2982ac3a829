"""A real OpenSSH server for the SSH backend's tests, with keys generated for the test.

`SSHServer` runs `/usr/sbin/sshd` in the foreground (so that it is this process's child)
from a configuration, host key and client key written to a temporary folder; it listens on
one address only, 127.0.0.1 by default, or an address inside a network namespace
(`netns_service`). Leaving the `with` block stops sshd and every process its sessions left
behind (Dask schedulers and workers started over SSH), also when the test failed.

    with SSHServer(tmp_path) as server:
        SSHCluster(["127.0.0.1"] * 2, connect_options=server.connect_options(), ...)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import os_helpers
from tests.os_helpers import free_port

SSHD = "/usr/sbin/sshd"


def keypair(path: Path) -> Path:
    """A fresh ed25519 key at `path` (and `path`.pub), with no passphrase."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


class SSHServer:
    """sshd on `host:port`, accepting only `client_key`, as root; `netns` runs it inside a
    network namespace. `env` is set in every session (sshd's `SetEnv`), so that a
    "remote" Python finds the code under test as the local one does."""

    def __init__(
        self,
        folder: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        netns: str | None = None,
        client_key: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.folder = folder
        self.host = host
        self.port = port or (22 if netns else free_port(host))
        self.netns = netns
        self.client_key = client_key
        self.env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def connect_options(self) -> dict[str, Any]:
        """asyncssh options for this server, as `SSHCluster(connect_options=...)` takes them."""
        assert self.client_key is not None
        return {"known_hosts": None, "client_keys": [str(self.client_key)], "port": self.port, "username": "root"}

    def __enter__(self) -> SSHServer:
        if not Path(SSHD).exists():
            pytest.fail(f"{SSHD} is missing: `apt-get install -y openssh-server` (.ci/run does)")
        self.folder.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        host_key = keypair(self.folder / "host_key")
        if self.client_key is None:
            self.client_key = keypair(self.folder / "client_key")
        authorized = self.folder / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        authorized.chmod(0o600)
        setenv = " ".join(f'{k}="{v}"' for k, v in self.env.items())
        conf = self.folder / "sshd_config"
        conf.write_text(
            f"Port {self.port}\nListenAddress {self.host}\nHostKey {host_key}\n"
            f"PidFile {self.folder / 'sshd.pid'}\nAuthorizedKeysFile {authorized}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n"
            f"SetEnv {setenv}\nLogLevel ERROR\n"
        )
        log = self.folder / "sshd.log"
        command = [SSHD, "-D", "-e", "-f", str(conf)]
        if self.netns:
            command = ["ip", "netns", "exec", self.netns, *command]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            self._wait_listening(log)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _wait_listening(self, log: Path, timeout: float = 10) -> None:
        # The only readiness signal sshd gives is its port: probe it (from inside the
        # namespace when it runs in one; this process cannot reach that address).
        probe = [sys.executable, "-c", _PROBE, self.host, str(self.port), str(timeout)]
        if self.netns:
            probe = ["ip", "netns", "exec", self.netns, *probe]
        assert self.proc is not None
        ready = subprocess.run(probe, capture_output=True, timeout=timeout + 5)
        if ready.returncode != 0 or self.proc.poll() is not None:
            pytest.fail(f"sshd did not start on {self.host}:{self.port}: {log.read_text().strip()[-500:]}")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None:
            return
        # Sessions outlive the daemon: stop what they started (processes of this test only).
        family = os_helpers.family(self.proc.pid, gone_ok=True)
        for p in family:
            _kill(p)
        psutil.wait_procs(family, timeout=10)
        self.proc.wait(timeout=10)
        self.proc = None


_PROBE = """
import socket, sys, time
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    try:
        socket.create_connection((host, port), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)
"""


def _kill(p: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        p.kill()


@pytest.fixture
def ssh_server(tmp_path: Path) -> Iterator[SSHServer]:
    """sshd on 127.0.0.1 with a key generated for this test; stopped afterwards."""
    with SSHServer(tmp_path / "sshd") as server:
        yield server
