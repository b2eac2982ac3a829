"""Latency of a long `%%distribute` cell: the first result, and what an interrupt keeps.

    .venv/bin/python bench/latency.py [--runs 5] [--compare PATH] [--write]

1,000 items of 0.5 s on 2 workers x 1 thread (the items sleep, so the machine's load
does not blur the numbers). Per run:

- **first result**: seconds from the call to the first item in the `Results`;
- **interrupt at 3 s**: `Results.cancel()` 3 s after the start, as the stop button does;
  how many items the `Results` then hold (about 2 x 3 / 0.5 = 12 had finished on the
  workers), and how long the cancel took;
- **workers free**: from the end of the cancel until a following 2-item cell of 0.01 s
  items has finished (the threads' leftover work).

`client.map` (one task per item, Dask's own futures) is the reference. `--compare PATH`
also measures the nbcluster found at PATH (a checkout of an earlier commit), in a child
process, so the same run shows before and after. `--write` replaces the `## latency`
section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _results import write_section  # bench/, the script's own folder

ITEMS, ITEM_S, INTERRUPT_AT = 1000, 0.5, 3.0


def measure_nbcluster(runs: int) -> list[dict[str, float]]:
    import nbcluster
    from nbcluster.run.api import distribute

    handle = nbcluster.start(workers=2, threads=1, name=f"bench-latency-{os.getpid()}")
    out = []
    try:
        handle.client.wait_for_workers(2)
        distribute("x", over="x in range(4)", namespace={})  # warm: imports on the workers
        cell = f"import time\ntime.sleep({ITEM_S})\nx"
        for _ in range(runs):
            # The first result, on its own run (an engine that returns it late must not
            # also move the interrupt below).
            first = threading.Event()
            start = time.perf_counter()
            res = distribute(
                cell, over=f"x in range({ITEMS})", namespace={}, wait=False,
                progress=lambda r, first=first: r.counts()["done"] and first.set(),
            )  # fmt: skip
            first.wait(120)
            took = time.perf_counter() - start
            res.cancel()
            # The interrupt, 3 s into a fresh run.
            start = time.perf_counter()
            res = distribute(cell, over=f"x in range({ITEMS})", namespace={}, wait=False)
            time.sleep(max(0.0, start + INTERRUPT_AT - time.perf_counter()))
            t = time.perf_counter()
            res.cancel()
            cancelled = time.perf_counter()
            distribute("import time\ntime.sleep(0.01)\nx", over="x in range(2)", namespace={})
            out.append(
                {
                    "first": took,
                    "kept": res.counts()["done"],
                    "cancel": cancelled - t,
                    "free": time.perf_counter() - cancelled,
                }
            )
    finally:
        handle.stop()
    return out


def measure_client_map(runs: int) -> list[dict[str, float]]:
    from nbcluster.cluster.handle import start

    handle = start(workers=2, threads=1, name=f"bench-latency-map-{os.getpid()}")
    client = handle.client
    out = []
    try:
        client.wait_for_workers(2)
        for _ in range(runs):
            start = time.perf_counter()
            futures = client.map(time.sleep, [ITEM_S] * ITEMS, pure=False)
            futures[0].result()  # items start in order: the first is among the first done
            first = time.perf_counter() - start
            time.sleep(max(0.0, start + INTERRUPT_AT - time.perf_counter()))
            t = time.perf_counter()
            kept = sum(f.status == "finished" for f in futures)
            client.cancel([f for f in futures if f.status != "finished"])
            cancelled = time.perf_counter()
            client.gather(client.map(time.sleep, [0.01, 0.01], pure=False))
            out.append({"first": first, "kept": kept, "cancel": cancelled - t, "free": time.perf_counter() - cancelled})
            del futures
    finally:
        handle.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", help="another nbcluster checkout to measure the same way")
    parser.add_argument("--write", action="store_true", help="update ## latency in bench/RESULTS.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    if args.child:
        print(json.dumps(measure_nbcluster(args.runs)))
        return
    rows: dict[str, list[dict[str, float]]] = {}
    if args.compare:
        # Run from that checkout too: a supervisor started with `python -m` imports
        # nbcluster from its working directory first.
        other = str(Path(args.compare).resolve())
        child = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", "--runs", str(args.runs)],
            env={**os.environ, "PYTHONPATH": other}, cwd=other, capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows[f"%%distribute at {args.compare}"] = json.loads(child.stdout.strip().splitlines()[-1])
    rows["%%distribute (this checkout)"] = measure_nbcluster(args.runs)
    rows["client.map, one task per item"] = measure_client_map(args.runs)
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')}, {ITEMS} items of {ITEM_S} s on 2 workers x 1 thread, "
        f"interrupt at {INTERRUPT_AT:.0f} s; medians of {args.runs} runs (load average "
        f"{os.getloadavg()[0]:.1f} at the end).",
        "",
        "| method | first result s | items kept | cancel s | workers free after s | first result, each run |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("first", "kept", "cancel", "free")}
        each = ", ".join(f"{r['first']:.2f}" for r in runs)
        lines.append(
            f"| {label} | {med['first']:.2f} | {med['kept']:.0f} | {med['cancel']:.2f} | {med['free']:.2f} | {each} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("latency", "python bench/latency.py " + " ".join(sys.argv[1:]), text)

if __name__ == "__main__":
    main()
