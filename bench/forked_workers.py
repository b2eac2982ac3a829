"""Forked against spawned nbcluster workers: does a forked worker run real work slower?

    python bench/forked_workers.py [--runs 15]

Two local clusters of 2 workers x 1 thread side by side: one whose workers are forked from
the supervisor's forkserver (the default), one whose workers are spawned as new Pythons
(``nbcluster.worker.forkserver: false``). In each round, in random order of the two, every
worker runs one item of each of bench/real_work.py's kernels, one item at a time; medians of
each item's wall time and of its own thread's CPU time (which a busy machine barely moves).
Then each cluster's first worker allocates and frees ~2 GB (real_work's `churn`): its RSS at
the end, and 2 s later (nbcluster's workers trim the heap within a second of a task's end).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from typing import Any

import cloudpickle
import dask.config
import real_work  # bench/, the script's own folder

from nbcluster.cluster import handle as lifecycle

cloudpickle.register_pickle_by_value(real_work)


def item(name: str, seed: int, kernel: Any = real_work.kernel) -> tuple[float, float]:
    """One item of `name` (on a worker): its wall and thread CPU seconds."""
    wall, cpu = time.perf_counter(), time.thread_time()
    kernel(name, seed)
    return time.perf_counter() - wall, time.thread_time() - cpu


def churn(run: Any = real_work.churn) -> int:
    return int(run())


def rss(read: Any = real_work.rss) -> int:
    return int(read())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="nbcluster-bench-")
    clusters = {"forked": lifecycle.start(workers=2, threads=1, name="forked", runtime_dir=directory)}
    with dask.config.set({"nbcluster.worker.forkserver": False}):
        clusters["spawned"] = lifecycle.start(workers=2, threads=1, name="spawned", runtime_dir=directory)
    times: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        (way, name): ([], []) for way in clusters for name in real_work.KERNELS
    }
    try:
        for r in range(args.runs):
            order = list(clusters)
            random.shuffle(order)
            for name in real_work.KERNELS:
                for way in order:
                    client = clusters[way].client
                    for worker in sorted(client.scheduler_info()["workers"]):
                        wall, cpu = client.submit(item, name, r, workers=[worker], pure=False).result()
                        times[way, name][0].append(wall)
                        times[way, name][1].append(cpu)
        print(f"Forked against spawned workers, 2 workers x 1 thread each, {args.runs} rounds\n")
        print(
            "| kernel | forked wall s | spawned wall s | forked item CPU s | spawned item CPU s | CPU forked/spawned |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name in real_work.KERNELS:
            fw, fc = (statistics.median(x) for x in times["forked", name])
            sw, sc = (statistics.median(x) for x in times["spawned", name])
            print(f"| {name} | {fw:.4f} | {sw:.4f} | {fc:.4f} | {sc:.4f} | {fc / sc:.3f}x |")
        print("\n| workers | RSS after ~2 GB churn MiB | 2 s later MiB |\n|---|---:|---:|")
        for way, handle in clusters.items():
            worker = sorted(handle.client.scheduler_info()["workers"])[0]
            after = handle.client.submit(churn, workers=[worker], pure=False).result()
            time.sleep(2)
            later = handle.client.run(rss, workers=[worker])[worker]
            print(f"| {way} | {after / 2**20:.0f} | {later / 2**20:.0f} |")
    finally:
        for handle in clusters.values():
            handle.stop()


if __name__ == "__main__":
    main()
