"""`--persist` against hand-written `client.submit` futures, measured in the same run.

    python bench/persist.py [--runs 3] [--steps 20] [--write]

On one 2-worker x 1-thread cluster that nbcluster starts, through the Python API
(`distribute(...)`, what `%%distribute` calls), each measurement beside its peer:

1. kernel RSS: persisting 4 results of 100 MB raises the kernel's RSS by (target < 20 MB);
   the peer is 4 `client.submit` futures of the same arrays;
2. two-cell pipeline: persist 8 x 100 MB, then reduce each where it is (`--over "s in
   shards"`); the peer submits the 8 makers, then 8 reducers on their futures, and
   gathers the sums (target: at most 1.1x the peer);
3. step loop: 2 persisted shards, then STEPS steps that each capture the current weights
   (a 1,000-float array) and compute a gradient per shard, reduced in the kernel; the peer
   is `client.submit(grad, shard_future, w)` per shard. This is a step loop of the shape
   `02-training` would have, not that notebook itself (not rewritten yet: issue 23, item 5)
   (target: per-step time at most 1.2x the peer);
4. bytes moved by the reduce cell of (2), from the workers' `transfer_outgoing_bytes_total`
   (worker to worker and worker to kernel): the chained items read their input where it
   is, so only the 8 sums travel.

Medians of `--runs` (pipeline) and of the steps (loop); `--write` replaces the section in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import distributed
import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAKE = "np.full(12_500_000, float(i))"  # 100 MB


def _make(i: int) -> Any:
    return np.full(12_500_000, float(i))


def _grad(shard: Any, w: Any) -> Any:
    return w * 0.0 + float(shard[:1000].sum())


def _sum(a: Any) -> float:
    return float(a.sum())


def _warm(client: Any, nbytes: int = 600_000_000) -> None:
    """Touch and free `nbytes` on each worker, just before a timed pipeline.

    On this machine (a VM) memory freed more than a few seconds ago goes back to the host,
    and touching it again costs 15-20x (a 100 MB `np.full` took 300-500 ms instead of 20 ms,
    measured in a plain Python process): whichever side ran second, right after the other
    freed its 800 MB, would be measured on warm memory. Both sides start warm instead.
    """
    client.run(lambda: float(np.ones(nbytes // 8).sum()))


def _sent(client: Any) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def _settle(client: Any) -> None:
    """Wait until the workers hold nothing of the last measurement."""
    gc.collect()
    deadline = time.monotonic() + 20
    while client.who_has() and any(client.who_has().values()) and time.monotonic() < deadline:
        time.sleep(0.1)


def measure(runs: int, steps: int) -> dict[str, Any]:
    import nbcluster
    from nbcluster.distribute import distribute

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    handle = nbcluster.start(workers=2, threads=1, name="bench-persist")
    client = handle.client
    client.wait_for_workers(2)
    ns: dict[str, Any] = {"np": np}
    out: dict[str, Any] = {}
    me = psutil.Process()
    try:
        distribute("i", over="i in range(4)", namespace=ns, into="warm", persist=True)  # warm both paths
        client.gather([client.submit(_make, 0, pure=False)])
        del ns["warm"]
        _settle(client)

        rss: dict[str, list[int]] = {"nbcluster": [], "client.submit": []}
        for _ in range(runs):
            gc.collect()
            before = me.memory_info().rss
            distribute(MAKE, over="i in range(4)", namespace=ns, into="held", persist=True)
            rss["nbcluster"].append(me.memory_info().rss - before)
            del ns["held"]
            _settle(client)
            gc.collect()
            before = me.memory_info().rss
            futures = [client.submit(_make, i, pure=False) for i in range(4)]
            distributed.wait(futures)
            rss["client.submit"].append(me.memory_info().rss - before)
            del futures
            _settle(client)
        out["rss"] = {k: statistics.median(v) for k, v in rss.items()}

        pipe: dict[str, list[float]] = {"nbcluster": [], "client.submit": []}
        moved: list[int] = []

        def ours() -> None:
            _warm(client)
            t = time.perf_counter()
            distribute(MAKE, over="i in range(8)", namespace=ns, into="shards", persist=True)
            sent = _sent(client)
            sums = distribute("float(s.sum())", over="s in shards", namespace=ns, into="sums")
            moved.append(_sent(client) - sent)
            pipe["nbcluster"].append(time.perf_counter() - t)
            assert sums.values() == [i * 12_500_000.0 for i in range(8)]
            del ns["shards"], ns["sums"], sums
            _settle(client)

        def theirs() -> None:
            _warm(client)
            t = time.perf_counter()
            made = [client.submit(_make, i, pure=False) for i in range(8)]
            total = client.gather([client.submit(_sum, f, pure=False) for f in made])
            pipe["client.submit"].append(time.perf_counter() - t)
            assert total == [i * 12_500_000.0 for i in range(8)]
            del made
            _settle(client)

        for run in range(runs):  # each goes first in every other run
            for side in (ours, theirs) if run % 2 == 0 else (theirs, ours):
                side()
        out["pipeline"] = {k: statistics.median(v) for k, v in pipe.items()}
        out["moved"] = statistics.median(moved)

        ns["grad"] = _grad
        distribute(MAKE, over="i in range(2)", namespace=ns, into="shards", persist=True)
        shard_futures = [client.submit(_make, i, pure=False) for i in range(2)]
        distributed.wait(shard_futures)
        loop: dict[str, list[float]] = {"nbcluster": [], "client.submit": []}
        w = np.zeros(1000)
        for _ in range(steps):
            ns["w"] = w
            t = time.perf_counter()
            g = distribute("grad(shard, w)", over="shard in shards", namespace=ns, into="g")
            w = w - 1e-9 * sum(g)
            loop["nbcluster"].append(time.perf_counter() - t)
            t = time.perf_counter()
            gs = client.gather([client.submit(_grad, f, w, pure=False) for f in shard_futures])
            w = w - 1e-9 * sum(gs)
            loop["client.submit"].append(time.perf_counter() - t)
        out["step"] = {k: statistics.median(v) for k, v in loop.items()}
    finally:
        handle.stop()
    return out


def report(out: dict[str, Any], runs: int, steps: int) -> str:
    mib = 2**20
    rss, pipe, step = out["rss"], out["pipeline"], out["step"]
    load = os.getloadavg()[0]
    return "\n".join(
        [
            f"Run {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {os.cpu_count()} cores "
            f"(load average {load:.1f} at the end: other sessions' tests ran meanwhile), "
            f"2 workers x 1 thread; medians of {runs} runs, and of {steps} steps.",
            "",
            "| measurement | `--persist` | `client.submit` by hand | ratio | target |",
            "|---|---:|---:|---:|---|",
            f"| kernel RSS growth, persisting 4 x 100 MB | {rss['nbcluster'] / mib:.1f} MiB "
            f"| {rss['client.submit'] / mib:.1f} MiB | | < 20 MB |",
            f"| pipeline: persist 8 x 100 MB, reduce each | {pipe['nbcluster']:.2f} s "
            f"| {pipe['client.submit']:.2f} s | {pipe['nbcluster'] / pipe['client.submit']:.2f}x | <= 1.1x |",
            f"| step loop, per step (2 shards, captured weights) | {step['nbcluster'] * 1000:.1f} ms "
            f"| {step['client.submit'] * 1000:.1f} ms | {step['nbcluster'] / step['client.submit']:.2f}x | <= 1.2x |",
            f"| bytes the workers sent during the reduce cell | {out['moved']:,.0f} B | | | 8 sums only |",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    out = measure(args.runs, args.steps)
    body = report(out, args.runs, args.steps)
    print(body)
    if args.write:
        from bench._results import write_section

        write_section("persist", f"python bench/persist.py --runs {args.runs} --steps {args.steps} --write", body)


if __name__ == "__main__":
    main()
