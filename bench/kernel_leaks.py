"""One kernel, many small `%%distribute` cells: do RSS, open files and threads stay flat?

    python bench/kernel_leaks.py [--cells 1000] [--workers 2]

A real ipykernel (started with jupyter_client, as a notebook would) loads nbcluster, starts
a cluster, then runs CELLS consecutive cells of ``%%distribute --over "x in range(8)"`` with
a one-line body (with ``--into``: ``--into r``, so IPython's output history keeps nothing). After each cell the kernel process's RSS, open file descriptors and thread
count are read with psutil. The report compares the median of the first 100 cells with the
median of the last 100 (and the maxima), and prints a markdown block for bench/RESULTS.md.

`measure` is also what `tests/test_load.py` runs, with fewer cells.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil

#: The result is the cell's output, so IPython's output history (Out, up to 1,000 entries)
#: keeps every cell's Results: part of what a user's kernel holds, by IPython's design.
CELL = '%%distribute --over "x in range(8)"\nx * 2'
#: The same with --into: one variable, rebound each cell, so only nbcluster's own
#: retention (and Dask's, and the kernel's) remains.
CELL_INTO = '%%distribute --over "x in range(8)" --into r\nx * 2'



@dataclass
class Sample:
    cell: int
    rss: int
    fds: int
    threads: int
    seconds: float


def measure(cells: int, workers: int = 2, on_progress=None, cell: str = CELL) -> list[Sample]:
    """Run `cells` cells in a fresh kernel; one Sample per cell (after the cell)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = kc.execute_interactive(
            f"%load_ext nbcluster\n%cluster start --workers {workers} --name leaks", timeout=120
        )
        assert setup["content"]["status"] == "ok", setup["content"]
        kernel = psutil.Process(km.provisioner.pid)
        samples = []
        for i in range(cells):
            t0 = time.perf_counter()
            reply = kc.execute_interactive(cell, timeout=60, output_hook=lambda msg: None)
            took = time.perf_counter() - t0
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"cell {i} failed: {reply['content']}")
            samples.append(Sample(i + 1, kernel.memory_info().rss, kernel.num_fds(), kernel.num_threads(), took))
            if on_progress:
                on_progress(samples[-1])
        kc.execute_interactive("%cluster stop leaks", timeout=60)
        return samples
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def summary(samples: list[Sample], window: int = 100) -> dict[str, tuple[float, float]]:
    """{metric: (median of the first `window` cells, median of the last `window`)}."""
    first, last = samples[:window], samples[-window:]
    return {
        key: (statistics.median(getattr(s, key) for s in first), statistics.median(getattr(s, key) for s in last))
        for key in ("rss", "fds", "threads", "seconds")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--into", action="store_true", help="cells with --into r (no output history)")
    args = parser.parse_args()
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    started = time.perf_counter()

    def progress(s: Sample) -> None:
        if s.cell % 100 == 0:
            print(f"cell {s.cell}: rss {s.rss / 2**20:.1f} MiB, fds {s.fds}, threads {s.threads}, "
                  f"{s.seconds * 1000:.0f} ms", file=sys.stderr)  # fmt: skip

    samples = measure(args.cells, args.workers, progress, cell=CELL_INTO if args.into else CELL)
    total = time.perf_counter() - started
    s = summary(samples)
    into = " --into" if args.into else ""
    print(f"\nCommand: `python bench/kernel_leaks.py --cells {args.cells} --workers {args.workers}{into}` "
          f"({total:.0f} s in all)\n")  # fmt: skip
    print("| metric | first 100 cells (median) | last 100 cells (median) | max first 100 | max last 100 |")
    print("|---|---|---|---|---|")
    first, last = samples[:100], samples[-100:]
    print(f"| kernel RSS | {s['rss'][0] / 2**20:.1f} MiB | {s['rss'][1] / 2**20:.1f} MiB | "
          f"{max(x.rss for x in first) / 2**20:.1f} MiB | {max(x.rss for x in last) / 2**20:.1f} MiB |")  # fmt: skip
    for key, label in (("fds", "open fds"), ("threads", "threads")):
        print(f"| {label} | {s[key][0]:.0f} | {s[key][1]:.0f} | {max(getattr(x, key) for x in first)} | "
              f"{max(getattr(x, key) for x in last)} |")  # fmt: skip
    print(f"| time per cell | {s['seconds'][0] * 1000:.0f} ms | {s['seconds'][1] * 1000:.0f} ms | | |")
    print("\nEvery 100th cell:\n")
    print("| cell | RSS MiB | fds | threads |")
    print("|---|---|---|---|")
    for x in samples[99::100]:
        print(f"| {x.cell} | {x.rss / 2**20:.1f} | {x.fds} | {x.threads} |")


if __name__ == "__main__":
    main()
