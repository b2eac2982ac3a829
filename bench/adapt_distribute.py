"""`%%distribute` on an adaptive cluster against `client.map` of the same work.

    .venv/bin/python bench/adapt_distribute.py [--runs 3] [--write]

A cluster started with 1 worker x 1 thread and `adapt(1, 3)`; the work is 80 items of
0.25 s (`time.sleep`, so the machine's load matters little). Each round waits until the
cluster is back at 1 worker, runs the items with `nbcluster.distribute`, waits again, and
runs them with `client.map` + `gather`. Per method: the wall time and the peak number of
workers (sampled every 0.1 s). Medians over `--runs` rounds; the target is a wall time of
at most 1.2x `client.map`'s (issue 21).

`--write` replaces the `## adapt` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from _results import write_section  # bench/, the script's own folder

ITEMS, SECONDS = 80, 0.25


def item(x: int) -> int:
    time.sleep(SECONDS)
    return x


def workers(client: Any) -> int:
    return len(client.scheduler_info()["workers"])


def back_to_one(client: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while workers(client) > 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not shrink back to 1 worker")
        time.sleep(0.2)


def timed(client: Any, run: Any) -> tuple[float, int]:
    """Wall seconds of `run()` and the peak worker count meanwhile."""
    peak = [workers(client)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak.append(workers(client))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    run()
    wall = time.perf_counter() - t
    done.set()
    sampler.join()
    return wall, max(peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update ## adapt in bench/RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    import nbcluster

    handle = nbcluster.start(workers=1, threads=1, name="bench-adapt")
    client = handle.client
    results: dict[str, list[tuple[float, int]]] = {"%%distribute": [], "client.map": []}
    try:
        handle.adapt(1, 3)
        for r in range(args.runs):
            back_to_one(client)
            results["%%distribute"].append(
                timed(client, lambda: nbcluster.distribute(item, over=range(ITEMS), on=client))
            )
            back_to_one(client)
            results["client.map"].append(
                timed(client, lambda: client.gather(client.map(item, range(ITEMS), pure=False)))
            )
            print(f"round {r + 1}/{args.runs}: {results}", file=sys.stderr)
    finally:
        handle.stop()
    base = statistics.median(w for w, _ in results["client.map"])
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end): {ITEMS} items of {SECONDS} s on a cluster started with "
        f"1 worker x 1 thread and `adapt(1, 3)`, medians of {args.runs} rounds, each method "
        "starting from 1 worker.",
        "",
        "| method | wall s | vs client.map | peak workers | walls of the rounds |",
        "|---|---:|---:|---:|---|",
    ]
    for label, rounds in results.items():
        wall = statistics.median(w for w, _ in rounds)
        peak = statistics.median(p for _, p in rounds)
        walls = ", ".join(f"{w:.1f}" for w, _ in rounds)
        lines.append(f"| {label} | {wall:.2f} | {wall / base:.2f}x | {peak:g} | {walls} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("adapt", "python bench/adapt_distribute.py " + " ".join(sys.argv[1:]), text)


if __name__ == "__main__":
    main()
