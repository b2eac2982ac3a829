"""The front end at scale: what status, the live widget and the sidebar cost at 10, 100
and 1,000 workers (issue "The scale envelope", front-end figures).

Two parts, each printed as a table and, with --write, kept in bench/RESULTS.md:

1. Drawing, in Debian's Chromium (Playwright), from synthetic snapshots of N workers
   (`big_view` of tests/test_widgets_browser.py: the 16 busiest described, all summarised,
   4,000 tasks, bands): the median time of one frame (renderTaskStream + renderResources,
   as the widget and the sidebar draw it) and the DOM elements it leaves, over --runs
   frames; and the frozen picture's Python render time and bytes.
2. A real nbcluster cluster (its own scheduler, supervisor and plugins, over TLS) with
   N-1 simulated workers: real Dask workers, hosted many to a process on loopback
   addresses (tests/sim_workers.py) -- a SIMULATION of N machines' workers on this one.
   Per size: the bytes of one second of `nbcluster_metrics` news (an answer `since` the
   cursor of a second before) with every worker described, against the `detail=16`
   answer the widget and the sidebar fetch (no tasks run meanwhile); the lines of
   `%cluster status`; the bytes of one sidebar stream push of the cluster (compact) against
   the full REST answer; and the status widget's comm traffic in bytes/s while 2,000
   tiny tasks run, over the time they take; and, on the scheduler, the CPU time of the
   metrics plugin's sampling round and of one `detail=16` answer (median of 5), with the
   share of one core they take with one widget or sidebar open.

Run: /work/venv/bin/python bench/scale.py [--sizes 10,100,1000] [--runs 5] [--write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402

FRAME = """([view, runs]) => {
  const a = document.createElement("div"), b = document.createElement("div");
  document.body.replaceChildren(a, b);
  const times = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    G.renderTaskStream(a, view, { window: null });
    G.renderResources(b, view, { window: 60 });
    document.body.getBoundingClientRect();  // force layout: the frame as the user gets it
    times.push(performance.now() - t0);
  }
  times.sort((x, y) => x - y);
  return { median: times[Math.floor(times.length / 2)], nodes: document.body.querySelectorAll("*").length };
}"""


def drawing(sizes: list[int], runs: int) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    from nbcluster.widgets._static import render_html
    from tests.browser_helpers import launch_chromium
    from tests.test_widgets_browser import _module, big_view

    rows = []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 1400})
            page.set_content("<!doctype html><html><body></body></html>")
            page.add_script_tag(content=_module(), type="module")
            page.wait_for_function("window.G !== undefined")
            for n in sizes:
                view = big_view(workers=n, hosts=1)
                if n <= 16:  # a small cluster is described whole, and has per-worker samples
                    view["workers"] = {a: w for a, w in list(view["workers"].items())}
                frame = page.evaluate(FRAME, [view, runs])
                t = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    html = render_html(None, view)
                    t.append(time.perf_counter() - t0)
                rows.append({"workers": n, "frame_ms": frame["median"], "nodes": frame["nodes"],
                             "static_ms": 1000 * statistics.median(t), "static_kb": len(html) / 1000})  # fmt: skip
        finally:
            browser.close()
    return rows


class Recorder:
    def __init__(self) -> None:
        self.shown = threading.Event()

    def show(self, bundle: dict[str, Any]) -> None:
        self.shown.set()

    def update(self, bundle: dict[str, Any]) -> None:
        pass


def _plugin_cost(dask_scheduler: Any) -> dict[str, float]:
    """On the scheduler: the CPU of the metrics plugin's sampling round (every 500 ms), in
    the worst case of news from every worker, and of one `detail=16` answer since the
    cursor before it (4 a second per open widget or sidebar)."""
    import time as t

    plugin = dask_scheduler.plugins["nbcluster-metrics"]
    rounds, answers = [], []
    for _ in range(5):
        cursor = plugin._next
        plugin._last_sample_time.clear()  # the worst round: news from every worker at once
        t0 = t.process_time()
        plugin.sample()
        t1 = t.process_time()
        plugin.nbcluster_metrics(since=cursor, detail=16)
        answers.append(t.process_time() - t1)
        rounds.append(t1 - t0)
    sample_ms, answer_ms = 1000 * sorted(rounds)[2], 1000 * sorted(answers)[2]
    # Share of one core: 2 rounds a second, and one open view polling 4 times a second.
    return {
        "sample_ms": sample_ms,
        "answer_ms": answer_ms,
        "plugin_pct": (2 * sample_ms + 4 * answer_ms) / 10,
    }


def cluster_figures(n: int) -> dict[str, Any]:
    import nbcluster
    from nbcluster import widgets
    from nbcluster.cluster.handle import ClusterHandle
    from nbcluster.server.handlers import compact, describe
    from tests.scale_helpers import simulated_workers

    def inc(x: int) -> int:
        return x + 1

    with tempfile.TemporaryDirectory() as rt:
        handle: ClusterHandle = nbcluster.start(workers=1, name=f"scale{n}", runtime_dir=rt)
        try:
            simulated = n - 1
            processes = max(1, min(8, simulated // 50 or 1))
            per = simulated // processes
            with simulated_workers(handle, per_process=per, processes=processes, timeout=600):
                total = 1 + per * processes
                handle.client.wait_for_workers(total, timeout=600)
                handle.client.gather(handle.client.map(inc, range(200)))
                time.sleep(1.5)  # a few sampling rounds, so both answers carry samples and bands
                # One second of news, as a poller that keeps up gets it: every worker
                # described, against the 16 busiest and the summary.
                cursor = handle.metrics(detail=16)["cursor"]
                time.sleep(1.0)
                full = len(json.dumps(handle.metrics(cursor), default=str))
                detail = len(json.dumps(handle.metrics(cursor, detail=16), default=str))
                status_lines = len(repr(handle.info()).splitlines())
                plugin_ms = handle.client.run_on_scheduler(_plugin_cost)
                import asyncio

                described = asyncio.run(describe(handle))
                rest = len(json.dumps(described, default=str))
                push = len(json.dumps(compact(described), default=str))
                rec = Recorder()
                view = widgets.status(handle, live_for=None, _display=rec, _widgets=True)
                rec.shown.wait(60)
                sent: list[int] = []
                view.widget.observe(
                    lambda c: sent.append(len(json.dumps(c["new"], default=str))), names="delta"
                )
                t0 = time.perf_counter()
                handle.client.gather(handle.client.map(inc, range(10_000, 12_000)))
                time.sleep(1.0)
                elapsed = time.perf_counter() - t0
                view.close()
                return {"workers": total, "full_kb": full / 1000, "detail_kb": detail / 1000, **plugin_ms,
                        "status_lines": status_lines, "rest_kb": rest / 1000, "push_kb": push / 1000,
                        "comm_kbps": sum(sent) / elapsed / 1000, "updates": len(sent)}  # fmt: skip
        finally:
            handle.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    draw = drawing(sizes, args.runs)
    lines = ["Drawing a synthetic snapshot (16 busiest workers described, 4,000 tasks, bands), "
             f"median of {args.runs} frames in Chromium:", "",
             "| workers | frame (ms) | DOM elements | frozen picture (ms) | frozen picture (kB) |",
             "|---|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {r['workers']} | {r['frame_ms']:.1f} | {r['nodes']} | {r['static_ms']:.1f} | {r['static_kb']:.0f} |"
        for r in draw
    ]
    print("\n".join(lines), flush=True)
    real = []
    for n in sizes:
        real.append(cluster_figures(n))
        print(real[-1], flush=True)
    lines += ["", "A real nbcluster cluster, 1 real worker and the rest SIMULATED (many Dask workers "
              "in a few processes on loopback addresses, tests/sim_workers.py); one run each:", "",
              "| workers | metrics per s, every worker (kB) | metrics per s, detail=16 (kB) | `%cluster status` lines "
              "| REST cluster (kB) | sidebar push (kB) | widget comm (kB/s) | plugin: round / answer (ms) "
              "| plugin share of a core, one view open |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['workers']} | {r['full_kb']:.1f} | {r['detail_kb']:.1f} | {r['status_lines']} | "
              f"{r['rest_kb']:.1f} | {r['push_kb']:.1f} | {r['comm_kbps']:.1f} | "
              f"{r['sample_ms']:.2f} / {r['answer_ms']:.2f} | {r['plugin_pct']:.2f}% |" for r in real]  # fmt: skip
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section(
            "scale: front end", " ".join(["/work/venv/bin/python bench/scale.py", *sys.argv[1:]]), body
        )


if __name__ == "__main__":
    main()
