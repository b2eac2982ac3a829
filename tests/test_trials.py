"""Trials on a real cluster: reports reaching the kernel while items run, stoppers, stops,
timeouts (``run/trials.py``, ``worker/trial.py``).

The shared cluster has 2 workers of 1 thread. Items wait on Dask `Event`s where a test
needs them held, never on sleeps of the test's own.
"""

from __future__ import annotations

import time
from typing import Any

import dask.config
import pytest
from distributed import Event

import nbcluster
from nbcluster import errors
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.worker import trial
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
    runs = nbcluster.distribute(held("trials-live"), grid={"x": [0, 1]}, wait=False)
    try:
        assert until(lambda: len(runs.metrics) == 2, 10), "the first reports did not arrive while the items ran"
        seen = time.time()
        frame = runs.metrics
        assert list(frame.columns) == ["item", "x", "step", "loss", "time"]
        assert (seen - frame["time"]).max() < 1.5  # within a second of the report, and the poll
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


def test_stopping_an_item_that_never_reports_frees_its_worker(cluster: ClusterHandle) -> None:
    def spin(_: int) -> None:
        while True:  # never reports, never sleeps: only a forced stop ends it
            pass

    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        runs = nbcluster.distribute(spin, over=[0], objective="loss:min", wait=False)
        assert until(lambda: 0 in runs._trials.begun, 30)
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
