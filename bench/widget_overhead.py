"""Wall time of a 2,000-item distribute cell with the live widget against the same cell
without it, median of 5 each (target: under 3% slower).

Everything is real: a 2-worker x 1-thread nbcluster cluster, an ipykernel started with
jupyter_client, the cell executed there and its iopub messages drained as a front end
would (the widget's comm traffic is counted). The time is the client's: from sending the
cell to the kernel going idle, so the widget's start, its polling thread (which shares
the kernel's CPU) and the final freeze are all inside it. Items are ~3 ms of CPU each, so
a run lasts a few seconds and the widget (shown after 0.75 s) is live for most of it.
Runs alternate (off, on, off, on, ...) to spread the machine's other load.

NOTE: until the `%%distribute` magic passes `progress=widgets.progress_hook()`, the cell
calls the engine's Python API (`nbcluster.run.distribute`), which the magic is a
thin layer over; with the magic wired, `--magic` times `%%distribute` itself (widget on)
against the API without a hook (widget off).

Run: .venv/bin/python bench/widget_overhead.py [--runs 5] [--items 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import psutil

SETUP = """
import time, nbcluster
from nbcluster import widgets
from nbcluster.run.api import distribute
nbcluster.use({name!r})
%load_ext nbcluster
"""

BODY = "t0 = time.perf_counter()\\nwhile time.perf_counter() - t0 < 0.003:\\n    pass\\nx"

CELL = """
_r = distribute({body!r}, over="x in range({items})", progress={progress})
assert _r.ok
"""

MAGIC = """%%distribute --over "x in range({items})" --into _r
t0 = time.perf_counter()
while time.perf_counter() - t0 < 0.003:
    pass
x
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--magic", action="store_true", help="time %%distribute itself for the widget-on runs")
    args = ap.parse_args()

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    from jupyter_client.manager import start_new_kernel

    import nbcluster

    handle = nbcluster.start(workers=2, threads=1, name="bench-widget")
    km, kc = start_new_kernel(kernel_name="python3")
    kernel = psutil.Process(km.provisioner.process.pid)
    try:
        _run(kc, SETUP.format(name=handle.name))
        body = BODY.encode().decode("unicode_escape")
        off_cell = CELL.format(body=body, items=args.items, progress="None")
        on_cell = (
            MAGIC.format(items=args.items)
            if args.magic
            else CELL.format(body=body, items=args.items, progress="widgets.progress_hook()")
        )
        # Warm up both: workers import, code shipped, ipywidgets/anywidget imported in the
        # kernel (a one-time ~0.3 s, paid by the first widget of a session).
        _run(kc, off_cell)
        _run(kc, on_cell)
        off, on, cpu_off, cpu_on = [], [], [], []
        for i in range(args.runs):
            t, stats = _run(kc, off_cell, kernel)
            off.append(t)
            cpu_off.append(stats["kernel_cpu"])
            t, stats = _run(kc, on_cell, kernel)
            on.append(t)
            cpu_on.append(stats["kernel_cpu"])
            print(f"run {i + 1}: without widget {off[-1]:.3f} s (kernel CPU {cpu_off[-1]:.3f} s), "
                  f"with widget {on[-1]:.3f} s (kernel CPU {cpu_on[-1]:.3f} s; {stats['comm_msgs']} comm "
                  f"messages, {stats['comm_bytes'] / 1000:.1f} kB)")  # fmt: skip
        mo, mn = statistics.median(off), statistics.median(on)
        co, cn = statistics.median(cpu_off), statistics.median(cpu_on)
        print(f"median of {args.runs}: without {mo:.3f} s, with {mn:.3f} s -> {100 * (mn - mo) / mo:+.1f}% wall; "
              f"kernel CPU {co:.3f} s -> {cn:.3f} s ({args.items} items, 2 workers x 1 thread)")  # fmt: skip
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        handle.stop()


def _run(kc, code: str, kernel: psutil.Process | None = None) -> tuple[float, dict[str, float]]:
    stats = {"comm_msgs": 0, "comm_bytes": 0, "kernel_cpu": 0.0}
    errors: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] in ("comm_open", "comm_msg", "comm_close"):
            stats["comm_msgs"] += 1
            stats["comm_bytes"] += len(json.dumps(msg["content"], default=str))
        elif msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))

    cpu0 = sum(kernel.cpu_times()[:2]) if kernel else 0.0
    t = time.perf_counter()
    reply = kc.execute_interactive(code, output_hook=hook, timeout=600)
    elapsed = time.perf_counter() - t
    stats["kernel_cpu"] = sum(kernel.cpu_times()[:2]) - cpu0 if kernel else 0.0
    if reply["content"]["status"] != "ok" or errors:
        raise RuntimeError(f"cell failed:\n{code}\n" + "\n".join(errors))
    return elapsed, stats


if __name__ == "__main__":
    main()
