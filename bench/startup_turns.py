"""The cold start of `startup.py`, two checkouts of nbcluster in turns, against LocalCluster.

    python bench/startup_turns.py OLD_TREE NEW_TREE [--rounds 8]

Each tree gets one long-lived Python process with the tree first on ``PYTHONPATH`` (so a
sample runs in a process that has imported nbcluster and Dask, as in a notebook), which
runs `startup.py`'s own functions on request: ``nbcluster_cold_once`` (`nbcluster.start`
with no spare supervisor) and ``localcluster_once``. Each round takes one sample of each,
per tree, the trees' order alternating from round to round, and waits before every sample
until no process of the run uses the CPU (`settle`): the machine's noise and what one
sample leaves running fall on both trees alike. The first round of each process only warms
it up and is left out. Prints a markdown table: medians (min-max), and each tree's cold
median over the LocalCluster median of its own process; then the cold medians over the
LocalCluster median of both, new over old, and the samples.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _quiet import settle  # bench/, the script's own folder

HERE = Path(__file__).resolve().parent
RESULT = "startup_turns result: "


def serve() -> None:
    """Answer each line of stdin (``cold`` or ``lc``) with one sample, in seconds."""
    import startup  # bench/startup.py, this folder being the script's

    samplers = {"cold": startup.nbcluster_cold_once, "lc": startup.localcluster_once}
    for line in sys.stdin:
        print(RESULT + json.dumps(samplers[line.strip()]()), flush=True)


class _Tree:
    def __init__(self, tree: Path):
        self.tree = tree
        env = {**os.environ, "PYTHONPATH": str(tree), "NBCLUSTER_RUNTIME_DIR": tempfile.mkdtemp(prefix="turns-")}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "startup_turns.py"), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE,
        )  # fmt: skip
        self.samples: dict[str, list[float]] = {"cold": [], "lc": []}

    def sample(self, kind: str, keep: bool) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                if keep:
                    self.samples[kind].append(float(line[len(RESULT) :]))
                return
        raise RuntimeError(f"the process for {self.tree} exited (code {self.proc.wait()})")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("old", type=Path, nargs="?")
    parser.add_argument("new", type=Path, nargs="?")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    trees = [_Tree(args.old.resolve()), _Tree(args.new.resolve())]
    try:
        for i in range(args.rounds + 1):
            for tree in trees if i % 2 else trees[::-1]:
                for kind in ("lc", "cold"):
                    settle()
                    tree.sample(kind, keep=i > 0)
    finally:
        for tree in trees:
            tree.close()
    load = os.getloadavg()[0]
    print(f"Cold start to first result, 2 workers, {args.rounds} rounds in turns, {os.cpu_count()} cores, load {load:.1f}\n")
    print("| tree | cold median s (min-max) | LocalCluster median s (min-max) | cold / LocalCluster |")
    print("|---|---|---|---|")
    for tree in trees:
        cold, lc = tree.samples["cold"], tree.samples["lc"]
        print(
            f"| {tree.tree} | {statistics.median(cold):.3f} ({min(cold):.2f}-{max(cold):.2f}) | "
            f"{statistics.median(lc):.3f} ({min(lc):.2f}-{max(lc):.2f}) | "
            f"{statistics.median(cold) / statistics.median(lc):.2f}x |"
        )
    lc = statistics.median(trees[0].samples["lc"] + trees[1].samples["lc"])
    old, new = (statistics.median(t.samples["cold"]) for t in trees)
    pairs = [b / a for a, b in zip(trees[0].samples["cold"], trees[1].samples["cold"], strict=True)]
    print(f"\nLocalCluster, both processes: median {lc:.3f} s; cold / that: old {old / lc:.2f}x, new {new / lc:.2f}x")
    print(f"new / old cold: {new / old:.2f} (medians), {statistics.median(pairs):.2f} (median of the rounds' ratios)")
    for tree in trees:
        print(f"{tree.tree}: cold {' '.join(f'{x:.3f}' for x in tree.samples['cold'])}")


if __name__ == "__main__":
    main()
