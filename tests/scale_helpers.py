"""A real nbcluster cluster with hundreds of simulated workers (see tests/sim_workers.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def simulated_workers(handle, per_process: int, processes: int, timeout: float = 90) -> Iterator[list[str]]:
    """`processes` processes of `per_process` workers each, joined to `handle`'s scheduler,
    each process on its own loopback address (127.0.0.2, .3, ...: "hosts" to the scheduler).
    Yields those host addresses; closes every worker on exit, also on failure."""
    hosts = [f"127.0.0.{2 + k}" for k in range(processes)]
    tls = json.dumps(handle.entry.get("tls"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.sim_workers",
                handle.address,
                tls,
                str(per_process),
                host,
                f"sim{k}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for k, host in enumerate(hosts)
    ]
    try:
        for p in procs:
            ready = threading.Event()

            def wait(p: subprocess.Popen[str] = p, ready: threading.Event = ready) -> None:
                if p.stdout is not None and p.stdout.readline().strip() == "ready":
                    ready.set()

            threading.Thread(target=wait, daemon=True).start()
            if not ready.wait(timeout):
                raise RuntimeError(f"simulated workers on {p.args[5]} did not start in {timeout} s")
        yield hosts
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.close()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
