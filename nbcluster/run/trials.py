"""The kernel side of a trial run: its reports, its stopper, its stops, its timeouts.

A run is a *trial run* when it names an objective, a stopper or a timeout, or when its
code mentions `report`, `should_stop` or `checkpoint`. Its items then run one a task (so
one can be stopped without its neighbours) as their thread's current item
(``worker/trial.py``), and `Trials`, made with the run, follows them:

- Reports arrive on the run's Dask event topic (a `TrialEvent` per item every 0.2 s at
  most; ``--local`` items hand them over in-process). Each is kept as a row of `metrics`
  (at most `MAX_ROWS`), and each report of the objective is passed to the stopper
  (`stoppers.py`), oriented so that larger is better.
- A stop (the stopper's decision, ``--timeout``, `Results.stop`, Ctrl-C) first *asks*:
  every worker is told (`trial.stop_items`), so ``should_stop()`` is True in the item and
  its next ``report()`` raises `TrialStopped`. After ``nbcluster.stop.grace`` an item still
  running is *forced*: `trial.interrupt` raises `TrialStopped` in its thread, and if it has
  not ended 2 s later, its worker is restarted (Dask runs the worker's other tasks again).
- Each item ends in one state: done, stopped, timed out, failed (or cancelled, pending).

One thread a run (``nbcluster-trials-<run id>``) does the stops and the timeouts, so the
client's event loop, which delivers the reports, never waits on the cluster.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbcluster import config
from nbcluster._wire import TRIAL_TOPIC_PREFIX, TrialEvent, TrialSpec
from nbcluster.errors import BadArgument
from nbcluster.run.stoppers import Stopper
from nbcluster.worker import trial

MAX_ROWS = 1_000_000  # metric rows kept per run; past it, reports still drive the stopper
FORCE_WAIT_S = 2.0  # after an interrupt, how long an item has to end before its worker restarts
TICK_S = 0.1  # how often the run's thread looks at timeouts and stops due
CURVE_POINTS = 200  # points kept per item for the live view's curves (halved when past twice this)
CURVES = 40  # curves drawn at most: the best, then the others in item order
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Objective:
    """``--objective NAME:min|max``: the metric that ranks the trials, and which way."""

    name: str
    mode: str  # "min" or "max"

    @classmethod
    def parse(cls, text: str | None) -> Objective | None:
        """``"loss:min"`` -> Objective("loss", "min"); None for None; one line if malformed.

        Parameters
        ----------
        text : str or None
            ``NAME:min`` or ``NAME:max``.

        Returns
        -------
        Objective or None
            The objective; None for None.

        Raises
        ------
        nbcluster.errors.BadArgument
            Text of another shape.

        Examples
        --------
        >>> Objective.parse("accuracy:max")
        Objective(name='accuracy', mode='max')
        """
        if text is None:
            return None
        name, _, mode = str(text).partition(":")
        if not name.isidentifier() or mode not in ("min", "max"):
            raise BadArgument(f"--objective needs NAME:min or NAME:max (e.g. loss:min), got {text!r}")
        return cls(name, mode)

    def score(self, value: float) -> float:
        """`value` oriented so that larger is better.

        Parameters
        ----------
        value : float
            The metric's value.

        Returns
        -------
        float
            `value`, negated for ``min``.
        """
        return value if self.mode == "max" else -value


def parse_timeout(value: str | float | None) -> float | None:
    """``--timeout``: ``90s``, ``2h``, ``500ms`` or seconds as a number; None for None.

    Parameters
    ----------
    value : str, float or None
        The duration.

    Returns
    -------
    float or None
        Seconds.

    Raises
    ------
    nbcluster.errors.BadArgument
        Not a duration above 0.

    Examples
    --------
    >>> parse_timeout("90s"), parse_timeout("2h"), parse_timeout(1.5)
    (90.0, 7200.0, 1.5)
    """
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h|d)?\s*", str(value))
        if match is None:
            raise BadArgument(f"--timeout needs a duration such as 90s, 10m or 2h, got {value!r}")
        seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if seconds <= 0:
        raise BadArgument(f"--timeout needs a duration above 0, got {value!r}")
    return seconds


class Trials:
    """One trial run's reports, stopper, stops and states; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id (its topic is ``nbcluster-trial-<run id>``).
    n : int
        The run's items.
    objective, stopper, timeout
        As `distribute` takes them, checked (`Objective.parse`, `stoppers.make`,
        `parse_timeout`).
    params : callable
        Item index -> its parameters (`Plan.params`), for `metrics`.
    ended : callable
        Item index -> whether the run's state has it finished.
    """

    def __init__(
        self, run_id: str, n: int, *, objective: Objective | None, stopper: Stopper | None, timeout: float | None,
        params: Callable[[int], dict[str, Any]], ended: Callable[[int], bool],
    ):  # fmt: skip
        self.topic = TRIAL_TOPIC_PREFIX + run_id
        self.n, self.objective, self.stopper, self.timeout = n, objective, stopper, timeout
        self.params, self._ended = params, ended
        self.ran: Callable[[int], bool] = lambda i: False  # item i was run by this run (not resumed)
        # A --ranks job (`ranks.attach`): a stop of any item stops the whole job through this,
        # and only the curves of the items `drawn` says are drawn.
        self.job_stop: Callable[[str], None] | None = None
        self.drawn: Callable[[int], bool] = lambda i: True
        rungs = [int(r) for r in getattr(stopper, "rungs", ())] if objective else []
        self.spec: TrialSpec = {"topic": self.topic, "identity": None, "checkpoints": None, "rungs": rungs,
                                "metric": objective.name if objective else None}  # fmt: skip
        self.rows: list[tuple[int, int, float, dict[str, float]]] = []
        self.last: dict[int, tuple[int, dict[str, float]]] = {}  # item -> (step, metrics)
        self.seen: set[str] = set()  # metric names reported
        self.where: dict[int, str] = {}
        self.begun: dict[int, float] = {}  # kernel time the item's first message came
        self.finals: set[int] = set()
        self.told: dict[int, str] = {}  # item -> why it was told to stop
        self.keys: dict[int, str] = {}  # item -> its Dask task's key, where it has one
        self.series: dict[int, list[tuple[int, float]]] = {}  # item -> (step, value) of the curve's metric
        self._curve_metric: str | None = objective.name if objective else None
        self.dropped = 0
        self._printed: list[tuple[int, list[tuple[str, str]]]] = []  # output not yet shown in the cell
        self.shown: dict[int, int] = {}  # item -> characters of its output the cell has shown
        self.wake: Callable[[], None] = lambda: None  # the waiting cell: new output to show
        self._due: list[tuple[float, int, str]] = []  # (when, item, "interrupt" | "restart")
        self._asks: list[tuple[int, str]] = []
        self._verdicts: list[tuple[int, int]] = []  # (item, rung) judged "go on": its report waits
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._client: Any = None
        self._thread: threading.Thread | None = None
        self._generation = 0  # starts of the run (the first, retries): see `closer`

    # -- lifetime ---------------------------------------------------------------------------
    def open(self, client: Any) -> None:
        """Start listening: on `client`'s event topic, and in this process (``--local`` items).

        Parameters
        ----------
        client : distributed.Client or None
            The run's client; None when every item runs here.
        """
        self._client = client
        trial.LOCAL_SINKS[self.topic] = self.take  # items run here (--local) hand their reports over
        if client is not None:
            client.subscribe_topic(self.topic, lambda event: self.take(event[1]))
        self._thread = threading.Thread(target=self._run, name=f"nbcluster-trials-{self.topic}", daemon=True)
        self._thread.start()

    def settle(self) -> None:
        """Wait (1 s at most) for the last messages of the items that began: they may trail
        the items' results by a moment. Called as each start of the run ends."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            ran = set(self.begun) | {i for i in range(self.n) if self.ran(i)}
            if ran <= self.finals:
                return
            time.sleep(0.01)

    def reopen(self, items: list[int]) -> None:
        """Listen again, for a retry of the run (`Results.retry`); what was received is kept.

        The earlier start's `closer`, if it has not run yet, then closes nothing.

        Parameters
        ----------
        items : list of int
            The items the retry runs: their last messages are awaited afresh, and an earlier
            stop of theirs is forgotten, so that the retry can be stopped, and time out, anew.
        """
        self._generation += 1
        with self._lock:
            self.finals.difference_update(items)
            for i in items:
                self.begun.pop(i, None)
                self.told.pop(i, None)
        if not self._closed.is_set():
            return
        self._closed.clear()
        self.open(self._client)

    def closer(self) -> Callable[[], None]:
        """`close`, for the start running now only (a retry's listener outlives an earlier end).

        Returns
        -------
        callable
            Closes the listener unless `reopen` was called since.
        """
        generation = self._generation

        def close() -> None:
            if generation == self._generation:
                self.close()

        return close

    def close(self) -> None:
        """Stop listening (the run has ended); what was received is kept."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        trial.LOCAL_SINKS.pop(self.topic, None)
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.unsubscribe_topic(self.topic)

    # -- reports (the client's event loop, or the kernel's thread for --local) --------------
    def take(self, event: TrialEvent) -> None:
        """Take one message from an item: record its reports, judge them, note its start/end.

        Parameters
        ----------
        event : TrialEvent
            The message, as the item's worker (or this process) sent it.
        """
        i = int(event["item"])
        now = time.time()
        stop = False
        with self._lock:
            if event.get("worker"):
                self.where[i] = event["worker"]
            if event.get("key"):
                self.keys[i] = str(event["key"])
            again = event.get("begun") is not None and i in self.begun and i in self.told
            if event.get("begun") is not None:
                self.begun[i] = now  # run again (its worker restarted): timed from now
            self.dropped += int(event.get("dropped") or 0)
            for step, at, values in event.get("reports") or ():
                metrics = dict(values)
                if len(self.rows) < MAX_ROWS:
                    self.rows.append((i, int(step), float(at), metrics))
                self.seen.update(metrics)
                self.last[i] = (int(step), metrics)
                self._curve(i, int(step), metrics)
                name = self.objective.name if self.objective else None
                if self.stopper is not None and name in metrics and i not in self.told and self.objective:
                    stop = stop or bool(self.stopper.decide(i, int(step), self.objective.score(metrics[name])))
                    if not stop and int(step) in self.spec["rungs"]:
                        self._verdicts.append((i, int(step)))
            if event.get("final"):
                self.finals.add(i)
            printed = [(str(s), str(t)) for s, t in event.get("output") or ()]
            if printed:
                self._printed.append((i, printed))
        if printed:
            self.wake()
        if again:  # told to stop, and started again elsewhere: ask it, and force it, again
            with self._lock:
                self._asks.append((i, self.told[i]))
                self._due.append((time.monotonic() + config.seconds("stop.grace"), i, "interrupt"))
            self._wake.set()
        if stop:
            self.stop(i, f"stopped by {getattr(self.stopper, 'name', type(self.stopper).__name__)}")
        elif self._verdicts:
            self._wake.set()

    def _curve(self, i: int, step: int, metrics: dict[str, float]) -> None:
        """Keep item `i`'s point of the curves' metric (the objective, else the first reported)."""
        if not self.drawn(i):
            return
        if self._curve_metric is None:
            self._curve_metric = next(iter(metrics), None)
        value = metrics.get(self._curve_metric) if self._curve_metric else None
        if value is None or value != value:
            return
        points = self.series.setdefault(i, [])
        points.append((step, value))
        if len(points) > 2 * CURVE_POINTS:
            self.series[i] = points[::2]

    def curves(self, states: list[str], best: int | None) -> dict[str, Any]:
        """The live view's curves: one per trial, its metric against its step.

        Parameters
        ----------
        states : list of str
            Each item's state (`Results.states`): a stopped one is drawn grey.
        best : int or None
            The best item (`Results.best`), drawn highlighted and first kept.

        Returns
        -------
        dict
            ``metric``, ``mode`` (``min``/``max``/None) and ``series``: at most `CURVES`, each
            ``label``, ``points`` ([step, value] pairs), ``state`` and ``best``; {} before any
            report.
        """
        with self._lock:
            items = sorted(self.series)
            if not items or self._curve_metric is None:
                return {}
            chosen = ([best] if best in self.series else []) + [i for i in items if i != best]
            series = []
            for i in chosen[:CURVES]:
                label = ", ".join(f"{k}={v}" for k, v in self.params(i).items())
                series.append({"label": f"{i}: {label}" if label else str(i), "state": states[i] if i < len(states) else "running",
                               "best": i == best, "points": [[s, v] for s, v in self.series[i]]})  # fmt: skip
        return {"metric": self._curve_metric, "mode": self.objective.mode if self.objective else None, "series": series}

    def new_output(self) -> list[tuple[int, list[tuple[str, str]]]]:
        """What items printed since the last call, in arrival order: shown by the waiting cell.

        Returns
        -------
        list of (int, list of (str, str))
            (item, its ``(stream, text)`` chunks); `shown` counts them as shown.
        """
        with self._lock:
            taken, self._printed = self._printed, []
            for i, chunks in taken:
                self.shown[i] = self.shown.get(i, 0) + sum(len(t) for _, t in chunks)
        return taken

    # -- stopping ---------------------------------------------------------------------------
    def stop(self, i: int, reason: str = "stopped from the notebook") -> None:
        """Ask item `i` to stop now, and force it after ``nbcluster.stop.grace`` if it runs on.

        Parameters
        ----------
        i : int
            The item.
        reason : str
            What its `Stopped` value will say: ``"timed out"`` makes it *timed out*.
        """
        if self.job_stop is not None:  # one job: every item is told, and the job stops them
            with self._lock:
                if i in self.told:
                    return
                self.told.update({j: reason for j in range(self.n) if j not in self.told})
            self.job_stop(reason)
            return
        with self._lock:
            if i in self.told:
                return
            self.told[i] = reason
            if self._client is None:  # --local: the item may be waiting on this very report
                trial.stop_items(self.topic, [i], reason)
            self._asks.append((i, reason))
            grace = config.seconds("stop.grace")
            self._due.append((time.monotonic() + grace, i, "interrupt"))
        self._wake.set()

    def stop_all(self, reason: str = "stopped from the notebook") -> None:
        """Ask every running item to stop (Ctrl-C, `Results.cancel`), forcing them after the grace.

        Parameters
        ----------
        reason : str
            What their `Stopped` values will say.
        """
        for i in list(self.begun):
            if not self._ended(i) and i not in self.finals:
                self.stop(i, reason)

    def _run(self) -> None:
        # After the run's end too, until the forced stops due are done: a cancelled run's items
        # that ignore the ask still hold their workers.
        while not self._closed.is_set() or self._due or self._asks or self._verdicts:
            self._wake.wait(TICK_S)
            self._wake.clear()
            with contextlib.suppress(Exception):  # a bad moment of the cluster must not end the run's watch
                self._tick()

    def _tick(self) -> None:
        now, mono = time.time(), time.monotonic()
        if self.timeout is not None:
            for i, begun in list(self.begun.items()):
                if now - begun > self.timeout and i not in self.told and not self._done(i):
                    self.stop(i, "timed out")
        with self._lock:
            asks, self._asks = self._asks, []
            verdicts, self._verdicts = self._verdicts, []
            due = [d for d in self._due if d[0] <= mono]
            self._due = [d for d in self._due if d[0] > mono]
        for i, reason in asks:
            self._ask(i, reason)
        by_worker: dict[str | None, list[tuple[int, int]]] = {}
        for i, rung in verdicts if self._client is not None else ():
            by_worker.setdefault(self.where.get(i), []).append((i, rung))
        for address, judged in by_worker.items():
            workers = [address] if address else None
            self._client.run(trial.go_on, self.topic, judged, workers=workers, on_error="return")
        for _, i, step in due:
            if i in self.finals:  # it ended on its worker
                continue
            address = self.where.get(i)
            if step == "interrupt":
                if any(v is True for v in self._on_workers(i, trial.interrupt, self.topic, i).values()):
                    with self._lock:
                        self._due.append((mono + FORCE_WAIT_S, i, "restart"))
            elif address and any(i in v for v in self._on_workers(i, trial.running, self.topic).values()
                                 if isinstance(v, list)):  # fmt: skip
                # Its task is cancelled first, so that the restarted worker does not run it again;
                # Dask runs the worker's other tasks again.
                if i in self.keys:
                    from distributed import Future

                    self._client.cancel([Future(self.keys[i], self._client)], reason="stopped: it ran on past the grace")
                self._client.restart_workers([address], timeout=30, raise_for_error=False)

    def _ask(self, i: int, reason: str) -> None:
        if self._client is None:
            trial.stop_items(self.topic, [i], reason)
        else:
            self._on_workers(None, trial.stop_items, self.topic, [i], reason)

    def _on_workers(self, i: int | None, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """Run `fn` on item `i`'s worker (on every worker for None, or an item not begun yet):
        what each answered."""
        if self._client is None:
            return {}  # --local: the kernel's own thread cannot be forced; Ctrl-C stops it
        address = self.where.get(i) if i is not None else None
        workers = [address] if address else None
        return dict(self._client.run(fn, *args, workers=workers, on_error="return"))

    def _done(self, i: int) -> bool:
        return i in self.finals or self._ended(i)

    # -- reading ----------------------------------------------------------------------------
    def state(self, i: int, status: str, value: Any, error_type: str | None) -> str:
        """Item `i`'s trial state from its run state.

        Parameters
        ----------
        i : int
            The item.
        status : str
            Its run state: done, failed, cancelled or running.
        value : Any
            Its value when done.
        error_type : str or None
            Its exception's type name when failed.

        Returns
        -------
        str
            `status`, or ``stopped`` / ``timed out`` for an item that was stopped.
        """
        # A forced stop may end it as failed (interrupted outside the item, or its task cancelled).
        if isinstance(value, trial.Stopped) or error_type == "TrialStopped" or (status == "failed" and i in self.told):
            return "timed out" if self.told.get(i) == "timed out" else "stopped"
        return status

    def objective_value(self, i: int, value: Any) -> float | None:
        """Item `i`'s last reported objective; else its result's (a number, or a dict's entry).

        Parameters
        ----------
        i : int
            The item.
        value : Any
            Its value, None when it has none.

        Returns
        -------
        float or None
            None without an objective, or when the item has no value for it.
        """
        if self.objective is None:
            return None
        last = self.last.get(i)
        if last is not None and self.objective.name in last[1]:
            return last[1][self.objective.name]
        if isinstance(value, dict) and isinstance(value.get(self.objective.name), int | float):
            return float(value[self.objective.name])
        if isinstance(value, int | float) and not isinstance(value, bool) and not self.seen:
            return float(value)
        return None

    def unknown_objective(self) -> str | None:
        """The line saying that no report used the objective's name, naming those seen.

        Returns
        -------
        str or None
            None when the objective was reported, or nothing was.
        """
        if self.objective is None or not self.seen or self.objective.name in self.seen:
            return None
        return (f"nbcluster: --objective {self.objective.name} was never reported; the items reported "
                f"{', '.join(sorted(self.seen))}: name one of those")  # fmt: skip

    def frame(self) -> Any:
        """`Results.metrics`: a pandas DataFrame of every report kept.

        Returns
        -------
        pandas.DataFrame
            ``item``, the parameters, ``step``, one column per metric, ``time``.
        """
        try:
            import pandas as pd
        except ImportError:
            raise BadArgument("runs.metrics needs pandas: pip install pandas") from None
        with self._lock:
            rows = list(self.rows)
            names = sorted(self.seen)
        taken = {"item", "step", "time", *names}  # a parameter of one of these names gets a prefix

        def params(i: int) -> dict[str, Any]:
            return {(f"param_{k}" if k in taken else k): v for k, v in self.params(i).items()}

        records = [{"item": i, **params(i), "step": step, **{k: m.get(k) for k in names}, "time": at}
                   for i, step, at, m in rows]  # fmt: skip
        frame = pd.DataFrame.from_records(records)
        if not records:
            frame = pd.DataFrame(columns=["item", "step", *names, "time"])
        return frame
