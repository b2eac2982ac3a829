"""Many lightweight Dask workers in one process: a simulation of a large cluster.

A real cluster of 200 or 1,000 workers needs as many processes (and cores); this hosts
`count` real `distributed.Worker` objects (no nanny, one thread each) on one event loop,
all connected to a real scheduler over its TLS. To the scheduler, and to everything that
asks it, they are ordinary workers; only their CPU is shared. Used by tests/test_scale.py
and bench/scale.py, and named a simulation wherever a figure comes from it.

    python -m tests.sim_workers ADDRESS TLS_JSON COUNT HOST PREFIX

prints ``ready`` once every worker has joined, and exits when stdin closes: at once, as a
machine that goes away would (the scheduler drops workers whose connections close).

`SimulatedGroup` makes such a process something a cluster can start itself: a SpecCluster
worker-spec entry (`group_spec`) that stands for `count` workers, as a dask-jobqueue job
with several processes does, so that adaptivity's scale-up starts one process per entry
and its scale-down stops it. `use_groups` (run on the scheduler) makes it the template of
new CPU workers of an nbcluster cluster: the only way its CPU workers can grow to 1,000 on
2 cores. A simulation, named so wherever a figure comes from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from distributed import Worker
from distributed.deploy.spec import ProcessInterface

from nbcluster.cluster.credentials import security_from


async def main(address: str, tls: str, count: int, host: str, prefix: str) -> None:
    security = security_from(json.loads(tls)) if tls != "null" else None
    workers = [
        Worker(
            address,
            nthreads=1,
            memory_limit="1GiB",
            name=f"{prefix}-{i}",
            host=host,
            security=security,
            dashboard=False,
        )
        for i in range(count)
    ]
    await asyncio.gather(*workers)
    print("ready", flush=True)
    # Until the test (or benchmark) closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    os._exit(0)  # closing 50 workers one by one takes seconds and shows nothing


ROOT = Path(__file__).resolve().parent.parent


class SimulatedGroup(ProcessInterface):
    """One process of `count` simulated workers, named ``NAME-0`` ... (the entry's `group`).

    Its loopback address is 127.0.0.(10 + the number in its name, modulo 240): each entry a
    "host" to the scheduler, as its own machine would be. `start` returns once the process
    is spawned (as a batch job's submission does); its workers join meanwhile.
    """

    def __init__(self, scheduler: str, *, name: str, count: int, tls: Any):
        super().__init__(scheduler, name)
        self.scheduler, self.name, self.count, self.tls = scheduler, name, count, tls
        number = re.findall(r"\d+", name)
        self.host = f"127.0.0.{10 + int(number[-1]) % 240 if number else 10}"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        argv = [sys.executable, "-m", "tests.sim_workers", self.scheduler, json.dumps(self.tls),
                str(self.count), self.host, self.name]  # fmt: skip
        # Its own process group, so that a kill reaches it alone; stdin is its lifeline.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=ROOT, env=env,
                                     start_new_session=True)  # fmt: skip
        await super().start()

    async def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # its workers leave at once (see `main`)
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        await super().close()


def group_spec(count: int, tls: Any) -> dict[str, Any]:
    """A worker-spec entry that stands for `count` simulated workers in one process.

    Parameters
    ----------
    count : int
        Workers in the process.
    tls : object
        The cluster's TLS credential paths (its registry entry's ``tls``), or None.

    Returns
    -------
    dict
        ``{"cls", "options", "group"}``, as `SpecCluster` takes it.
    """
    return {"cls": SimulatedGroup, "options": {"count": count, "tls": tls},
            "group": [f"-{i}" for i in range(count)]}  # fmt: skip


def use_groups(count: int, tls: Any, dask_scheduler: Any = None) -> str:
    """On an nbcluster scheduler: new CPU workers of its cluster come as `group_spec`s.

    The supervisor imports this module by name (PYTHONPATH has the repository: the tests'
    conftest and the benchmarks set it for the processes they start).

    Parameters
    ----------
    count : int
        Workers per process.
    tls : object
        The cluster's TLS credential paths.
    dask_scheduler : distributed.Scheduler
        Given by `Client.run_on_scheduler`.

    Returns
    -------
    str
        The cluster's class name.
    """
    cluster = dask_scheduler.handlers["nbcluster_adapt"].__self__.deployment.cluster
    cluster.new_spec = group_spec(count, tls)
    return type(cluster).__name__


class Backlog:
    """A backlog reported to an nbcluster scheduler as a running `%%distribute` reports it:
    renewed every half second (a report not renewed within `BACKLOG_TTL`, 10 s, counts no
    more, as from a kernel that died), withdrawn by `stop`. A thread, since a real run's
    report also comes from outside the scheduler's loop."""

    def __init__(self, client: Any, items: int, seconds: float, run: str = "sim-backlog"):
        import threading

        self.client, self.run = client, run
        self._stop = threading.Event()
        self._report(items, seconds)  # the first at once: the caller times from here
        self._thread = threading.Thread(target=self._renew, args=(items, seconds), daemon=True)
        self._thread.start()

    def _report(self, items: int, seconds: float) -> None:
        self.client.sync(self.client.scheduler.nbcluster_backlog, run=self.run, kind="cpu", items=items,
                         seconds=seconds)  # fmt: skip

    def _renew(self, items: int, seconds: float) -> None:
        while not self._stop.wait(0.5):
            self._report(items, seconds)

    def stop(self) -> None:
        """Withdraw the report (the run ended)."""
        self._stop.set()
        self._thread.join(30)
        self._report(0, 0.0)


if __name__ == "__main__":
    address, tls, count, host, prefix = sys.argv[1:6]
    asyncio.run(main(address, tls, int(count), host, prefix))
