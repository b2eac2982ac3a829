"""`--persist` against hand-written `client.submit` futures, measured in the same run.

    python bench/persist.py [--runs 3] [--steps 20] [--write]

On one 2-worker x 1-thread cluster that nbcluster starts, through the Python API
(`distribute(...)`, what `%%distribute` calls), each measurement beside its peer:

1. kernel RSS: persisting 4 results of 100 MB raises the kernel's RSS by (target < 20 MB);
   the peer is 4 `client.submit` futures of the same arrays;
2. two-cell pipeline: persist 8 x 100 MB, then reduce each where it is (`--over "s in
   shards"`); the peer submits the 8 makers, then 8 reducers on their futures, and
   gathers the sums (target: at most 1.1x the peer). A third side is that peer waiting for
   the 8 arrays before it submits the reducers, as a `--persist` cell does before the next
   cell can start: the difference between the two peers is what the wait between the cells
   costs. Each side starts on warm memory (`_warm`) and they take turns going first;
3. step loop: notebook 02's training step, on the notebook's own model code (run from its
   cell) and the digits: 2 persisted shards, then STEPS steps of `distribute` over them whose
   function captures the current weights (the 64-128-10 model, batch 256), as the notebook
   does; the peer is the `client.submit(gradient, params, shard_future, ...)` loop over
   scattered shards that the notebook had before (target: per-step time at most 1.2x);
4. bytes moved by the reduce cell of (2), from the workers' `transfer_outgoing_bytes_total`
   (worker to worker and worker to kernel): the chained items read their input where it
   is, and the 8 sums come as the workers' pushed events (`worker/push.py`), which that
   counter does not count: it reads 0 unless a value moved.

Medians of `--runs` (pipeline) and of the steps (loop); `--write` replaces the section in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAKE = "np.full(12_500_000, float(i))"  # 100 MB


def _make(i: int) -> Any:
    return np.full(12_500_000, float(i))


STEP_BATCH = 256  # the training run's batch in notebook 02


def _notebook_model() -> dict[str, Any]:
    """`init`, `forward`, `gradient`: run from notebook 02's own cell that defines them."""
    notebook = json.loads((ROOT / "notebooks" / "02-training.ipynb").read_text())
    [source] = [
        "".join(c["source"]) for c in notebook["cells"] if "".join(c["source"]).startswith("def init(")
    ]
    namespace: dict[str, Any] = {"np": np, "__name__": "notebook02"}  # not importable: pickled by value
    exec(source, namespace)
    return namespace


def _shard_gradient(gradient: Any, weights: Any, per_shard: int, shard: Any, seed: int) -> Any:
    return gradient(weights, shard, per_shard, seed)


def _sgd(params: list[Any], grads: Any) -> list[Any]:
    """One step of the averaged gradient, as notebook 02's `train` takes it."""
    return [p - 0.5 * sum(g) / len(g) for p, *g in zip(params, *grads, strict=True)]


def _digits() -> tuple[Any, Any]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X[:1400] / 16.0).astype(np.float32), y[:1400]


def _workers(client: Any) -> list[str]:
    return list(client.scheduler_info()["workers"])


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
    from nbcluster.run.api import distribute

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

        pipe: dict[str, list[float]] = {"nbcluster": [], "client.submit": [], "waiting": []}
        moved: list[int] = []

        def ours() -> None:
            _warm(client)
            t = time.perf_counter()
            distribute(MAKE, over="i in range(8)", namespace=ns, into="shards", persist=True)
            first = time.perf_counter() - t
            sent = _sent(client)  # not timed: Client.run is a round trip and a new connection
            t = time.perf_counter()
            sums = distribute("float(s.sum())", over="s in shards", namespace=ns, into="sums")
            pipe["nbcluster"].append(first + time.perf_counter() - t)
            moved.append(_sent(client) - sent)
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

        def waiting() -> None:
            # The hand-written cells with the wait a --persist cell has: its first cell returns
            # once the 8 arrays are made, so the reducers start only then.
            _warm(client)
            t = time.perf_counter()
            made = [client.submit(_make, i, pure=False) for i in range(8)]
            distributed.wait(made)
            total = client.gather([client.submit(_sum, f, pure=False) for f in made])
            pipe["waiting"].append(time.perf_counter() - t)
            assert total == [i * 12_500_000.0 for i in range(8)]
            del made
            _settle(client)

        for run in range(runs):  # each goes first in turn
            sides = [ours, theirs, waiting]
            for side in sides[run % 3 :] + sides[: run % 3]:
                side()
        out["pipeline"] = {k: statistics.median(v) for k, v in pipe.items()}
        out["moved"] = statistics.median(moved)

        # The step loop of notebook 02, on its own model code and data, against the
        # client.submit loop it replaced (scattered shard futures, the weights as an argument).
        model = _notebook_model()
        gradient, params = model["gradient"], model["init"](hidden=128)
        data = _digits()
        parts = [(data[0][i::2], data[1][i::2]) for i in range(2)]
        shards = distribute(lambda i: parts[i], over=range(2), persist=True, into="shards", namespace={})
        futures = [
            client.scatter([part], workers=[w])[0]
            for part, w in zip(parts, sorted(_workers(client)), strict=True)
        ]
        per_shard = STEP_BATCH // 2
        loop: dict[str, list[float]] = {"nbcluster": [], "client.submit": []}
        for step in range(steps):
            t = time.perf_counter()
            # What the notebook's lambda over `weights` is, without a loop variable in a closure.
            step_of = functools.partial(_shard_gradient, gradient, params, per_shard)
            params = _sgd(params, distribute(step_of, over=shards, seed=step))
            loop["nbcluster"].append(time.perf_counter() - t)
            t = time.perf_counter()
            tasks = [
                client.submit(gradient, params, f, per_shard, step * 2 + i, pure=False)
                for i, f in enumerate(futures)
            ]
            params = _sgd(params, client.gather(tasks))
            loop["client.submit"].append(time.perf_counter() - t)
        del shards, futures, tasks
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
            f"(load average {load:.1f} at the end), "
            f"2 workers x 1 thread; medians of {runs} runs, and of {steps} steps.",
            "",
            "| measurement | `--persist` | `client.submit` by hand | ratio | target |",
            "|---|---:|---:|---:|---|",
            f"| kernel RSS growth, persisting 4 x 100 MB | {rss['nbcluster'] / mib:.1f} MiB "
            f"| {rss['client.submit'] / mib:.1f} MiB | | < 20 MB |",
            f"| pipeline: persist 8 x 100 MB, reduce each | {pipe['nbcluster']:.2f} s "
            f"| {pipe['client.submit']:.2f} s | {pipe['nbcluster'] / pipe['client.submit']:.2f}x | <= 1.1x |",
            f"| the same, the hand-written side waiting for the 8 arrays before reducing | {pipe['nbcluster']:.2f} s "
            f"| {pipe['waiting']:.2f} s | {pipe['nbcluster'] / pipe['waiting']:.2f}x | |",
            f"| notebook 02's step loop, per step (2 shards, captured weights) | {step['nbcluster'] * 1000:.1f} ms "
            f"| {step['client.submit'] * 1000:.1f} ms | {step['nbcluster'] / step['client.submit']:.2f}x | <= 1.2x |",
            f"| bytes the workers sent during the reduce cell | {out['moved']:,.0f} B | | | none: the 8 sums come pushed, on Dask's event stream |",
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

        write_section(
            "persist", f"python bench/persist.py --runs {args.runs} --steps {args.steps} --write", body
        )


if __name__ == "__main__":
    main()
