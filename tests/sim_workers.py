"""Many lightweight Dask workers in one process: a simulation of a large cluster.

A real cluster of 200 or 1,000 workers needs as many processes (and cores); this hosts
`count` real `distributed.Worker` objects (no nanny, one thread each) on one event loop,
all connected to a real scheduler over its TLS. To the scheduler, and to everything that
asks it, they are ordinary workers; only their CPU is shared. Used by tests/test_scale.py
and bench/scale.py, and named a simulation wherever a figure comes from it.

    python -m tests.sim_workers ADDRESS TLS_JSON COUNT HOST PREFIX

prints ``ready`` once every worker has joined, and exits when stdin closes: at once, as a
machine that goes away would (the scheduler drops workers whose connections close).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from distributed import Worker

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


if __name__ == "__main__":
    address, tls, count, host, prefix = sys.argv[1:6]
    asyncio.run(main(address, tls, int(count), host, prefix))
