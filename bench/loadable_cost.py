"""What sending batches as ``pickle.loads`` of bytes costs (`nbcluster/run/transport.py`, `task`).

    python bench/loadable_cost.py [--runs 5] [--items 20000,1000000]

A worker without nbcluster must fail its batch, not break its connection, so each plain
batch goes as one opaque ``pickle.loads(bytes)`` task whose unpickling makes the call. The
price is one more pickling of the batch's arguments in the kernel and one more unpickling
on the worker. Measured here against the task as it was (``(run_batch, context, blob,
token)``) in the same process, runs interleaved (A B, B A, ...): `distribute()` of
``x + 1`` over N items on 2 workers x 1 thread, wall time per item, median of `--runs`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import nbcluster
from nbcluster.run import transport as loadable


def as_it_was(fn, *args):  # the task before loadable.py
    return (fn, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--items", default="20000,1000000")
    args = parser.parse_args()
    handle = nbcluster.start(workers=2, threads=1, name="loadable-bench")
    wrapped = loadable.task
    try:
        nbcluster.distribute("x + 1", over="x in range(100)", namespace={}).values()  # warm
        for n in (int(s) for s in args.items.split(",")):
            times: dict[str, list[float]] = {"loadable": [], "as it was": []}
            for run in range(args.runs):
                pair = [("loadable", wrapped), ("as it was", as_it_was)]
                for label, task in pair if run % 2 == 0 else pair[::-1]:  # A B, B A, ...: no order effect
                    loadable.task = task
                    started = time.perf_counter()
                    values = nbcluster.distribute("x + 1", over=f"x in range({n})", namespace={}).values()
                    times[label].append((time.perf_counter() - started) / n)
                    assert values[-1] == n
            a, b = (statistics.median(times[k]) * 1e6 for k in ("loadable", "as it was"))
            print(f"{n:>9,} items: loadable {a:.3f} us/item, as it was {b:.3f} us/item, ratio {a / b:.3f}", flush=True)
    finally:
        loadable.task = wrapped
        handle.stop()


if __name__ == "__main__":
    main()
