"""Trials on a real cluster: reports reaching the kernel while items run, stoppers, stops,
timeouts (``run/trials.py``, ``worker/trial.py``).

The shared cluster has 2 workers of 1 thread. Items wait on Dask `Event`s where a test
needs them held, never on sleeps of the test's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dask.config
import pytest
from distributed import Event

import nbcluster
from nbcluster import errors
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.worker import trial
from tests.os_helpers import family
from tests.waiting import until


def held(name: str) -> Any:
    """An item that reports, then waits for the test's Event `name`, reporting again after."""

    def item(x: int) -> int:
        from distributed import Event

        import nbcluster

        nbcluster.report(step=1, loss=1.0 / (x + 1))
        Event(name).wait(60)
        nbcluster.report(step=2, loss=0.5 / (x + 1))
        return x

    return item


def test_reports_reach_the_kernel_while_the_item_runs(cluster: ClusterHandle) -> None:
    import pandas  # noqa: F401 - imported before the clock runs: its first import takes a second here

    runs = nbcluster.distribute(held("trials-live"), grid={"x": [0, 1]}, wait=False)
    try:
        seen: dict[int, float] = {}  # item -> when its first report was first seen here

        def arrived() -> bool:
            for i in runs.metrics["item"]:
                seen.setdefault(int(i), time.time())
            return len(seen) == 2

        assert until(arrived, 10), "the first reports did not arrive while the items ran"
        frame = runs.metrics
        assert list(frame.columns) == ["item", "x", "step", "loss", "time"]
        for i, reported in zip(frame["item"], frame["time"], strict=True):
            assert seen[int(i)] - reported < 1.0, "a report took over a second to arrive"
        assert runs.states == ["running", "running"]
    finally:
        Event("trials-live", client=cluster.client).set()
    runs.wait()
    frame = runs.metrics
    assert sorted(zip(frame["item"], frame["step"], strict=True)) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert runs.states == ["done", "done"]
    assert runs.values() == [0, 1]


def ramp(quality: list[float], step_s: float) -> Any:
    """Trial `i` reports acc = quality[i] * step / 27 for 27 steps: its answer is known."""

    def item(i: int) -> float:
        import time

        import nbcluster

        for step in range(1, 28):
            time.sleep(step_s)
            nbcluster.report(step=step, acc=quality[i] * step / 27)
        return quality[i]

    return item


def test_asha_stops_the_losing_trials_and_keeps_the_best(cluster: ClusterHandle) -> None:
    quality = [0.9, 0.8, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.01]
    runs = nbcluster.distribute(ramp(quality, 0.05), over=range(9), objective="acc:max", stopper="asha")
    states = runs.states
    assert states[0] == "done" and runs[0] == 0.9
    assert states[2:] == ["stopped"] * 7, states
    best = runs.best()
    assert (best.item, best.step, best.state) == (0, 27, "done")
    frame = runs.metrics
    for i in range(2, 9):
        stopped = runs[i]
        assert isinstance(stopped, trial.Stopped) and stopped.reason == "stopped by asha"
        assert stopped.step is not None and stopped.step < 27
        assert frame[frame["item"] == i]["step"].max() == stopped.step  # its last metrics are kept
    assert runs.ok


def test_asha_stops_a_fast_trial_at_the_rung_it_lost_at(cluster: ClusterHandle) -> None:
    # Steps of microseconds: without waiting for the verdict at a rung, a dropped trial
    # would run all 27 steps before the kernel's stop could reach it.
    quality = [0.9, 0.8, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.01]
    runs = nbcluster.distribute(ramp(quality, 0.0), over=range(9), objective="acc:max", stopper="asha")
    stopped = [runs[i] for i, state in enumerate(runs.states) if state == "stopped"]
    assert len(stopped) >= 6, runs.states
    assert all(isinstance(s, trial.Stopped) and s.step in (1, 3, 9) for s in stopped), stopped
    assert runs.states[0] == "done" and runs.ok


