"""What journaling a `--persist` run costs (issue 18 item 1: recipes, not values), 2 workers x 1 thread.

    .venv/bin/python bench/journal_persist.py [--repeats 7] [--write]

A journaled `--persist` run publishes each batch's new handles on the scheduler (one
`publish_dataset` call a batch, `handles.publish`) and appends their recipes to the journal;
journaling off does neither. The same run, journal on and off interleaved round-robin in one
process, medians over `--repeats`:

1. 2,000 tiny items (`x + 1`): wall time per item, on / off, the difference; and beside it the
   time spent in the two additions themselves (`handles.publish` and `Writer.write`, timed in
   the kernel's result path): what journaling adds without the noise of the rest of the run.
2. 200 items of ~10 ms of CPU work: wall time, on / off, the ratio.
3. Releasing the run (`.release()` of its handles, then the workers' memory freed): on / off.

`--write` replaces the `## journal-persist` section of bench/RESULTS.md with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
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
from nbcluster.run import engine  # noqa: E402

TINY = 2_000
WORK_ITEMS = 200


class Timer:
    """Seconds spent in `handles.publish` (as the engine calls it) and `Writer.write`."""

    def __init__(self) -> None:
        self.publish = 0.0
        self.write = 0.0
        self._publish = engine.publish
        self._write = journal.Writer.write

    def __enter__(self) -> Timer:
        timer, publish, write = self, self._publish, self._write

        def timed_publish(*args: Any) -> None:
            t = time.perf_counter()
            publish(*args)
            timer.publish += time.perf_counter() - t

        def timed_write(self: Any, *args: Any, **kwargs: Any) -> None:
            t = time.perf_counter()
            write(self, *args, **kwargs)
            timer.write += time.perf_counter() - t

        engine.publish = timed_publish  # type: ignore[assignment]
        journal.Writer.write = timed_write  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        engine.publish = self._publish
        journal.Writer.write = self._write  # type: ignore[method-assign]


def held(client: Any) -> int:
    def count(dask_worker: Any) -> int:
        return sum(1 for k in dask_worker.data if str(k).startswith("persist-"))

    return sum(client.run(count).values())


def released(client: Any, results: Any) -> float:
    """Seconds from `.release()` until no worker holds a --persist value any more."""
    t = time.perf_counter()
    results.release()
    while held(client):
        time.sleep(0.01)
    return time.perf_counter() - t


def run_pair(
    cell: str, over: str, ns: dict[str, Any], repeats: int, client: Any
) -> tuple[list[float], list[float], list[tuple[float, float]], list[float], list[float]]:
    """(on, off, (publish, write) seconds, release on, release off) for interleaved runs."""
    on: list[float] = []
    off: list[float] = []
    inside: list[tuple[float, float]] = []
    free_on: list[float] = []
    free_off: list[float] = []
    for r in range(repeats):
        order = (True, False) if r % 2 == 0 else (False, True)
        for enabled in order:
            with dask.config.set({"nbcluster.journal.enabled": enabled}), Timer() as timer:
                body = f"{cell}  # {r} {enabled}"  # a fresh identity each time: no hint, no resume
                t = time.perf_counter()
                res = nbcluster.distribute(body, over=over, namespace=ns, persist=True, into="held")
                elapsed = time.perf_counter() - t
            assert res.ok, (res.counts(), res.errors[:2])
            (on if enabled else off).append(elapsed)
            if enabled:
                inside.append((timer.publish, timer.write))
            (free_on if enabled else free_off).append(released(client, res))
            ns.pop("held", None)
            del res
    return on, off, inside, free_on, free_off


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    dask.config.set({"nbcluster.journal.path": tempfile.mkdtemp(prefix="nbcluster-journal-persist-bench-")})
    n = calibrate()
    cluster = nbcluster.start(workers=2, threads=1, name="journal-persist-bench")
    try:
        client = cluster.client
        client.wait_for_workers(2)
        nbcluster.distribute("x", over="x in range(100)", namespace={})  # warm the workers
        tiny = run_pair("x + 1", f"x in range({TINY})", {}, args.repeats, client)
        worked = run_pair(
            "work(n)", f"x in range({WORK_ITEMS})", {"work": work, "n": n}, args.repeats, client
        )
    finally:
        cluster.stop()

    med = statistics.median
    us = 1e6 / TINY
    t_on, t_off, t_in, f_on, f_off = tiny
    w_on, w_off, w_in, _, _ = worked
    rows = [
        "| measurement | journal on | journal off | ratio / difference |",
        "|---|---:|---:|---:|",
        f"| {TINY:,} tiny items, wall per item | {med(t_on) * us:.1f} us | {med(t_off) * us:.1f} us | "
        f"{(med(t_on) - med(t_off)) * us:+.1f} us ({med(t_on) / med(t_off):.2f}x) |",
        f"| {TINY:,} tiny items, in `handles.publish`, per item | {med(a for a, _ in t_in) * us:.2f} us | | |",
        f"| {TINY:,} tiny items, in `Writer.write`, per item | {med(b for _, b in t_in) * us:.2f} us | | |",
        f"| {WORK_ITEMS} items of 10 ms, wall | {med(w_on):.3f} s | {med(w_off):.3f} s | "
        f"{med(w_on) / med(w_off):.3f}x |",
        f"| {WORK_ITEMS} items of 10 ms, in `handles.publish` + `Writer.write` | "
        f"{med(a + b for a, b in w_in) * 1e3:.1f} ms | | |",
        f"| {TINY:,} tiny items: `.release()` until the workers hold none | {med(f_on) * 1e3:.0f} ms | "
        f"{med(f_off) * 1e3:.0f} ms | |",
    ]
    load = os.getloadavg()[0]
    body = (
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores "
        f"(load average {load:.1f} at the end), 2 workers x 1 thread, `--persist` runs; medians of "
        f"{args.repeats} interleaved runs.\n\n" + "\n".join(rows)
    )
    print(body)
    if args.write:
        write_section(
            "journal-persist", f"python bench/journal_persist.py --repeats {args.repeats} --write", body
        )


if __name__ == "__main__":
    main()
