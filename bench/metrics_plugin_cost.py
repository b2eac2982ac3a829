"""Scheduler CPU cost of nbcluster's MetricsPlugin at 50 tasks/s (target: under 2%).

Two measurements:

1. End to end: a real `dask scheduler` process (with and without
   ``--preload nbcluster.metrics.preload``), two single-threaded workers, a client that
   submits 50 tiny tasks per second for DURATION seconds, and -- when the plugin is on -- a
   reader calling ``nbcluster_metrics(since=cursor)`` 4 times a second, as the live widget
   does. The scheduler process's CPU time (user + system) over the window is compared.
   Runs alternate (off, on, off, on, ...) to spread drift; the machine's other load is
   noise in this number.
2. In isolation: the plugin's own code timed directly -- one `transition` call per
   finished task, one heartbeat sample per worker per 0.5 s, one RPC per 0.25 s -- which
   gives the cost at 50 tasks/s without the noise.

Run: .venv/bin/python bench/metrics_plugin_cost.py [--duration 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time

import psutil

RATE = 50  # tasks per second


def tiny(x: int) -> int:
    return x + 1


def _start(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _scheduler(plugin: bool, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
           "--port", str(port), "--dashboard-address", ":0", "--no-show"]  # fmt: skip
    if plugin:
        cmd += ["--preload", "nbcluster.metrics.preload"]
    return _start(cmd)


def end_to_end(plugin: bool, duration: float, port: int) -> float:
    """Percent of one core the scheduler process used during the window."""
    from distributed import Client

    address = f"tcp://127.0.0.1:{port}"
    procs = [_scheduler(plugin, port)]
    try:
        for _ in range(2):
            procs.append(_start([sys.executable, "-m", "distributed.cli.dask_worker", address,
                                 "--nthreads", "1", "--nworkers", "1", "--no-dashboard"]))  # fmt: skip
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            client.gather(client.map(tiny, range(100), pure=False))  # warm up
            stop = threading.Event()

            def reader() -> None:
                cursor = None
                while not stop.wait(0.25):
                    snap = client.sync(client.scheduler.nbcluster_metrics, since=cursor)
                    cursor = snap["cursor"]

            sched = psutil.Process(procs[0].pid)
            t_reader = threading.Thread(target=reader, daemon=True) if plugin else None
            cpu0 = sum(sched.cpu_times()[:2])
            t0 = time.perf_counter()
            if t_reader:
                t_reader.start()
            futures = []
            n = int(duration * RATE)
            for i in range(n):
                # Pace submissions on the clock, not by sleeping a fixed step, so the
                # rate holds however long a submit takes.
                delay = t0 + i / RATE - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(client.submit(tiny, i, pure=False))
                if len(futures) >= 200:
                    client.gather(futures[:100])
                    del futures[:100]
            client.gather(futures)
            wall = time.perf_counter() - t0
            cpu = sum(sched.cpu_times()[:2]) - cpu0
            stop.set()
            if t_reader:
                t_reader.join()
        return 100 * cpu / wall
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def in_isolation() -> dict[str, float]:
    """Microseconds per plugin operation, on a real in-process scheduler."""
    from distributed import Scheduler

    from nbcluster.metrics.plugin import install

    async def main() -> dict[str, float]:
        async with Scheduler(dashboard_address=":0", port=0) as s:
            plugin = await install(s)
            n = 50_000
            kw = {"worker": "tcp://127.0.0.1:1", "stimulus_id": "bench", "nbytes": 28, "type": b"int",
                  "startstops": [{"action": "compute", "start": 1.0, "stop": 1.001}]}  # fmt: skip
            keys = [f"tiny-{i:032x}" for i in range(n)]
            t = time.perf_counter()
            for k in keys:
                plugin.transition(k, "processing", "memory", **kw)
            per_task = (time.perf_counter() - t) / n * 1e6
            # A poll returning 0.25 s worth of new records at 50 tasks/s (~13).
            cursor = plugin.nbcluster_metrics()["cursor"] - 13
            t = time.perf_counter()
            for _ in range(1000):
                plugin.nbcluster_metrics(since=cursor)
            per_poll = (time.perf_counter() - t) / 1000 * 1e6
            return {"transition_us": per_task, "poll_us": per_poll}

    return asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8799)
    args = ap.parse_args()

    iso = in_isolation()
    # Per second at 50 tasks/s and 4 polls/s; sampling costs ~1 us per worker per 0.5 s.
    iso_pct = (RATE * iso["transition_us"] + 4 * iso["poll_us"]) / 1e6 * 100
    print(f"in isolation: transition {iso['transition_us']:.2f} us/task, poll {iso['poll_us']:.0f} us "
          f"-> {iso_pct:.3f}% of one core at {RATE} tasks/s with 4 polls/s")  # fmt: skip

    off, on = [], []
    for r in range(args.repeats):
        off.append(end_to_end(False, args.duration, args.port))
        on.append(end_to_end(True, args.duration, args.port))
        print(f"run {r + 1}: scheduler CPU without plugin {off[-1]:.2f}%, with plugin + reader {on[-1]:.2f}%")
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"median scheduler CPU at {RATE} tasks/s: without {mo:.2f}%, with {mn:.2f}% "
          f"-> plugin cost {mn - mo:+.2f} points of one core ({100 * (mn - mo) / mo:+.1f}% of the "
          f"scheduler's own CPU)")  # fmt: skip


if __name__ == "__main__":
    main()
