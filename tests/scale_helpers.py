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


class Simulated:
    """Processes of simulated workers joining one scheduler, each process on its own loopback
    address (127.0.0.2, .3, ...: "hosts" to the scheduler); `counts` workers in each."""

    def __init__(self, address: str, tls: object, counts: list[int], prefix: str = "sim"):
        self.hosts = [f"127.0.0.{2 + k}" for k in range(len(counts))]
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.sim_workers",
                    address,
                    json.dumps(tls),
                    str(n),
                    host,
                    f"{prefix}{k}",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=env,
            )
            for k, (host, n) in enumerate(zip(self.hosts, counts, strict=True))
        ]

    def wait_ready(self, timeout: float) -> None:
        """Until every process says all its workers joined; RuntimeError past `timeout`."""
        for p in self.procs:
            ready = threading.Event()

            def wait(p: subprocess.Popen[str] = p, ready: threading.Event = ready) -> None:
                if p.stdout is not None and p.stdout.readline().strip() == "ready":
                    ready.set()

            threading.Thread(target=wait, daemon=True).start()
            if not ready.wait(timeout):
                raise RuntimeError(f"simulated workers on {p.args[5]} did not start in {timeout} s")

    def close(self) -> None:
        """Every worker leaves at once (their processes exit, as machines going away)."""
        for p in self.procs:
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.close()

    def wait_closed(self) -> None:
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@contextlib.contextmanager
def simulated_workers(handle, per_process: int, processes: int, timeout: float = 90) -> Iterator[list[str]]:
    """`processes` processes of `per_process` workers each, joined to `handle`'s scheduler,
    each process on its own loopback address (127.0.0.2, .3, ...: "hosts" to the scheduler).
    Yields those host addresses; closes every worker on exit, also on failure."""
    group = Simulated(handle.address, handle.entry.get("tls"), [per_process] * processes)
    try:
        group.wait_ready(timeout)
        yield group.hosts
    finally:
        group.close()
        group.wait_closed()


async def left_on_scheduler(run_id: str, wait: float, dask_scheduler=None) -> dict[str, list[str]]:
    """On the scheduler: the tasks of run `run_id` still there and the runs still reporting
    a backlog (`cluster/adaptive.py`), once none is left or after `wait` seconds (a
    coroutine: the scheduler's loop goes on releasing meanwhile)."""
    import asyncio
    import time

    from nbcluster.cluster.adaptive import backlogs

    deadline = time.monotonic() + wait
    while True:
        left = {
            "tasks": sorted(str(k) for k in dask_scheduler.tasks if run_id in str(k)),
            "backlog": sorted(backlogs(dask_scheduler)._runs),
        }
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.05)
