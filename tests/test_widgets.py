"""The live widget's Python side: static picture, progress arithmetic, and the poller.

The poller tests drive `Live` with real Dask work on the session's cluster and record what
it would display (`Recorder`, a real implementation of the display seam); the widget
object is a real `LiveWidget`, whose trait changes are what a front end would receive.
Kernel and browser behaviour are in test_widgets_kernel.py and test_live_browser.py.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import dask.config
import pytest
from dask.utils import format_bytes as dask_format_bytes
from distributed import Event, as_completed

from nbcluster._wire import DIRECT_TOPIC
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.cluster.info import ClusterInfo
from nbcluster.widgets import TextBar, live, status
from nbcluster.widgets._format import format_bytes, format_duration, prefix_color
from nbcluster.widgets._options import LiveOptions
from nbcluster.widgets._progress import RateMeter, is_finished, rank_grid
from nbcluster.widgets._static import render_grid, render_html
from nbcluster.widgets.widget import build_esm
from tests.waiting import until
from tests.widget_helpers import Recorder, broken, square

ROOT = Path(__file__).resolve().parent.parent

# -- pure pieces --------------------------------------------------------------------------


def test_prefix_colours_match_graphs_js() -> None:
    # Values printed by graphs.js's prefixColor (node), so live and saved pictures agree.
    assert prefix_color("inc") == "hsl(313, 55%, 55%)"
    assert prefix_color("slow_inc") == "hsl(261, 55%, 55%)"
    assert prefix_color("é😀x") == "hsl(221, 55%, 55%)"


#: Worker memory sizes around each unit's 0.9 switch, and a 1 GB (decimal) one.
SIZES = [0, 512, 921, 922, 1023, 1024, 943_718, 1_234_567, 10**9, 12 * 2**30, 25_232_932_864, 3 * 2**50]


def test_status_widget_and_sidebar_write_a_workers_memory_alike(tmp_path: Path) -> None:
    # `%cluster status` (ClusterInfo), the saved picture (_static) and the live widget and
    # sidebar (graphs.js's formatBytes, run by node as the browser would) show the same text.
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: graphs.js cannot run here")
    script = tmp_path / "graphs.mjs"
    source = (ROOT / "nbcluster/widgets/static/graphs.js").read_text()
    theme = (ROOT / "nbcluster/widgets/static/theme.json").read_text()
    script.write_text(source.replace('import THEME from "./theme.json";', f"const THEME = {theme};"))
    code = f"import('{script.as_uri()}').then(g => console.log(JSON.stringify({SIZES}.map(g.formatBytes))))"
    in_js = json.loads(subprocess.run([node, "-e", code], capture_output=True, text=True, check=True).stdout)
    for size, sidebar in zip(SIZES, in_js, strict=True):
        worker = {"name": "w", "address": "tls://127.0.0.1:9", "host": "127.0.0.1", "kind": "cpu", "nthreads": 1,
                  "memory": size, "memory_limit": size, "cpu": 0.0, "processing": 0, "gpu": None}  # fmt: skip
        info = ClusterInfo({"name": "c", "address": "tls://127.0.0.1:1", "workers": [worker], "tasks": {}}, now=1.0)
        row = next(line for line in repr(info).splitlines() if line.strip().startswith("w "))
        assert f" {sidebar} / {sidebar} " in row, (size, row)
        assert format_bytes(size) == sidebar == dask_format_bytes(size)


def test_formatting() -> None:
    # One binary format everywhere, Dask's own (which `%cluster status` prints).
    assert format_bytes(1_234_567) == "1.18 MiB" == dask_format_bytes(1_234_567)
    assert format_bytes(25_232_932_864) == "23.50 GiB" == dask_format_bytes(25_232_932_864)
    assert format_bytes(512) == "512 B"
    assert format_duration(75) == "1 min 15 s"
    assert format_duration(3.25) == "3.2 s"


def test_grid_rows_best_first_then_pending() -> None:
    rows = [
        {"params": {"lr": 0.1}, "value": 0.5},
        {"params": {"lr": 0.2}},  # pending
        {"params": {"lr": 0.3}, "value": 0.9},
        {"params": {"lr": 0.4}, "value": "nan?", "status": "error"},
        {"params": {"lr": 0.5}, "value": 0.7},
    ]
    g = rank_grid({"params": ["lr"], "rows": rows}, "max", limit=4)
    assert [r["params"]["lr"] for r in g["rows"]] == ["0.3", "0.5", "0.1", "0.2"]
    assert g["total"] == 5 and g["rows"][0]["value"] == "0.9"
    assert g["rows"][3]["status"] == "pending"
    low = rank_grid({"rows": rows}, "min")
    assert [r["params"]["lr"] for r in low["rows"]][:3] == ["0.1", "0.5", "0.3"]
    assert low["params"] == ["lr"]
    assert rank_grid(None, "max") == {}
    assert g["ranked"] == "max" and low["ranked"] == "min"


def test_grid_rows_keep_item_order_without_an_objective() -> None:
    # No objective: the table does not pretend to know which way is better.
    rows = [{"params": {"lr": 0.1}, "value": 0.5}, {"params": {"lr": 0.2}}, {"params": {"lr": 0.3}, "value": 0.9}]
    g = rank_grid({"params": ["lr"], "rows": rows}, LiveOptions().best, limit=2)
    assert [r["params"]["lr"] for r in g["rows"]] == ["0.1", "0.2"]
    assert g["ranked"] is None and g["total"] == 3
    dicts = [{"params": {"k": i}, "value": {"loss": 1 - i / 10, "acc": i / 10}} for i in range(3)]
    assert [r["params"]["k"] for r in rank_grid({"rows": dicts}, None)["rows"]] == ["0", "1", "2"]
    # A cut table says which rows it shows: the first ones, not "the best".
    assert "first 2 of 3" in render_grid(g) and "best" not in render_grid(g)
    assert "best 2 of 3" in render_grid(rank_grid({"params": ["lr"], "rows": rows}, "max", limit=2))


def test_rate_meter_and_finished() -> None:
    meter = RateMeter(horizon=10)
    assert meter.add(0.0, 0) is None
    assert meter.add(1.0, 20) == pytest.approx(20.0)
    assert meter.add(2.0, 30) == pytest.approx(15.0)
    assert is_finished({"done": 3, "failed": 1, "total": 4})
    assert not is_finished({"done": 3, "total": 4})
    assert not is_finished({"done": 4, "total": 4, "finished": False})


def test_text_bar_redraws_on_a_terminal_and_writes_once_to_a_log() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = TextBar(tty)
    bar.update({"done": 1, "total": 4, "state": "running"})
    bar.finish({"done": 4, "total": 4, "state": "done", "elapsed": 2.0})
    assert tty.getvalue().count("\r") == 2
    assert tty.getvalue().endswith("4 / 4 done (100%) · done in 2.0 s\n")

    log = io.StringIO()
    bar = TextBar(log)
    bar.update({"done": 1, "total": 4})
    bar.finish({"done": 4, "total": 4})
    assert log.getvalue() == "[########################] 4 / 4 done (100%)\n"


def _view(gpu: bool = False) -> dict[str, Any]:
    w0, w1 = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1"
    workers = {
        w0: {"name": "0", "nthreads": 1, "memory_limit": 4_000_000_000, "resources": {}},
        w1: {"name": "<b>1</b>", "nthreads": 2, "memory_limit": 0, "resources": {}},
    }
    if gpu:  # a simulation: no GPU on the test machine
        workers[w0]["gpu"] = {"name": "Simulated", "memory_total": 80_000_000_000}
    sample = {
        "time": 105.0,
        "cpu": 90.0,
        "memory": 2e8,
        "memory_limit": 4e9,
        "net_read": 0.0,
        "net_write": 0.0,
    }
    samples = {w0: [{**sample, "worker": w0, **({"gpu_util": 50, "gpu_memory": 1e9} if gpu else {})}]}
    tasks = [
        {"prefix": "inc", "worker": w0, "start": 100.0, "stop": 101.0, "status": "ok"},
        {"prefix": "inc", "worker": w1, "start": 100.5, "stop": 102.0, "status": "ok"},
        {"prefix": "inc", "worker": w1, "start": 101.0, "stop": 101.5, "status": "error"},
    ]
    return {"now": 106.0, "workers": workers, "tasks": tasks, "samples": samples}


def test_static_picture_shows_progress_lanes_failures_and_no_scripts() -> None:
    counts = {"done": 9, "failed": 1, "running": 0, "total": 10, "state": "done", "elapsed": 6.0}
    html = render_html(counts, _view(), {"params": ["lr"], "rows": [{"params": {"lr": "0.1"}, "value": "3"}]})
    assert 'data-percent="100"' in html and 'data-state="done"' in html
    assert "9 / 10 done (100%) · 1 failed · done in 6.0 s" in html
    assert html.count('class="nbc-lane"') == 2
    assert html.count('class="nbc-task"') == 2 and html.count('class="nbc-task-error"') == 1
    assert "var(--jp-error-color1" in html
    assert html.count('class="nbc-grid-row"') == 1
    assert "<script" not in html and "&lt;b&gt;1&lt;/b&gt;" in html  # names are escaped
    assert "GPU" not in html  # no GPU column without GPUs


def test_static_picture_has_a_gpu_column_only_with_gpus() -> None:
    html = render_html(None, _view(gpu=True))
    assert "GPU 50% · 0.93 GiB" in html and "no GPU" in html  # worker 1 has none


def test_widget_esm_is_one_module() -> None:
    esm = build_esm()
    assert "./graphs.js" not in esm
    assert "export function renderTaskStream" in esm and "export default" in esm
    # No network: nothing imported from anywhere.
    assert not re.search(r"^\s*import\s", esm, flags=re.M)


# -- the poller, driven by real Dask work ---------------------------------------------------


class Counts:
    """A thread-safe progress source over Dask futures, as the distribute engine keeps one."""

    def __init__(self, total: int) -> None:
        self.lock = threading.Lock()
        self.c = {"done": 0, "running": 0, "failed": 0, "total": total}

    def __call__(self) -> dict[str, int]:
        with self.lock:
            return dict(self.c)

    def finish(self, ok: bool) -> None:
        with self.lock:
            self.c["done" if ok else "failed"] += 1


def _gated():
    # Shipped by value, as `square`: waits for the test's go, then squares.
    def gated(x: int, gate: str) -> int:
        from distributed import Event as Gate

        Gate(gate).wait()
        time.sleep(0.05)
        return x * x

    return gated


gated = _gated()


def _run(cluster: ClusterHandle, fn, n: int, counts: Counts, start: int = 0) -> None:
    for f in as_completed(cluster.client.map(fn, range(start, start + n))):
        counts.finish(f.status == "finished")


def test_live_shows_increasing_progress_and_freezes_into_the_final_picture(cluster: ClusterHandle) -> None:
    counts = Counts(30)
    rec = Recorder()
    # Earlier tests' tasks may have started a moment before this run: name ours by key.
    mine = lambda t: t["key"].startswith("square-")  # noqa: E731
    lv = live(counts, cluster.metrics, label="squares", delay=0.2, interval=0.1, task_filter=mine,
              _display=rec, _widgets=True)  # fmt: skip
    seen: list[int] = []
    # The squares start once the widget is there and watched (a gate, not a race with its
    # first frame on a busy machine): 30 x 50 ms on 2 threads, several frames of progress.
    tag = uuid.uuid4().hex[:8]
    gate = Event(f"squares-{tag}", client=cluster.client)
    keys = [f"square-{tag}-{x}" for x in range(1000, 1030)]  # `mine`
    futures = cluster.client.map(gated, range(1000, 1030), gate=gate.name, key=keys)
    assert rec.first_shown.wait(30), "the widget never appeared"
    lv.widget.observe(lambda ch: seen.append(ch["new"].get("done", 0)), names="progress")
    gate.set()
    for f in as_completed(futures):
        counts.finish(f.status == "finished")
    lv.close()

    assert len(rec.shown) == 1
    assert rec.shown[0]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert seen == sorted(seen) and seen[-1] == 30 and len(set(seen)) > 1
    final = rec.updates[-1]
    assert set(final) == {"text/html", "text/plain"}  # the widget is gone from the output
    html = final["text/html"]
    assert 'data-percent="100"' in html and 'data-state="done"' in html
    assert html.count('class="nbc-lane"') == 2  # one lane per worker
    assert html.count('class="nbc-task"') == 30  # this run's tasks only
    assert "squares" in final["text/plain"] and "30 / 30 done" in final["text/plain"]
    assert lv.widget.progress["state"] == "done"


def test_instant_runs_show_nothing(cluster: ClusterHandle) -> None:
    counts = Counts(2)
    rec = Recorder()
    lv = live(counts, cluster.metrics, delay=30, _display=rec, _widgets=True)
    _run(cluster, square, 2, counts, start=2000)
    lv.close()
    assert rec.shown == [] and rec.updates == [] and lv.widget is None


def test_failures_and_cancel_are_reported(cluster: ClusterHandle) -> None:
    counts = Counts(10)
    rec = Recorder()
    lv = live(counts, cluster.metrics, delay=0, interval=0.1, _display=rec, _widgets=True)
    _run(cluster, broken, 3, counts, start=3000)
    lv.close("cancelled")
    html = rec.updates[-1]["text/html"]
    assert 'data-state="cancelled"' in html and "3 failed" in html and "ETA" not in html
    assert html.count('class="nbc-task-error"') == 3


def test_a_feed_that_fails_leaves_the_progress_bar(cluster: ClusterHandle) -> None:
    def no_plugin(since: int | None) -> dict:
        raise ValueError("unknown operation nbcluster_metrics")

    counts = Counts(3)
    rec = Recorder()
    lv = live(counts, no_plugin, delay=0, interval=0.05, _display=rec, _widgets=True)
    _run(cluster, square, 3, counts, start=4000)
    lv.close()
    html = rec.updates[-1]["text/html"]
    assert 'data-percent="100"' in html and "nbc-lane" not in html


def test_status_shows_recent_history_then_freezes(cluster: ClusterHandle) -> None:
    _run(cluster, square, 4, Counts(4), start=5000)
    rec = Recorder()
    st = status(cluster, live_for=0.3, _display=rec, _widgets=True)
    assert until(lambda: rec.updates), "the status view did not freeze"  # its one update: the frozen picture
    assert st.frozen and len(rec.shown) == 1
    html = rec.updates[-1]["text/html"]
    assert html.count('class="nbc-lane"') == 2 and "nbc-progress" not in html
    assert html.count('class="nbc-task"') >= 4


def test_terminal_gets_a_text_bar(cluster: ClusterHandle) -> None:
    counts = Counts(5)
    out = io.StringIO()
    lv = live(counts, cluster.metrics, delay=0, interval=0.05, _widgets=False, _text=TextBar(out))
    _run(cluster, square, 5, counts, start=6000)
    lv.close()
    assert out.getvalue().startswith("[########################] 5 / 5 done (100%)")
    assert lv.widget is None


def test_progress_hook_follows_a_distribute_run_and_only_its_tasks(cluster: ClusterHandle) -> None:
    from nbcluster.run.api import distribute
    from nbcluster.widgets import progress_hook

    rec = Recorder()
    hook = progress_hook(delay=0, interval=0.1, _display=rec, _widgets=True)
    # Other work on the cluster at the same time must not appear in this run's picture.
    other = cluster.client.map(square, range(7000, 7010))
    results = distribute(square, over=range(6), batch=1, on=cluster.client, progress=hook)
    cluster.client.gather(other)
    assert results.values() == [x * x for x in range(6)]
    hook.live.close()
    html = rec.updates[-1]["text/html"]
    assert 'data-percent="100"' in html and "6 / 6 done" in html
    assert html.count('class="nbc-task"') == 6
    assert "<title>distribute on" in html


def test_a_run_frozen_as_it_ends_draws_the_batches_a_worker_ran_directly(cluster: ClusterHandle) -> None:
    from nbcluster.run.api import distribute
    from nbcluster.widgets import progress_hook

    rec = Recorder()
    hook = progress_hook(delay=0, interval=0.1, _display=rec, _widgets=True)
    results = distribute(square, over=range(4), batch=1, on=cluster.client, progress=hook)
    # Closed at once: the workers report their direct batches after the answers, and the
    # picture must wait for those reports, not freeze without the last batches.
    hook.live.close()
    mine = f"distribute-{results.run_id}-"

    def direct() -> list[str]:  # the batches the workers report as run directly, not as tasks
        return [m["key"] for _, m in cluster.client.get_events(DIRECT_TOPIC) if str(m.get("key")).startswith(mine)]

    assert until(lambda: len(direct()) == 4), f"the run's batches did not go to the workers directly: {direct()}"
    html = rec.updates[-1]["text/html"]
    assert "4 / 4 done" in html and html.count('class="nbc-task"') == 4


def test_a_run_over_before_its_view_shows_tells_the_sidebar_its_end(cluster: ClusterHandle) -> None:
    from nbcluster.run.api import distribute
    from nbcluster.widgets import progress_hook

    hook = progress_hook(delay=30, label="quick")  # the view would show after 30 s
    results = distribute(lambda x: x + 1, over=range(8), on=cluster.client, progress=hook)
    assert results.ok and hook.live is None  # nothing made, nothing shown

    def reported() -> dict | None:
        mine = [r for r in cluster.metrics().get("runs") or () if r.get("run") == results.run_id]
        return mine[-1] if mine else None

    assert until(lambda: reported() is not None), "the sidebar never heard of the run"
    assert reported() == {**reported(), "done": 8, "total": 8, "failed": 0, "state": "done", "label": "quick"}
    hook.close()
    assert hook.live is None


def test_terminal_ipython_prints_one_progress_line(cluster: ClusterHandle) -> None:
    code = (
        "import nbcluster\n"
        "from nbcluster import widgets\n"
        "from nbcluster.run.api import distribute\n"
        f"nbcluster.use({cluster.name!r})\n"
        "r = distribute('import time\\ntime.sleep(0.05)\\nx', over='x in range(20)', batch=1,\n"
        "               progress=widgets.progress_hook(delay=0.2))\n"
        "print('ok' if r.ok else 'failed')\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "-c", code],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    bars = [line for line in out.stderr.splitlines() if line.startswith("[")]
    assert len(bars) == 1 and "20 / 20 done (100%)" in bars[0], out.stderr
    assert "LiveWidget" not in out.stdout + out.stderr
    assert out.stdout.strip().endswith("ok")


def test_closing_an_unfinished_run_freezes_it_as_stopped() -> None:
    counts = Counts(10)
    counts.finish(True)
    rec = Recorder()
    lv = live(counts, None, delay=0, interval=0.05, _display=rec, _widgets=True)
    assert rec.first_shown.wait(30)
    lv.close()
    html = rec.updates[-1]["text/html"]
    assert 'data-state="stopped"' in html and "1 / 10 done (10%)" in html and "ETA" not in html
    assert "nbc-lane" not in html  # no feed: progress only


# -- settings (Dask config) -----------------------------------------------------------------


def test_timings_and_bounds_come_from_dask_config() -> None:
    counts = Counts(10)
    now = [0.0]  # the clock seam: the delay is measured on it
    settings = {
        "nbcluster.widget.delay": "30s",
        "nbcluster.widget.max-tasks": 7,
        "nbcluster.widget.max-samples": 3,
        "nbcluster.widget.resource-window": "5s",
    }
    with dask.config.set(settings):
        early, late = Recorder(), Recorder()
        before = live(counts, None, interval=0.05, _display=early, _widgets=True, _clock=lambda: now[0])
        after = live(counts, None, interval=0.05, _display=late, _widgets=True, _clock=lambda: now[0])
    now[0] = 29.0
    before.close()  # its last poll is still inside the configured delay
    now[0] = 31.0
    after.close()
    assert early.shown == [] and before.widget is None
    assert len(late.shown) == 1
    # What the front end draws with: the widget's traits.
    assert after.widget.limits == {"maxTasks": 7, "maxSamples": 3}
    assert after.widget.resource_window == 5.0
    assert after.metrics.tasks.maxlen == 7
