"""What the run journal (`--resume`, issue 18) costs, on 2 workers x 1 thread.

    .venv/bin/python bench/journal.py [--repeats 7] [--write]

Three measurements, with the journal on and off interleaved round-robin in one process
(so drift in the machine's load hits both alike), medians over `--repeats`:

1. 400 items of ~10 ms of CPU work (a fixed loop, calibrated here): wall time of the run,
   journal on / off. Target: at most 1.03x.
2. Tiny items (`x + 1`, 20,000): wall time per item, on / off, and the difference; beside
   it, the time spent in the journal's writes themselves (`Writer.write`, timed in the
   kernel's result path), as wall time and as the writing thread's CPU time: what the
   journal adds without the noise of the rest of the run. Target: at most 0.3 us per item.
3. Resume of a 100,000-item journal (plain values, and dict values, pickled one by one):
   `journal.load`, and the whole `distribute(..., resume=True)` call that finds the journal,
   loads it and fills the results (nothing left to run). Target: loading at most 1 s.

`--write` replaces the `## journal` section of bench/RESULTS.md with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _results import write_section  # bench/, the script's own folder
from _work import calibrate, work

ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)  # this checkout's nbcluster, here and (below) on the workers
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

import dask.config  # noqa: E402

import nbcluster  # noqa: E402
from nbcluster.journal import store as journal  # noqa: E402

WORK_ITEMS = 400
TINY = 20_000
BIG = 100_000


class WriteTimer:
    """Seconds spent in `Writer.write` (the journal's part of the result path): wall time, and
    the writing thread's CPU time, which a loaded machine's preemption does not inflate."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu = 0.0
        self._write = journal.Writer.write

    def __enter__(self) -> WriteTimer:
        timer, original = self, self._write

        def write(self: Any, *args: Any, **kwargs: Any) -> None:
            t, c = time.perf_counter(), time.thread_time()
            original(self, *args, **kwargs)
            timer.cpu += time.thread_time() - c
            timer.seconds += time.perf_counter() - t

        journal.Writer.write = write  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        journal.Writer.write = self._write  # type: ignore[method-assign]


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_pair(
    cell: str, over: str, ns: dict[str, Any], repeats: int
) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """(on, off, (write wall, write CPU) seconds) for `repeats` interleaved runs of the cell."""
    on, off, writes = [], [], []
    for r in range(repeats):
        order = (True, False) if r % 2 == 0 else (False, True)
        for enabled in order:
            with dask.config.set({"nbcluster.journal.enabled": enabled}), WriteTimer() as timer:
                # A fresh identity each time (the `r` and the flag in the cell): no hint, no resume.
                body = f"{cell}  # {r} {enabled}"
                t = timed(lambda: nbcluster.distribute(body, over=over, namespace=ns))  # noqa: B023 (called at once)
            (on if enabled else off).append(t)
            if enabled:
                writes.append((timer.seconds, timer.cpu))
    return on, off, writes


def resume_cost(values: str) -> tuple[float, float, int]:
    """(load seconds, resume call seconds, journal bytes) for a 100,000-item journal."""
    cell = f"{values}  # resume bench"
    over = f"x in range({BIG})"
    first = nbcluster.distribute(cell, over=over, namespace={})
    assert first.ok
    path = journal.journals()[0]  # the newest: this run's
    load = timed(lambda: journal.load(path))
    call = timed(lambda: nbcluster.distribute(cell, over=over, namespace={}, resume=True))
    return load, call, path.stat().st_size


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="nbcluster-journal-bench-")
    dask.config.set({"nbcluster.journal.path": folder})
    n = calibrate()
    cluster = nbcluster.start(workers=2, threads=1, name="journal-bench")
    try:
        nbcluster.distribute("x", over="x in range(100)", namespace={})  # warm the workers
        work_on, work_off, _ = run_pair("work(n)", f"x in range({WORK_ITEMS})", {"work": work, "n": n}, args.repeats)
        tiny_on, tiny_off, tiny_writes = run_pair("x + 1", f"x in range({TINY})", {}, args.repeats)
        plain = [resume_cost("x + 1") for _ in range(3)]
        dicts = [resume_cost("{'x': x, 'loss': x / 3}") for _ in range(3)]
    finally:
        cluster.stop()

    med = statistics.median
    us = 1e6 / TINY
    rows = [
        "| measurement | journal on | journal off | ratio / difference | target |",
        "|---|---:|---:|---:|---|",
        f"| 400 items of 10 ms, wall | {med(work_on):.3f} s | {med(work_off):.3f} s | "
        f"{med(work_on) / med(work_off):.3f}x | <= 1.03x |",
        f"| 20,000 tiny items, per item | {med(tiny_on) * us:.2f} us | {med(tiny_off) * us:.2f} us | "
        f"{(med(tiny_on) - med(tiny_off)) * us:+.2f} us | <= 0.3 us |",
        f"| 20,000 tiny items, wall time in `Writer.write`, per item | {med(w for w, _ in tiny_writes) * us:.3f} us"
        " | | | <= 0.3 us |",
        f"| 20,000 tiny items, CPU time in `Writer.write`, per item | {med(c for _, c in tiny_writes) * us:.3f} us"
        " | | | <= 0.3 us |",
        f"| resume 100,000 plain values: `journal.load` | {med(p[0] for p in plain):.3f} s | | "
        f"({plain[0][2] / 1e6:.1f} MB) | <= 1 s |",
        f"| resume 100,000 plain values: the whole resume call | {med(p[1] for p in plain):.3f} s | | | |",
        f"| resume 100,000 dict values: `journal.load` | {med(d[0] for d in dicts):.3f} s | | "
        f"({dicts[0][2] / 1e6:.1f} MB) | <= 1 s |",
        f"| resume 100,000 dict values: the whole resume call | {med(d[1] for d in dicts):.3f} s | | | |",
    ]
    load = os.getloadavg()[0]
    body = (
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores "
        f"(load average {load:.1f} at the end), 2 workers x 1 thread; medians of {args.repeats} interleaved "
        "runs (resume: of 3).\n\n" + "\n".join(rows)
    )
    print(body)
    if args.write:
        write_section("journal", f"python bench/journal.py --repeats {args.repeats} --write", body)


if __name__ == "__main__":
    main()