def test_stopping_an_item_that_never_reports_frees_its_worker(cluster: ClusterHandle) -> None:
    def spin(_: int) -> None:
        while True:  # never reports, never sleeps: only a forced stop ends it
            pass

    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        runs = nbcluster.distribute(spin, over=[0], objective="loss:min", wait=False)
        assert until(lambda: 0 in runs._trials.running.begun, 30)
        asked = time.monotonic()
        runs.stop(0)
        runs.wait(30)
        took = time.monotonic() - asked
    assert runs.states == ["stopped"]
    assert took < 1 + 2, f"the spinning item held its worker {took:.1f} s"
    again = nbcluster.distribute(lambda x: x + 1, over=[1, 2])  # the worker is free
    assert again.values() == [2, 3]


def test_timeout_ends_an_item_timed_out(cluster: ClusterHandle) -> None:
    def slow(x: int) -> int:
        import time

        if x == 1:
            while True:
                time.sleep(0.01)
        return x

    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        began = time.monotonic()
        runs = nbcluster.distribute(slow, over=[0, 1], timeout="1s", wait=False)
        runs.wait(30)
        took = time.monotonic() - began
    assert runs.states == ["done", "timed out"]
    assert runs[0] == 0
    assert took < 1 + 1 + 2 + 2, took


def test_bad_input_is_one_line(cluster: ClusterHandle) -> None:
    with pytest.raises(errors.BadArgument, match="unknown policy 'hyperband'"):
        nbcluster.distribute(lambda x: x, over=[1], objective="acc:max", stopper="hyperband")
    with pytest.raises(errors.BadArgument, match="takes grace, eta, max_t"):
        nbcluster.distribute(lambda x: x, over=[1], objective="acc:max", stopper="asha(rungs=3)")
    with pytest.raises(errors.BadArgument, match="NAME:min or NAME:max"):
        nbcluster.distribute(lambda x: x, over=[1], objective="acc")
    with pytest.raises(errors.BadArgument, match="duration"):
        nbcluster.distribute(lambda x: x, over=[1], timeout="soon")

    def bad(x: int) -> int:
        import nbcluster

        nbcluster.report(loss=0.5)
        nbcluster.report(loss="low")
        return x

    runs = nbcluster.distribute(bad, over=[0], wait=False).wait()
    assert runs.errors[0].type_name == "TypeError"
    assert "a metric must be a number" in runs.errors[0].message
    assert list(runs.metrics["loss"]) == [0.5]  # what it reported before is kept


def test_an_objective_no_report_used_is_said_at_the_end(cluster: ClusterHandle, capsys: pytest.CaptureFixture[str]) -> None:
    def item(x: int) -> int:
        import nbcluster

        nbcluster.report(loss=x)
        return x

    runs = nbcluster.distribute(item, over=[0, 1], objective="accuracy:max")
    assert runs.values() == [0, 1]  # nothing computed is lost
    assert "--objective accuracy was never reported; the items reported loss" in capsys.readouterr().out
    with pytest.raises(errors.BadArgument, match="never reported"):
        runs.best()


def test_report_under_local_and_outside_a_run() -> None:
    nbcluster.report(step=3, loss=0.1)
    assert trial.recorded()[-1] == (3, {"loss": 0.1})
    assert nbcluster.should_stop() is False

    def item(x: int) -> int:
        import nbcluster

        for step in range(1, 4):
            nbcluster.report(loss=x / step)
        return x

    runs = nbcluster.distribute(item, over=[1, 2], local=True, objective="loss:min")
    assert runs.values() == [1, 2]
    frame = runs.metrics
    assert list(frame.columns) == ["item", "param_item", "step", "loss", "time"]  # plain items: `item`
    assert list(frame["step"]) == [1, 2, 3, 1, 2, 3]
    best = runs.best()
    assert (best.item, best.params, best.step) == (0, {"item": 1}, 3)


TRAIN = '''
import time

import nbcluster


def train(x, log):
    ck = nbcluster.checkpoint()
    state = ck.load() or {"epoch": 0}
    with open(log, "a") as f:
        f.write(f"start {x} {state['epoch']}\\n")
    for epoch in range(state["epoch"] + 1, 11):
        time.sleep(0.15)
        with open(log, "a") as f:
            f.write(f"epoch {x} {epoch}\\n")
        ck.save({"epoch": epoch})
        nbcluster.report(step=epoch, loss=1 / epoch)
    return x
'''

