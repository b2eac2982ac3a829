"""A notebook kernel on one of the network-namespace hosts, and the `ssh` profile across them.

Shared by the tests that run a cluster across `netns_service.Hosts`: the kernel on host 0,
the scheduler on host 1, one worker on each further host (`tests/test_netns.py`,
`tests/test_ranks.py`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from tests.netns_service import Hosts


def profile(hosts: Hosts) -> dict[str, Any]:
    return {
        "backend": "ssh",
        "description": "Three hosts behind a bridge",
        "options": {
            "hosts": hosts.addresses[1:],  # the scheduler's host first, then one per worker
            "connect_options": hosts.connect_options(),
            # Each host's own address: its only interface besides loopback.
            "scheduler_options": {"interface": "eth0", "port": 0, "worker_ttl": "5s"},
            "worker_options": {"interface": "eth0", "nthreads": 1},
            "remote_python": sys.executable,
        },
    }


class Kernel:
    """A real IPython kernel on host `i`, reached over ZeroMQ `ipc` sockets in `folder`."""

    def __init__(self, hosts: Hosts, i: int, folder: Path, env: dict[str, str]):
        spec = folder / "kernels" / "netns"
        spec.mkdir(parents=True)
        argv = [*hosts.prefix(i), sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(
            json.dumps({"argv": argv, "env": env, "display_name": f"host {i}", "language": "python"})
        )
        self.km = KernelManager(kernel_name="netns", transport="ipc", ip=str(folder / "kernel-ipc"))
        self.km.kernel_spec_manager = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])

    def __enter__(self) -> Kernel:
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        return self

    def run(self, code: str, timeout: float = 120, **expressions: str) -> dict[str, Any]:
        """Run a cell; returns the user expressions' values (JSON-decoded)."""
        reply = self.kc.execute_interactive(code, timeout=timeout, user_expressions=expressions)
        return self._values(reply)

    def _values(self, reply: dict[str, Any]) -> dict[str, Any]:
        content = reply["content"]
        assert content["status"] == "ok", f"{content.get('ename')}: {content.get('evalue')}"
        out = {}
        for name, value in content["user_expressions"].items():
            assert value["status"] == "ok", (name, value)
            out[name] = json.loads(eval(value["data"]["text/plain"]))  # a repr of a JSON string
        return out

    def __exit__(self, *exc: Any) -> None:
        self.kc.stop_channels()
        # Killing the kernel is the owner going away: its supervisor stops the cluster.
        self.km.shutdown_kernel(now=True)
