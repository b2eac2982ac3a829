"""The light SIMULATION of workers (tests/sim_light.py) that bench/plugin_scale.py puts 1,000
of on a 2-core machine: to a real scheduler they must be workers that join, heartbeat, take
tasks and report them finished, and leave when their process ends."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from distributed import Client, Scheduler, wait

from nbcluster.metrics import install

ROOT = Path(__file__).resolve().parent.parent


def test_light_workers_join_heartbeat_finish_tasks_and_leave() -> None:
    async def main() -> None:
        async with Scheduler(dashboard_address=":0", port=0) as s:
            plugin = await install(s)
            env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.sim_light", s.address, "null", "40", "4", "light",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env,
            )  # fmt: skip
            assert proc.stdout is not None and proc.stdin is not None
            try:
                assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
                assert len(s.workers) == 40
                assert {ws.host for ws in s.workers.values()} == {f"127.0.0.{10 + k}" for k in range(4)}
                first = {a: ws.metrics["time"] for a, ws in s.workers.items()}
                async with Client(s.address, asynchronous=True) as c:
                    futures = c.map(int, range(400), pure=False)
                    await wait(futures, timeout=60)  # not gathered: nothing listens at a simulated worker
                    assert {f.status for f in futures} == {"finished"}
                finished = plugin.nbcluster_metrics()["tasks"]
                assert len(finished) == 400 and len({t["worker"] for t in finished}) > 10
                # Heartbeats: every worker's sample is renewed (40 workers: every second).
                while any(s.workers[a].metrics["time"] == t for a, t in first.items()):
                    await asyncio.sleep(0.1)
                # Its report each second: tasks done (each once) and heartbeats answered.
                while True:
                    line = (await asyncio.wait_for(proc.stdout.readline(), 10)).split()
                    assert line[0] == b"done" and int(line[1]) <= 400, line
                    if int(line[1]) == 400 and int(line[3]) >= 40:
                        break
            finally:
                proc.stdin.close()
                await proc.wait()
            while s.workers:  # their streams closed with the process: the scheduler lets them go
                await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(main(), 120))
