"""Several "hosts" on one machine: network namespaces joined by a bridge, an sshd in each.

`Hosts(folder, count)` makes, as root, with `ip netns`:

- a namespace `nbc<pid>-sw` holding only a bridge (the network's switch);
- namespaces `nbc<pid>-h0` ... `h<count-1>`, each a host with one interface `eth0` at
  `10.213.<n>.<i+1>/24`, cabled to the bridge by a veth pair, and its own loopback;
- an sshd in each host (`ssh_service.SSHServer`), all accepting one generated client key.

No address exists outside these namespaces: nothing the test sends can leave them, and
the machine's own network is never touched. Processes reach the hosts by running in one of
them (`run_in`, or `ip netns exec` in a kernel's command line). Everything is removed on
leaving the `with` block, also when the test failed or the set-up broke half way: the sshds
and what their sessions started, any other process left in the namespaces, the namespaces
(which removes their links).

`cut(i)` takes host i's cable out (its switch-side veth goes down): its processes keep
running, but nothing reaches them, as when a machine drops off the network. `mend(i)` puts
the cable back.

Where namespaces cannot be made (no root, no `ip`), entering fails the test with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ssh_service import SSHServer, keypair


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Hosts:
    """`count` hosts in network namespaces, each running sshd on port 22 of its address."""

    def __init__(self, folder: Path, count: int = 3, *, ssh_env: dict[str, str] | None = None):
        self.folder = folder
        self.count = count
        self.ssh_env = ssh_env
        tag = f"nbc{os.getpid()}"
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-h{i}" for i in range(count)]
        subnet = 10 + os.getpid() % 240  # distinct per test process, inside 10.213/16
        self.addresses = [f"10.213.{subnet}.{i + 1}" for i in range(count)]
        self._cables = [f"{tag}h{i}" for i in range(count)]  # switch-side veth ends (<=15 chars)
        self.client_key: Path | None = None
        self._servers: list[SSHServer] = []
        self._made: list[str] = []

    def __enter__(self) -> Hosts:
        if os.geteuid() != 0:
            pytest.fail("the multi-host test needs root to create network namespaces (`ip netns`); .ci/run has it")
        if shutil.which("ip") is None:
            pytest.fail("the multi-host test needs `ip` from iproute2: `apt-get install -y iproute2`")
        try:
            self._build()
        except subprocess.CalledProcessError as e:
            self.__exit__(*sys.exc_info())
            if e.cmd[0] != "ip":
                raise
            pytest.fail(f"cannot create network namespaces here: `{' '.join(e.cmd)}` said {e.stderr.strip()!r}")
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _build(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for ns in (self.switch, *self.names):
            _ip("netns", "add", ns)
            self._made.append(ns)
        sw = ("-n", self.switch)
        _ip(*sw, "link", "add", "br0", "type", "bridge")
        _ip(*sw, "link", "set", "br0", "up")
        for ns, cable, address in zip(self.names, self._cables, self.addresses, strict=True):
            # Both ends are created inside the switch's namespace, so no link ever exists
            # in the machine's own; one end then moves into the host and becomes its eth0.
            _ip(*sw, "link", "add", cable, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip(*sw, "link", "set", cable, "master", "br0")
            _ip(*sw, "link", "set", cable, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        self.client_key = keypair(self.folder / "client_key")
        for i, (ns, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            server = SSHServer(
                self.folder / f"sshd-{i}", address, 22, netns=ns, client_key=self.client_key, env=self.ssh_env
            )
            self._servers.append(server.__enter__())

    def connect_options(self) -> dict[str, Any]:
        """asyncssh options for every host's sshd (`SSHCluster(connect_options=...)`)."""
        return self._servers[0].connect_options()

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program on host i."""
        return ["ip", "netns", "exec", self.names[i]]

    def run_in(self, i: int, *command: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix(i), *command], capture_output=True, text=True, **kwargs)

    def pids(self, i: int) -> list[int]:
        """The processes running on host i."""
        return [int(pid) for pid in _ip("netns", "pids", self.names[i], check=False).stdout.split()]

    def cut(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", self._cables[i], "down")

    def mend(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", self._cables[i], "up")

    def __exit__(self, *exc: Any) -> None:
        for server in reversed(self._servers):
            try:
                server.__exit__(None, None, None)
            except Exception as e:  # the namespaces below must go whatever happened here
                print(f"netns_service: stopping {server.netns}'s sshd: {e}", file=sys.stderr)
        self._servers = []
        for ns in reversed(self._made):
            # A process still in a namespace (one the test started there) would keep its
            # network alive after `ip netns del`; it belongs to this test, so end it.
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", ns, check=False)
        self._made = []


def leftover_namespaces() -> list[str]:
    """Namespaces this process made and did not remove (for the tests of this module)."""
    tag = f"nbc{os.getpid()}-"
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag)]


def driver_env(folder: Path, profile: dict[str, Any]) -> dict[str, str]:
    """The environment of a process that starts clusters of `profile` (as ``hosts``) on a host.

    Its Dask config (written in ``folder/dask``) and registry (``folder/runtime``) of its own;
    of this process's environment only PATH, PYTHONPATH, HOME and LANG.
    """
    config = folder / "dask"
    config.mkdir()
    (config / "hosts.yaml").write_text(yaml.safe_dump({"nbcluster": {"profiles": {"hosts": profile}}}))
    return {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")},
        "DASK_CONFIG": str(config),
        "NBCLUSTER_RUNTIME_DIR": str(folder / "runtime"),
    }
