"""Small cells the way a notebook runs them: one at a time, with a pause before each.

    python bench/idle_cells.py [--runs 15] [--pause 0.3] [--direct 500ms]

`bench/overhead.py` runs its cells back to back, after the machine went quiet; a user runs a
cell, reads it, and runs the next. Between those cells the scheduler's and the workers' event
loops go idle, and a batch through the scheduler pays their wake-up. This times an 8-item and
a 20,000-item `%%distribute` cell (`x + 1`) after `--pause` seconds of nothing, through a real
IPython shell on 2 workers x 1 thread, and counts the gathers they needed (a result pushed
ahead of its task's end needs none). `--direct 0` sends every batch through the scheduler
(the `distribute.direct` setting), for the A/B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--pause", type=float, default=0.3)
    parser.add_argument("--direct", default=None, help="the distribute.direct setting (0: through the scheduler)")
    args = parser.parse_args()

    import dask
    import distributed
    from IPython.core.interactiveshell import InteractiveShell

    if args.direct is not None:
        dask.config.set({"nbcluster.distribute.direct": args.direct})
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbcluster")
    shell.run_line_magic("cluster", "start --workers 2 --threads 1")
    gathers = 0
    gather = distributed.Client.gather

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        nonlocal gathers
        gathers += 1
        return gather(self, *a, **k)

    distributed.Client.gather = counted  # type: ignore[method-assign]
    try:
        for size in (8, 20_000):
            shell.run_cell(f"%%distribute --over 'x in range({size})' --into r\nx + 1")  # warm
            gathers, times = 0, []
            for _ in range(args.runs):
                time.sleep(args.pause)
                start = time.perf_counter()
                shell.run_cell(f"%%distribute --over 'x in range({size})' --into r\nx + 1")
                times.append(time.perf_counter() - start)
                assert shell.user_ns["r"].ok
            print(f"{size:>6} items: {statistics.median(times) * 1e3:.2f} ms a cell (median of {args.runs}), "
                  f"{gathers} gathers, direct={args.direct or 'default'}, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        distributed.Client.gather = gather  # type: ignore[method-assign]
        shell.run_line_magic("cluster", "stop")


if __name__ == "__main__":
    main()