KERNEL = '''
import os, signal, sys, time
sys.path.insert(0, {folder!r})
import cloudpickle, trainmod
cloudpickle.register_pickle_by_value(trainmod)  # the workers cannot import it
import nbcluster
nbcluster.start(workers=2, threads=1)
log = {log!r}
if sys.argv[1] == "first":
    runs = nbcluster.distribute(trainmod.train, grid={{"x": [0, 1], "log": [log]}}, wait=False)
    # Killed once item 0 has saved epoch 4: the kernel dies mid-run, as kill -9 does it.
    while "epoch 0 4" not in open(log).read() if os.path.exists(log) else True:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
runs = nbcluster.distribute(trainmod.train, grid={{"x": [0, 1], "log": [log]}}, resume=True)
print("VALUES", runs.values(), runs.states)
'''


def test_checkpoint_then_a_killed_kernel_then_resume_goes_on_from_the_saved_epoch(
    runtime_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "trainmod.py").write_text(TRAIN)
    log = tmp_path / "epochs.log"
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL.format(folder=str(tmp_path), log=str(log)))
    env = {**os.environ, "DASK_NBCLUSTER__JOURNAL__PATH": str(tmp_path / "journal"),
           "DASK_NBCLUSTER__CHECKPOINT__PATH": str(tmp_path / "checkpoints")}  # fmt: skip
    first = subprocess.run([sys.executable, str(script), "first"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    # Its cluster goes when its supervisor sees the owner gone; until then its workers train on
    # (and checkpoint). The second kernel starts once they are gone, as a user's restart would
    # find them after a moment: a resume racing a still-running trial is another test's matter.
    supervisors = [json.loads(p.read_text())["supervisor_pid"] for p in runtime_dir.glob("*.json")]
    first_cluster = [proc for pid in supervisors for proc in family(pid, gone_ok=True)]
    assert until(lambda: not any(proc.is_running() for proc in first_cluster), seconds=60), first_cluster
    saved = (tmp_path / "checkpoints").glob("*/*.ckpt")
    assert sorted(p.name for p in saved) == ["0.ckpt", "1.ckpt"]
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in (tmp_path / "checkpoints").glob("*/*.ckpt"))
    second = subprocess.run([sys.executable, str(script), "second"], env=env, capture_output=True, text=True, timeout=120)
    assert "VALUES [0, 1] ['done', 'done']" in second.stdout, second.stdout + second.stderr[-2000:]
    lines = [line.split() for line in log.read_text().splitlines()]
    starts = [i for i, line in enumerate(lines) if line[0] == "start"]
    assert len(starts) == 4  # each item started twice: the first kernel's run, then the resumed one
    for x in ("0", "1"):
        resumed = max(i for i in starts if lines[i][1] == x)
        begun_at = int(lines[resumed][2])
        assert begun_at >= (4 if x == "0" else 1), lines  # from its checkpoint, not from zero
        ran = [int(e) for kind, item, e in lines[resumed + 1 :] if kind == "epoch" and item == x]
        assert ran == list(range(begun_at + 1, 11)), (x, ran)  # the epochs the workers ran after resuming


def test_checkpoints_that_cannot_be_kept_warn_once_and_the_item_goes_on(cluster: ClusterHandle, tmp_path: Path) -> None:
    def item(x: int) -> tuple[bool, bool, Any]:
        import threading

        import nbcluster

        ck = nbcluster.checkpoint()
        first = ck.save({"epoch": 1})
        lock = ck.save(threading.Lock())
        return first, lock, ck.load()

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with dask.config.set({"nbcluster.checkpoint.path": str(blocked), "nbcluster.journal.path": str(tmp_path / "j")}):
        runs = nbcluster.distribute(item, over=[5])
    assert runs.values() == [(False, False, None)]  # the run went on
    said = runs.output(0).strip().splitlines()
    assert len(said) == 1 and "cannot write" in said[0] and "nbcluster.checkpoint.path" in said[0], said
    with dask.config.set({"nbcluster.checkpoint.path": str(tmp_path / "ck"), "nbcluster.journal.path": str(tmp_path / "j")}):
        runs = nbcluster.distribute(item, over=[6])
    assert runs.values() == [(True, False, {"epoch": 1})]
    said = runs.output(0).strip().splitlines()
    assert len(said) == 1 and "cannot pickle a lock" in said[0], said


def printed_while_held(cluster: ClusterHandle, name: str) -> tuple[Any, str | None, str]:
    """Run one item, 0, that prints a line and reports, then waits for the Dask Event `name`,
    which this sets once the cell shows the line (or after 30 s), then prints another.
    Returns the run, the cell's text when the line came (None if it did not), and at the end."""
    import contextlib
    import io
    import threading

    def item(x: int) -> int:
        from distributed import Event

        import nbcluster

        print(f"epoch 1 of {x}")
        nbcluster.report(loss=1.0)
        Event(name).wait(60)  # held until the cell has shown the line above
        print(f"epoch 2 of {x}")
        return x

    cell = io.StringIO()
    released: list[str | None] = []

    def release() -> None:  # the test's side: lets the item end once its first line is in the cell
        came = until(lambda: "epoch 1 of 0" in cell.getvalue(), 30)
        released.append(cell.getvalue() if came else None)
        Event(name, client=cluster.client).set()

    watcher = threading.Thread(target=release)
    watcher.start()
    with contextlib.redirect_stdout(cell):
        runs = nbcluster.distribute(item, over=[0])
    watcher.join()
    return runs, released[0], cell.getvalue()


def test_an_items_output_reaches_the_cell_before_the_item_ends(cluster: ClusterHandle) -> None:
    runs, released, shown = printed_while_held(cluster, "trials-output")
    assert released is not None and "epoch 2" not in released, "the item's first line was not shown while it ran"
    assert shown.count("epoch 1 of 0") == 1 and shown.count("epoch 2 of 0") == 1, shown
    assert shown.index("── item 0 (item=0) ──") < shown.index("epoch 1 of 0") < shown.index("epoch 2 of 0")
    assert runs.output(0) == "epoch 1 of 0\nepoch 2 of 0\n"


def test_a_late_subscription_loses_no_message_of_an_item_that_began_at_once(
    cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dask sends a subscription to a topic on the client's batched stream, while a run's
    first items go to the workers directly: simulated here by a stream that delivers the
    subscription 1 s late. An item's first line must still reach the cell while it runs,
    and a timeout, which counts from the item's first message, must still end it."""
    from distributed import Client

    from nbcluster._wire import TRIAL_TOPIC_PREFIX

    send = Client._send_to_scheduler

    def late(self: Client, msg: dict[str, Any]) -> None:
        if msg.get("op") == "subscribe-topic" and str(msg.get("topic")).startswith(TRIAL_TOPIC_PREFIX):
            self.loop.add_callback(self.loop.call_later, 1.0, send, self, msg)
        else:
            send(self, msg)

    monkeypatch.setattr(Client, "_send_to_scheduler", late)
    runs, released, _ = printed_while_held(cluster, "trials-late")
    assert released is not None and runs.values() == [0], "the item's first line was lost"

    def endless(x: int) -> int:
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # Python code: a stop's interrupt reaches it
            time.sleep(0.01)
        return x

    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        runs = nbcluster.distribute(endless, over=[0], timeout="1s", wait=False)
        runs.wait(60)
    assert runs.states == ["timed out"], "the timeout never began: the item's first message was lost"


def test_the_magic_takes_objective_stop_and_timeout(shell: Any, cluster: ClusterHandle) -> None:
    from IPython.core.error import UsageError

    from tests.shell_helpers import cell

    runs = cell(shell, '''%%distribute --grid "q=[0.9, 0.1, 0.2, 0.05]" --objective acc:max --stop "asha(grace=1, eta=3, max_t=27)" --timeout 2m
import time
import nbcluster
for step in range(1, 28):
    time.sleep(0.03)
    nbcluster.report(step=step, acc=q * step)
q''')
    assert runs.states[0] == "done" and runs.best().params == {"q": 0.9}
    assert "stopped" in runs.states[1:]
    with pytest.raises(UsageError, match="unknown policy 'sha'"):
        cell(shell, '%%distribute --over "x in [1]" --objective acc:max --stop sha\nx')
    with pytest.raises(UsageError, match="--stop judges trials by their objective"):
        cell(shell, '%%distribute --over "x in [1]" --stop asha\nx')


def test_the_live_table_ranks_by_the_objective_or_claims_no_order(cluster: ClusterHandle) -> None:
    from nbcluster.widgets import ResultsProgress
    from nbcluster.widgets._progress import rank_grid

    def item(lr: float) -> str:
        import nbcluster

        nbcluster.report(loss=lr * 10)
        return "a model"  # not a number: the table ranks by the reported loss

    runs = nbcluster.distribute(item, grid={"lr": [0.3, 0.1, 0.2]}, objective="loss:min")
    counts = ResultsProgress(runs)()
    assert counts["best"] == "min"
    ranked = rank_grid(counts["grid"], counts["best"])
    assert [row["params"]["lr"] for row in ranked["rows"]] == ["0.1", "0.2", "0.3"]  # the lowest loss first
    plain = nbcluster.distribute(item, grid={"lr": [0.3, 0.1, 0.2]})
    counts = ResultsProgress(plain)()
    assert counts["best"] is None  # no objective: the rows keep the run's order
    assert [row["params"]["lr"] for row in rank_grid(counts["grid"], None)["rows"]] == ["0.3", "0.1", "0.2"]
    with pytest.raises(errors.BadArgument, match=r"best\(\) needs an objective.*--objective NAME:min\|max"):
        plain.best()
    numbers = nbcluster.distribute(lambda lr: lr, grid={"lr": [0.3, 0.1, 0.2]})  # not a trial run at all
    assert "best" not in ResultsProgress(numbers)()  # the view's default applies: no order
    with pytest.raises(errors.BadArgument, match=r"best\(\) needs an objective"):
        numbers.best()


def test_cancel_asks_running_trials_to_stop_and_keeps_finished_items(cluster: ClusterHandle) -> None:
    def item(x: int) -> int:
        import time

        import nbcluster

        step = 0
        while x and True:  # items 1 and 2 run until told
            step += 1
            time.sleep(0.01)
            nbcluster.report(step=step, loss=1.0 / step)
        return x

    runs = nbcluster.distribute(item, over=[0, 1, 2], wait=False)
    assert until(lambda: {1, 2} <= set(runs._trials.running.begun), 30)
    runs.cancel()  # what Ctrl-C in the waiting cell does
    runs.wait(10)
    assert runs.states == ["done", "stopped", "stopped"]
    assert runs[0] == 0 and runs[1].reason == "stopped from the notebook"


def test_an_item_stuck_in_a_c_call_has_its_worker_restarted(runtime_dir: Path) -> None:
    own = nbcluster.start(workers=1, threads=1, name="trials-restart")
    try:

        def stuck(x: int) -> int:
            import time

            if x == 0:
                time.sleep(3600)  # one C call: no Python line runs to take the interrupt
            return x

        with dask.config.set({"nbcluster.stop.grace": "0.5s"}):
            runs = nbcluster.distribute(stuck, over=[0, 1], timeout="0.5s", wait=False, on=own.client)
            began = time.monotonic()
            runs.wait(60)
            took = time.monotonic() - began
        assert runs.states == ["timed out", "done"], (runs.states, runs.errors)
        assert runs[1] == 1
        assert took < 0.5 + 0.5 + 2 + 15, took  # grace and 2 s, plus a worker's restart on a loaded machine
    finally:
        own.stop()


def test_a_thousand_reports_a_second_lose_nothing_and_match_the_declared_event(cluster: ClusterHandle) -> None:
    from nbcluster._wire import TrialEvent, problems

    def item(x: int) -> int:
        import time

        import nbcluster

        began = time.perf_counter()
        for step in range(1, 2001):  # 2,000 reports in about a second: the two items together, 4,000
            nbcluster.report(step=step, loss=1.0 / step, x=float(x))
            time.sleep(max(0.0, began + step / 2000 - time.perf_counter()))
        return x

    runs = nbcluster.distribute(item, over=[0, 1], objective="loss:min")
    frame = runs.metrics
    assert len(frame) == 4000 and sorted(frame.groupby("item")["step"].nunique()) == [2000, 2000]
    assert runs._trials.reports.dropped == 0
    events = cluster.client.get_events(runs._trials.topic)
    assert 2 * 2 <= len(events) < 200  # batched: a few dozen messages, not 4,000
    for _, message in events:
        assert problems(message, TrialEvent) == [], message


def test_a_retried_trial_reports_too(cluster: ClusterHandle, tmp_path: Path) -> None:
    marker = str(tmp_path / "failed-once")

    def item(x: int) -> int:
        import os

        import nbcluster

        nbcluster.report(step=1, loss=float(x))
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("first attempt")
        nbcluster.report(step=2, loss=float(x) / 2)
        return x

    runs = nbcluster.distribute(item, over=[4], objective="loss:min", wait=False).wait()
    assert runs.states == ["failed"]
    runs.retry()
    assert runs.states == ["done"]
    assert list(runs.metrics["step"]) == [1, 1, 2]  # the first attempt's report, then the retry's
    assert runs.best().value == 2.0


def test_the_live_view_draws_one_curve_per_trial_the_best_highlighted_the_stopped_grey(cluster: ClusterHandle) -> None:
    from nbcluster.widgets import ResultsProgress
    from nbcluster.widgets._static import render_html

    quality = [0.9, 0.8, 0.3, 0.25, 0.2, 0.15]
    runs = nbcluster.distribute(ramp(quality, 0.05), over=range(6), objective="acc:max", stopper="asha")
    curves = ResultsProgress(runs)()["curves"]
    assert curves["metric"] == "acc" and curves["mode"] == "max"
    series = curves["series"]
    assert len(series) == 6 and series[0]["best"] and series[0]["label"].startswith("0:")
    assert series[0]["points"][-1] == [27, pytest.approx(0.9)]
    kinds = {s["label"].split(":")[0]: s["state"] for s in series}
    assert [kinds[str(i)] for i in range(2, 6)] == ["stopped"] * 4
    frozen = render_html({"total": 6, "done": 6, "state": "done"}, None, curves=curves)
    assert frozen.count('class="nbc-curve ') == 6  # the frozen picture keeps them
    stopped = sum(s["state"] == "stopped" for s in series)  # 4, or 5 when item 1 reached a rung second
    assert frozen.count("nbc-curve-best") == 1 and frozen.count("nbc-curve-stopped") == stopped >= 4
    assert frozen.index("nbc-curve-best") > frozen.rindex("nbc-curve-stopped")  # the best drawn on top


def test_the_live_curves_and_the_frozen_ones_are_drawn_alike_in_chromium() -> None:
    from playwright.sync_api import sync_playwright

    from nbcluster.widgets._curves import render_curves
    from nbcluster.widgets._theme import STATIC, inline_theme
    from tests.browser_helpers import launch_chromium

    curves = {"metric": "acc", "mode": "max", "series": [
        {"label": "0: lr=0.1", "points": [[1, 0.2], [2, 0.5], [3, 0.9]], "state": "done", "best": True},
        {"label": "1: lr=0.3", "points": [[1, 0.1]], "state": "stopped", "best": False},
        {"label": "2: lr=0.2", "points": [[1, 0.15], [2, 0.3]], "state": "running", "best": False},
    ]}  # fmt: skip
    module = inline_theme((STATIC / "graphs.js").read_text(encoding="utf-8")) + "\nwindow.G = { renderCurves };\n"
    describe = "els => els.map(e => [e.getAttribute('class'), e.getAttribute('points'), e.getAttribute('stroke')])"
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page()
            page.set_content(f'<div id="frozen">{render_curves(curves)}</div><div id="live"></div>')
            page.add_script_tag(content=module, type="module")
            page.wait_for_function("window.G !== undefined")
            page.evaluate("c => G.renderCurves(document.getElementById('live'), c)", curves)
            live = page.locator("#live polyline").evaluate_all(describe)
            frozen = page.locator("#frozen polyline").evaluate_all(describe)
            assert live == frozen and len(live) == 3
            assert [c for c, _, _ in live] == ["nbc-curve nbc-curve-stopped", "nbc-curve nbc-curve-other",
                                               "nbc-curve nbc-curve-best"]  # fmt: skip
            assert page.locator("#live .nbc-curves").inner_text() == page.locator("#frozen .nbc-curves").inner_text()
        finally:
            browser.close()
