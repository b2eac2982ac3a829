"""Direct batches on and off, in turns in one process: what going around the scheduler saves.

    .venv/bin/python bench/direct.py [--runs 21] [--write]

One cluster (2 workers x 1 thread, TLS, supervisor process), one IPython shell. Each round
runs every case once with ``distribute.direct`` at its default (a run's first ten seconds
of batches go to the workers directly, `nbcluster/run/transport.py`) and once at
``0s`` (every batch a Dask task, as before), in turns, so that drift in the machine's load
hits both alike; and the peer a Dask user has, ``client.map`` + ``gather`` of the same
items, and one task's round trip. Medians over the rounds:

- an 8-item cell of tiny items (`x + 1`) through the magic and through `distribute(fn)`;
- 20,000 tiny items through the magic, per item;
- 1,000,000 tiny items through `distribute(fn)`, per item (a third of the rounds).

`--write` replaces the ``## direct batches`` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _results import write_section  # bench/, the script's own folder


def inc(x: int) -> int:
    return x + 1


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--write", action="store_true", help="update the ## direct batches section of bench/RESULTS.md")
    args = parser.parse_args()
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    import dask.config
    from IPython.core.interactiveshell import InteractiveShell

    import nbcluster
    from nbcluster.run.api import distribute

    handle = nbcluster.start(workers=2, threads=1, name="bench-direct")
    try:
        client = handle.client
        client.wait_for_workers(2)
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "nbcluster")

        def cell(n: int) -> None:
            result = ip.run_cell(f'%%distribute --over "x in range({n})" --into r\nx + 1')
            assert result.success and ip.user_ns["r"].ok

        cases: dict[str, tuple[int, Callable[[], Any]]] = {
            "8-item cell, magic": (1, lambda: cell(8)),
            "8-item cell, distribute(fn)": (1, lambda: distribute(inc, over=range(8))),
            "20,000 tiny items, magic, per item": (20_000, lambda: cell(20_000)),
            "1,000,000 tiny items, distribute(fn), per item": (1_000_000, lambda: distribute(inc, over=range(10**6))),
        }
        peers: dict[str, Callable[[], Any]] = {
            "client.map + gather, 8 items": lambda: client.gather(client.map(inc, range(8), pure=False)),
            "client.submit, one task's round trip": lambda: client.submit(inc, 1, pure=False).result(),
        }
        sides = {"direct": "10s", "through the scheduler": "0s"}
        for setting in sides.values():  # warm every path: imports, connections, worker caches
            with dask.config.set({"nbcluster.distribute.direct": setting}):
                for _, fn in cases.values():
                    fn()
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.runs):
            for name, (_, fn) in cases.items():
                if name.startswith("1,000,000") and r % 3:
                    continue
                for side, setting in sides.items():
                    with dask.config.set({"nbcluster.distribute.direct": setting}):
                        ip.user_ns.pop("r", None)
                        times.setdefault((name, side), []).append(timed(fn))
            for name, fn in peers.items():
                times.setdefault((name, "peer"), []).append(timed(fn))
    finally:
        handle.stop()

    load = os.getloadavg()
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average at the end {load[0]:.1f}), "
        f"2 workers x 1 thread; medians of {args.runs} rounds (the million: of {len(range(0, args.runs, 3))}), "
        "the two sides in turns in one process.",
        "",
        "| case | direct | through the scheduler | ratio |",
        "|---|---:|---:|---:|",
    ]
    for name, (n, _) in cases.items():
        unit, scale = ("µs", 1e6) if n > 1 else ("ms", 1e3)
        direct = statistics.median(times[(name, "direct")]) / n
        dask_ = statistics.median(times[(name, "through the scheduler")]) / n
        lines.append(f"| {name} | {direct * scale:.2f} {unit} | {dask_ * scale:.2f} {unit} | {direct / dask_:.2f}x |")
    lines += ["", "| peer, same rounds | median |", "|---|---:|"]
    for name in peers:
        lines.append(f"| {name} | {statistics.median(times[(name, 'peer')]) * 1e3:.2f} ms |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_section("direct batches", " ".join(["python", "bench/direct.py", *sys.argv[1:]]), table)


if __name__ == "__main__":
    main()
