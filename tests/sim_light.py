"""A SIMULATION of many Dask workers, light enough that 1,000 of them in one process leave the
CPU of a 2-core machine to the scheduler: the load of 1,000 tasks a second at 1,000 workers,
which real workers (tests/sim_workers.py: real `distributed.Worker`s, 1.5 of the 2 cores at
60 tasks/s) cannot produce here.

Each `LightWorker` speaks Dask's real scheduler protocol over a real comm (TLS where the
scheduler has it): it registers (``register-worker``, the version table and a heartbeat
sample included), keeps the batched stream a Worker keeps, heartbeats on the interval the
scheduler asks for (``heartbeat_worker`` with a made-up system-monitor sample: CPU, memory,
network), answers ``compute-task`` at once with ``task-finished`` (a 28-byte int, computed
in no time, so the scheduler does its whole per-task work: transitions, plugins, the
client's report) and ``steal-request`` with "already done". So the scheduler's side is real,
per task and per worker; the workers' side is not:

- nothing runs: no task function is unpickled or called, no result exists;
- nothing listens at a worker's address: anything that connects to a worker (gathering a
  result, ``Client.run``, worker plugins) fails; a benchmark must release its results
  unread, as `bench/plugin_scale.py` does;
- the CPU and memory a worker reports are invented (CPU: a few percent, more after tasks).

    python -m tests.sim_light ADDRESS TLS_JSON COUNT HOSTS PREFIX

starts COUNT workers named PREFIX-0 ... spread over HOSTS loopback addresses (127.0.0.10,
.11, ...: each a "host" to the scheduler), prints ``ready`` once all joined, then a line of
``done N beats N failed N`` (tasks finished, heartbeats answered and failed) every second, and exits when stdin closes (the scheduler drops workers
whose streams close). Named a simulation wherever a figure comes from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import time
import uuid
from typing import Any

from distributed.batched import BatchedSend
from distributed.comm import connect
from distributed.comm.core import CommClosedError
from distributed.core import ConnectionPool
from distributed.versions import get_versions

from nbcluster.cluster.credentials import security_from

MEMORY_LIMIT = 2**30


class LightWorker:
    """One simulated worker: a registration, a batched stream, heartbeats; no thread, no
    listener, no data (see the module docstring).

    Parameters
    ----------
    scheduler : str
        The scheduler's address.
    address : str
        The address the worker claims (nothing listens there).
    name : str
        Its name.
    connection_args : dict
        The comm's arguments (`Security.get_connection_args("worker")`).
    pool : ConnectionPool
        Shared by every worker of the process, for heartbeats.
    heartbeats : bool
        Heartbeat on the scheduler's interval (False: only when `beat` is called, for tests).
    """

    def __init__(self, scheduler: str, address: str, name: str, connection_args: dict[str, Any],
                 pool: ConnectionPool, heartbeats: bool = True):  # fmt: skip
        self.scheduler, self.address, self.name = scheduler, address, name
        self.connection_args, self.pool, self.heartbeats = connection_args, pool, heartbeats
        #: True: tasks are kept, not answered, until `release` (a worker busy with them).
        self.hold = False
        self._held: list[dict[str, Any]] = []
        self.done = self.beats = self.failed_beats = 0
        self._since_beat = 0
        self.interval = 0.5
        self.stream = BatchedSend(interval="2ms")
        self._tasks: list[asyncio.Task[None]] = []

    def metrics(self) -> dict[str, Any]:
        """A heartbeat's metrics in a Worker's shape; the system-monitor part made up."""
        busy, self._since_beat = self._since_beat, 0
        return {
            "task_counts": {},
            "bandwidth": {"total": 100_000_000, "workers": {}, "types": {}},
            "digests_total_since_heartbeat": {},
            "managed_bytes": 0,
            "spilled_bytes": {"memory": 0, "disk": 0},
            "transfer": {
                "incoming_bytes": 0,
                "incoming_count": 0,
                "incoming_count_total": 0,
                "outgoing_bytes": 0,
                "outgoing_count": 0,
                "outgoing_count_total": 0,
            },
            "event_loop_interval": 0.02,
            "cpu": min(100.0, random.uniform(0.0, 4.0) + busy / max(self.interval, 0.5)),
            "memory": 100 * 2**20 + random.randrange(20 * 2**20),
            "time": time.time(),
            "host_net_io": {"read_bps": random.uniform(0, 1e4), "write_bps": random.uniform(0, 1e4)},
            "host_disk_io": {"read_bps": 0.0, "write_bps": 0.0},
            "num_fds": 20,
        }

    async def start(self) -> None:
        """Register with the scheduler, then serve its stream and heartbeat until closed."""
        # Not deserialized: a task's pickled spec is never looked at, so never unpickled.
        comm = await connect(self.scheduler, deserialize=False, **self.connection_args)
        comm.name = "LightWorker->Scheduler"
        await comm.write(
            {"op": "register-worker", "reply": False, "address": self.address, "status": "running",
             "nthreads": 1, "name": self.name, "now": time.time(), "resources": {},
             "memory_limit": MEMORY_LIMIT, "local_directory": "/nonexistent", "services": {}, "nanny": None,
             "pid": os.getpid(), "versions": VERSIONS, "metrics": self.metrics(), "extra": {},
             "stimulus_id": f"light-connect-{time.time()}", "server_id": f"light-{uuid.uuid4().hex}"},
            serializers=["msgpack"],
        )  # fmt: skip
        response = await comm.read(deserializers=["msgpack"])
        if response.get("status") != "OK":
            raise RuntimeError(f"{self.name} was refused: {response!r}")
        self.interval = response["heartbeat-interval"]
        self.stream.start(comm)
        self._tasks = [asyncio.create_task(self._serve(comm))]
        if self.heartbeats:
            self._tasks.append(asyncio.create_task(self._heartbeat()))

    async def _serve(self, comm: Any) -> None:
        send = self.stream.send
        while True:
            try:
                msgs = await comm.read()
            except (CommClosedError, OSError):
                return
            for msg in msgs if isinstance(msgs, (list, tuple)) else (msgs,):
                op = msg.get("op")
                if op == "compute-task":
                    if self.hold:
                        self._held.append(msg)
                    else:
                        self._finish(msg)
                elif op == "steal-request":
                    # Every task finished on arrival: there is nothing left to steal.
                    send({"op": "steal-response", "key": msg["key"], "state": "memory",
                          "stimulus_id": msg.get("stimulus_id")})  # fmt: skip
                elif op == "close":
                    await comm.close()
                    return

    def _finish(self, msg: dict[str, Any]) -> None:
        now = time.time()
        self.done += 1
        self._since_beat += 1
        self.stream.send({"op": "task-finished", "key": msg["key"], "run_id": msg["run_id"], "nbytes": 28,
                          "type": None, "typename": "int", "metadata": {}, "thread": 0,
                          "startstops": [{"action": "compute", "start": now, "stop": now}],
                          "stimulus_id": f"task-finished-{now}", "status": "OK"})  # fmt: skip

    def release(self) -> None:
        """Finish the tasks held (`hold`), and hold no more."""
        self.hold = False
        for msg in self._held:
            self._finish(msg)
        self._held.clear()

    async def beat(self, **metrics: Any) -> None:
        """One heartbeat now, its sample's fields replaced by `metrics` (e.g. ``memory``).

        Parameters
        ----------
        **metrics
            Fields of the heartbeat's metrics to report instead of the made-up ones.
        """
        await self.pool(self.scheduler).heartbeat_worker(
            address=self.address,
            now=time.time(),
            metrics={**self.metrics(), **metrics},
            executing={},
            extensions={},
        )

    async def _heartbeat(self) -> None:
        # Spread out, as workers started at different moments are.
        await asyncio.sleep(random.uniform(0, self.interval))
        while True:
            try:
                answer = await self.pool(self.scheduler).heartbeat_worker(
                    address=self.address, now=time.time(), metrics=self.metrics(), executing={}, extensions={}
                )
            except (CommClosedError, OSError):
                # As a Worker does: a heartbeat that failed is tried again next time.
                self.failed_beats += 1
                await asyncio.sleep(self.interval)
                continue
            if answer.get("status") == "missing":
                return
            self.beats += 1
            self.interval = answer["heartbeat-interval"]
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        """Leave: the stream closes, and the scheduler removes the worker."""
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(CommClosedError, OSError):
            await self.stream.close()


VERSIONS = get_versions()


async def start_workers(scheduler: str, security: Any, count: int, hosts: int, prefix: str,
                        port: int = 20000, heartbeats: bool = True) -> tuple[list[LightWorker], ConnectionPool]:  # fmt: skip
    """Start `count` simulated workers on `hosts` loopback "hosts"; return them and their pool.

    Parameters
    ----------
    scheduler : str
        The scheduler's address (its scheme is theirs).
    security : distributed.Security or None
        The cluster's credentials.
    count : int
        How many workers.
    hosts : int
        Over how many loopback addresses (127.0.0.10, .11, ...), in equal blocks.
    prefix : str
        Their names: PREFIX-0, PREFIX-1, ...
    port : int
        The first of the ports they claim (each its own; nothing listens there).
    heartbeats : bool
        Heartbeat on the scheduler's interval (False: only through `LightWorker.beat`).

    Returns
    -------
    tuple of (list of LightWorker, ConnectionPool)
        The workers, registered; the pool their heartbeats share.
    """
    args = security.get_connection_args("worker") if security is not None else {}
    pool = await ConnectionPool(limit=256, **({"connection_args": args} if args else {}))
    scheme = scheduler.split("://")[0]
    per = -(-count // hosts)
    workers = [
        LightWorker(
            scheduler,
            f"{scheme}://127.0.0.{10 + i // per}:{port + i}",
            f"{prefix}-{i}",
            args,
            pool,
            heartbeats,
        )
        for i in range(count)
    ]
    # 50 at a time: 1,000 TLS handshakes at once would time out on 2 cores.
    for k in range(0, count, 50):
        await asyncio.gather(*(w.start() for w in workers[k : k + 50]))
    return workers, pool


async def main(address: str, tls: str, count: int, hosts: int, prefix: str) -> None:
    logging.getLogger("distributed").setLevel(logging.WARNING)  # a pool's notes, a line per comm
    security = security_from(json.loads(tls)) if tls != "null" else None
    workers, _ = await start_workers(address, security, count, hosts, prefix)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    stdin = loop.run_in_executor(None, sys.stdin.read)
    while not stdin.done():
        await asyncio.wait([stdin], timeout=1.0)
        print("done", sum(w.done for w in workers), "beats", sum(w.beats for w in workers),
              "failed", sum(w.failed_beats for w in workers), flush=True)  # fmt: skip
    os._exit(0)  # the scheduler sees every stream close at once, as machines going away


if __name__ == "__main__":
    address, tls, count, hosts, prefix = sys.argv[1:6]
    asyncio.run(main(address, tls, int(count), int(hosts), prefix))
