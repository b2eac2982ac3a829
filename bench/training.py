"""DDP on 2 CPU ranks: `nbcluster.ranks` against `torchrun --nproc-per-node 2`, the same script.

    python bench/training.py [--rounds 15] [--steps 200] [--write]

The script (`train` below): gloo, a 3-layer MLP (512-1024-1024-10) under
DistributedDataParallel, a batch of 64 a rank, SGD. Each rank times its steps; the figures
are rank 0's. Per round, interleaved, each peer first in turn:

- nbcluster: `nbcluster.ranks(train, n=2)` on a running local cluster of 2 workers x 1
  thread (started once, warmed by round 0, which is not counted);
- torchrun: ``python -m torch.distributed.run --nproc-per-node 2 bench/training.py --torchrun``.

Reported: the median step time after the first 10 steps, and the time from the start (the
call, or torchrun's launch) to rank 0's first step. Medians of the rounds; `--write`
replaces the `## training` section of bench/RESULTS.md. The defaults take about 4 minutes:
on a shared 2-core machine a round of 60 steps (about a second) swung from 0.76x to 1.22x
torchrun, and runs of 3 such rounds from 0.99x to 1.13x (bench/RESULTS.md, "training").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

WARM_STEPS = 10


def train(steps: int, began: float) -> dict[str, Any]:
    """One rank's training; its step times and how long after `began` its first step started."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 512, generator=g), torch.randint(0, 10, (64,), generator=g)
    times, first = [], None
    for _ in range(steps):
        t = time.perf_counter()
        if first is None:
            first = time.time() - began
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    dist.destroy_process_group()
    return {"rank": rank, "first": first, "step": statistics.median(times[WARM_STEPS:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--torchrun", action="store_true", help="(internal) run as one torchrun rank")
    parser.add_argument("--began", type=float, default=0.0, help="(internal) when torchrun was launched")
    args = parser.parse_args()
    if args.torchrun:
        result = train(args.steps, args.began)
        if result["rank"] == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return

    import nbcluster

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    cluster = nbcluster.start(workers=2, threads=1, name="bench-training")
    got: dict[str, dict[str, list[float]]] = {"nbcluster.ranks": {"step": [], "first": []},
                                              "torchrun": {"step": [], "first": []}}  # fmt: skip
    try:
        for r in range(args.rounds + 1):  # round 0 warms both (imports, the cluster's workers): not counted
            for name in sorted(got, reverse=r % 2 == 1):
                began = time.time()
                if name == "torchrun":
                    out = subprocess.run(
                        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__,
                         "--torchrun", "--steps", str(args.steps), "--began", repr(began)],
                        capture_output=True, text=True, check=True, timeout=300,
                    ).stdout  # fmt: skip
                    rank0 = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
                else:
                    rank0 = nbcluster.ranks(functools.partial(train, args.steps, began), n=2).values()[0]
                if r:
                    got[name]["step"].append(rank0["step"])
                    got[name]["first"].append(rank0["first"])
                print(f"round {r} {name}: step {rank0['step'] * 1e3:.1f} ms, first step after {rank0['first']:.2f} s")
    finally:
        cluster.stop()
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in got.items()}
    peer = med["torchrun"]
    lines = [
        f"DDP (gloo) on 2 CPU ranks, a 512-1024-1024-10 MLP, batch 64 a rank, {args.steps} steps; rank 0's "
        f"median step after {WARM_STEPS}; {args.rounds} rounds interleaved after a warm-up; medians:",
        "",
        "| peer | step | vs torchrun | start to first step | rounds' first-step range |",
        "|---|---|---|---|---|",
        *(f"| {n} | {m['step'] * 1e3:.1f} ms | {m['step'] / peer['step']:.2f}x | {m['first']:.2f} s | "
          f"{min(got[n]['first']):.2f}-{max(got[n]['first']):.2f} s |" for n, m in med.items()),
        "",
        "nbcluster's start is on a running cluster (its workers have imported torch in earlier rounds); "
        "torchrun starts two Pythons that import torch each time. The machine was shared with other "
        "engineers' tests and benchmarks (2 cores).",
    ]
    body = "\n".join(lines)
    print(body)
    if args.write:
        from _results import write_section  # bench/, the script's own folder

        write_section("training", f"python bench/training.py --rounds {args.rounds} --steps {args.steps} --write", body)


if __name__ == "__main__":
    main()
