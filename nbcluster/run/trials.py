"""The kernel side of a trial run: its reports, its stopper, its stops, its timeouts.

A run is a *trial run* when it names an objective, a stopper or a timeout, or when its
code mentions `report`, `should_stop` or `checkpoint`. Its items then run one a task (so
one can be stopped without its neighbours) as their thread's current item
(``worker/trial.py``), and `Trials`, made with the run, follows them:

- Reports arrive on the run's Dask event topic (a `TrialEvent` per item every 0.2 s at
  most; ``--local`` items hand them over in-process). The subscription has taken effect
  before `open` returns (`_in_effect`), so no item's first messages are lost. Each is
  kept as a row of `metrics` (at most `MAX_ROWS`), and each report of the objective is
  passed to the stopper (`stoppers.py`), oriented so that larger is better.
- A stop (the stopper's decision, ``--timeout``, `Results.stop`, Ctrl-C) first *asks*:
  every worker is told (`trial.stop_items`), so ``should_stop()`` is True in the item and
  its next ``report()`` raises `TrialStopped`. After ``nbcluster.stop.grace`` an item still
  running is *forced*: `trial.interrupt` raises `TrialStopped` in its thread, and if it has
  not ended 2 s later, its worker is restarted (Dask runs the worker's other tasks again).
- Each item ends in one state: done, stopped, timed out, failed (or cancelled, pending).

One thread a run (``nbcluster-trials-<run id>``) does the stops and the timeouts, so the
client's event loop, which delivers the reports, never waits on the cluster.

What `Trials` holds, one small record each: `Rules` (objective, stopper, timeout), `Items`
(what the run's plan and state say of an item), `Running` (where and since when each item
runs), `Reports` (what was reported), `Series` (the live view's curves), `Printed` (the
items' output for the waiting cell), `Stops` (the stops asked, and what the thread has still
to do for them) and `_Watch` (what the thread waits on, and the client it asks).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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


def _in_effect(client: Any, topic: str) -> None:
    """Subscribe `client` to `topic` once more, by a call that returns when it took effect.

    Dask's `subscribe_topic` goes out on the client's batched stream (10 ms batches), but a
    run's first items go to the workers directly, on other connections. An item could then
    report before the scheduler knew of the subscription, and its first messages would be
    lost: its first output, and its start, which its timeout counts from. The scheduler
    keeps one subscription per client, so the batched one, when it arrives, changes nothing.
    """
    cid = client.id

    def subscribe(dask_scheduler: Any) -> None:  # sent by value: the scheduler needs no nbcluster
        dask_scheduler.subscribe_topic(topic, cid)

    with contextlib.suppress(Exception):  # a scheduler that runs no functions: the batched one only
        client.run_on_scheduler(subscribe)


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


@dataclass(frozen=True)
class Rules:
    """What judges a trial run's items: ``--objective``, ``--stop`` and ``--timeout``, checked."""

    objective: Objective | None
    stopper: Stopper | None
    timeout: float | None


def _never(i: int) -> bool:
    return False


def _always(i: int) -> bool:
    return True


def _nothing() -> None:
    return None


@dataclass
class Items:
    """What the run's plan and state say of its items (`distribute` fills in `ended` and `ran`)."""

    n: int
    params: Callable[[int], dict[str, Any]]  # item -> its parameters (`Plan.params`)
    ended: Callable[[int], bool] = field(default_factory=lambda: _never)  # the run's state has it finished
    ran: Callable[[int], bool] = field(default_factory=lambda: _never)  # it was run by this run (not resumed)

    def label(self, i: int) -> str:
        """Item `i` as the live view names it.

        Parameters
        ----------
        i : int
            The item.

        Returns
        -------
        str
            ``"3: lr=0.1, depth=4"``, or ``"3"`` for an item without parameters.
        """
        params = ", ".join(f"{k}={v}" for k, v in self.params(i).items())
        return f"{i}: {params}" if params else str(i)


@dataclass
class Running:
    """Where and since when each item runs, from its own messages."""

    where: dict[int, str] = field(default_factory=dict)  # item -> its worker's address
    keys: dict[int, str] = field(default_factory=dict)  # item -> its Dask task's key, where it has one
    begun: dict[int, float] = field(default_factory=dict)  # kernel time the item's first message came
    finals: set[int] = field(default_factory=set)  # items whose last message came


@dataclass
class Reports:
    """What the items reported: `Results.metrics` and the objective's values."""

    rows: list[tuple[int, int, float, dict[str, float]]] = field(default_factory=list)  # at most MAX_ROWS
    last: dict[int, tuple[int, dict[str, float]]] = field(default_factory=dict)  # item -> (step, metrics)
    seen: set[str] = field(default_factory=set)  # metric names reported
    dropped: int = 0  # reports the items' workers could not send


@dataclass
class Series:
    """The live view's curves: each drawn item's (step, value) points of one metric."""

    metric: str | None  # the objective, else the first metric reported
    points: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    drawn: Callable[[int], bool] = field(default_factory=lambda: _always)  # --ranks: rank 0 only (`ranks.attach`)

    def add(self, i: int, step: int, metrics: dict[str, float]) -> None:
        """Keep item `i`'s point of the curves' metric, halving its points past twice `CURVE_POINTS`.

        Parameters
        ----------
        i : int
            The item that reported.
        step : int
            Its step.
        metrics : dict of str to float
            What it reported; the curves draw one metric of them.
        """
        if not self.drawn(i):
            return
        if self.metric is None:
            self.metric = next(iter(metrics), None)
        value = metrics.get(self.metric) if self.metric else None
        if value is None or value != value:
            return
        points = self.points.setdefault(i, [])
        points.append((step, value))
        if len(points) > 2 * CURVE_POINTS:
            self.points[i] = points[::2]


@dataclass
class Printed:
    """What the items printed, for the waiting cell to show as it comes."""

    pending: list[tuple[int, list[tuple[str, str]]]] = field(default_factory=list)  # not yet shown
    shown: dict[int, int] = field(default_factory=dict)  # item -> characters of its output shown
    wake: Callable[[], None] = field(default_factory=lambda: _nothing)  # the waiting cell: new output to show


@dataclass
class Stops:
    """The stops asked for, and what the run's thread has still to do for them."""

    told: dict[int, str] = field(default_factory=dict)  # item -> why it was told to stop
    asks: list[tuple[int, str]] = field(default_factory=list)  # (item, why) to tell its workers
    due: list[tuple[float, int, str]] = field(default_factory=list)  # (when, item, "interrupt" | "restart")
    verdicts: list[tuple[int, int]] = field(default_factory=list)  # (item, rung) judged "go on": report waits
    job: Callable[[str], None] | None = None  # a --ranks job: a stop of any item stops the whole job

    def ask(self, i: int, reason: str) -> None:
        """Queue the ask to item `i`, and its forced stop after ``nbcluster.stop.grace``.

        Parameters
        ----------
        i : int
            The item to stop.
        reason : str
            Why, as the item is told.
        """
        self.asks.append((i, reason))
        self.due.append((time.monotonic() + config.seconds("stop.grace"), i, "interrupt"))


@dataclass
class _Watch:
    """What the run's thread waits on, the client it asks, and the starts of the run it serves."""

    client: Any = None
    wake: threading.Event = field(default_factory=threading.Event)  # something to do now
    closed: threading.Event = field(default_factory=threading.Event)
    generation: int = 0  # starts of the run (the first, retries): see `Trials.closer`


class Trials:
    """One trial run's reports, stopper, stops and states; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id (its topic is ``nbcluster-trial-<run id>``).
    rules : Rules
        Its objective, stopper and timeout, as `distribute` checked them (`Objective.parse`,
        `stoppers.make`, `parse_timeout`).
    n : int
        The run's items.
    params : callable
        Item index -> its parameters (`Plan.params`), for `metrics`.
    """

    def __init__(self, run_id: str, rules: Rules, n: int, params: Callable[[int], dict[str, Any]]):
        objective = rules.objective
        self.rules, self.items = rules, Items(n, params)
        rungs = [int(r) for r in getattr(rules.stopper, "rungs", ())] if objective else []
        self.spec: TrialSpec = {"topic": TRIAL_TOPIC_PREFIX + run_id, "identity": None, "checkpoints": None,
                                "rungs": rungs, "metric": objective.name if objective else None}  # fmt: skip
        self.running, self.reports, self.stops = Running(), Reports(), Stops()
        self.series, self.printed = Series(objective.name if objective else None), Printed()
        self._lock = threading.Lock()
        self._watch = _Watch()

    @property
    def topic(self) -> str:
        """The run's Dask event topic, ``nbcluster-trial-<run id>``."""
        return self.spec["topic"]

    # -- lifetime ---------------------------------------------------------------------------
    def open(self, client: Any) -> None:
        """Start listening: on `client`'s event topic, and in this process (``--local`` items).

        Parameters
        ----------
        client : distributed.Client or None
            The run's client; None when every item runs here.
        """
        self._watch.client = client
        trial.LOCAL_SINKS[self.topic] = self.take  # items run here (--local) hand their reports over
        if client is not None:
            client.subscribe_topic(self.topic, lambda event: self.take(event[1]))
            _in_effect(client, self.topic)
        threading.Thread(target=self._run, name=f"nbcluster-trials-{self.topic}", daemon=True).start()

    def settle(self) -> None:
        """Wait (1 s at most) for the last messages of the items that began: they may trail
        the items' results by a moment. Called as each start of the run ends."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            ran = set(self.running.begun) | {i for i in range(self.items.n) if self.items.ran(i)}
            if ran <= self.running.finals:
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
        self._watch.generation += 1
        with self._lock:
            self.running.finals.difference_update(items)
            for i in items:
                self.running.begun.pop(i, None)
                self.stops.told.pop(i, None)
        if not self._watch.closed.is_set():
            return
        self._watch.closed.clear()
        self.open(self._watch.client)

    def closer(self) -> Callable[[], None]:
        """`close`, for the start running now only (a retry's listener outlives an earlier end).

        Returns
        -------
        callable
            Closes the listener unless `reopen` was called since.
        """
        generation = self._watch.generation

        def close() -> None:
            if generation == self._watch.generation:
                self.close()

        return close

    def close(self) -> None:
        """Stop listening (the run has ended); what was received is kept."""
        if self._watch.closed.is_set():
            return
        self._watch.closed.set()
        self._watch.wake.set()
        trial.LOCAL_SINKS.pop(self.topic, None)
        if self._watch.client is not None:
            with contextlib.suppress(Exception):
                self._watch.client.unsubscribe_topic(self.topic)

    # -- reports (the client's event loop, or the kernel's thread for --local) --------------
    def take(self, event: TrialEvent) -> None:
        """Take one message from an item: record its reports, judge them, note its start/end.

        Parameters
        ----------
        event : TrialEvent
            The message, as the item's worker (or this process) sent it.
        """
        i, now, stop, told = int(event["item"]), time.time(), False, self.stops.told
        objective, stopper = self.rules.objective, self.rules.stopper
        with self._lock:
            if event.get("worker"):
                self.running.where[i] = event["worker"]
            if event.get("key"):
                self.running.keys[i] = str(event["key"])
            again = event.get("begun") is not None and i in self.running.begun and i in told
            if event.get("begun") is not None:
                self.running.begun[i] = now  # run again (its worker restarted): timed from now
            self.reports.dropped += int(event.get("dropped") or 0)
            for sent, at, values in event.get("reports") or ():
                step, metrics = int(sent), dict(values)
                if len(self.reports.rows) < MAX_ROWS:
                    self.reports.rows.append((i, step, float(at), metrics))
                self.reports.seen.update(metrics)
                self.reports.last[i] = (step, metrics)
                self.series.add(i, step, metrics)
                if stopper is not None and objective and objective.name in metrics and i not in told:
                    stop = stop or bool(stopper.decide(i, step, objective.score(metrics[objective.name])))
                    if not stop and step in self.spec["rungs"]:
                        self.stops.verdicts.append((i, step))
            if event.get("final"):
                self.running.finals.add(i)
            printed = [(str(s), str(t)) for s, t in event.get("output") or ()]
            if printed:
                self.printed.pending.append((i, printed))
        if printed:
            self.printed.wake()
        if again:  # told to stop, and started again elsewhere: ask it, and force it, again
            with self._lock:
                self.stops.ask(i, self.stops.told[i])
            self._watch.wake.set()
        if stop:
            self.stop(i, f"stopped by {getattr(stopper, 'name', type(stopper).__name__)}")
        elif self.stops.verdicts:
            self._watch.wake.set()

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
            items = sorted(self.series.points)
            if not items or self.series.metric is None:
                return {}
            chosen = ([best] if best in self.series.points else []) + [i for i in items if i != best]
            series = []
            for i in chosen[:CURVES]:
                series.append({"label": self.items.label(i), "state": states[i] if i < len(states) else "running",
                               "best": i == best, "points": [[s, v] for s, v in self.series.points[i]]})  # fmt: skip
        mode = self.rules.objective.mode if self.rules.objective else None
        return {"metric": self.series.metric, "mode": mode, "series": series}

    def new_output(self) -> list[tuple[int, list[tuple[str, str]]]]:
        """What items printed since the last call, in arrival order: shown by the waiting cell.

        Returns
        -------
        list of (int, list of (str, str))
            (item, its ``(stream, text)`` chunks); `Printed.shown` counts them as shown.
        """
        with self._lock:
            taken, self.printed.pending = self.printed.pending, []
            for i, chunks in taken:
                self.printed.shown[i] = self.printed.shown.get(i, 0) + sum(len(t) for _, t in chunks)
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
        stops = self.stops
        with self._lock:
            if i in stops.told:
                return
            if stops.job is not None:  # one job: every item is told, and the job stops them
                stops.told.update({j: reason for j in range(self.items.n) if j not in stops.told})
            else:
                stops.told[i] = reason
                if self._watch.client is None:  # --local: the item may be waiting on this very report
                    trial.stop_items(self.topic, [i], reason)
                stops.ask(i, reason)
        if stops.job is not None:
            stops.job(reason)
        else:
            self._watch.wake.set()

    def stop_all(self, reason: str = "stopped from the notebook") -> None:
        """Ask every running item to stop (Ctrl-C, `Results.cancel`), forcing them after the grace.

        Parameters
        ----------
        reason : str
            What their `Stopped` values will say.
        """
        for i in list(self.running.begun):
            if not self.items.ended(i) and i not in self.running.finals:
                self.stop(i, reason)

    def _run(self) -> None:
        # After the run's end too, until the forced stops due are done: a cancelled run's items
        # that ignore the ask still hold their workers.
        while not self._watch.closed.is_set() or self.stops.due or self.stops.asks or self.stops.verdicts:
            self._watch.wake.wait(TICK_S)
            self._watch.wake.clear()
            with contextlib.suppress(Exception):  # a bad moment of the cluster must not end the run's watch
                self._tick()

    def _tick(self) -> None:
        now, mono, client = time.time(), time.monotonic(), self._watch.client
        if self.rules.timeout is not None:
            for i, begun in list(self.running.begun.items()):
                ended = i in self.running.finals or self.items.ended(i)
                if now - begun > self.rules.timeout and i not in self.stops.told and not ended:
                    self.stop(i, "timed out")
        with self._lock:
            asks, self.stops.asks = self.stops.asks, []
            verdicts, self.stops.verdicts = self.stops.verdicts, []
            due = [d for d in self.stops.due if d[0] <= mono]
            self.stops.due = [d for d in self.stops.due if d[0] > mono]
        for i, reason in asks:  # a --local item was told at once, by `stop`
            self._on_workers(None, trial.stop_items, self.topic, [i], reason)
        by_worker: dict[str | None, list[tuple[int, int]]] = {}
        for i, rung in verdicts if client is not None else ():
            by_worker.setdefault(self.running.where.get(i), []).append((i, rung))
        for address, judged in by_worker.items():
            workers = [address] if address else None
            client.run(trial.go_on, self.topic, judged, workers=workers, on_error="return")
        for _, i, step in due:
            if i in self.running.finals:  # it ended on its worker
                continue
            address = self.running.where.get(i)
            if step == "interrupt":
                if any(v is True for v in self._on_workers(i, trial.interrupt, self.topic, i).values()):
                    with self._lock:
                        self.stops.due.append((mono + FORCE_WAIT_S, i, "restart"))
            elif address and any(i in v for v in self._on_workers(i, trial.running, self.topic).values()
                                 if isinstance(v, list)):  # fmt: skip
                # Its task is cancelled first, so that the restarted worker does not run it again;
                # Dask runs the worker's other tasks again.
                if i in self.running.keys:
                    from distributed import Future

                    reason = "stopped: it ran on past the grace"
                    client.cancel([Future(self.running.keys[i], client)], reason=reason)
                client.restart_workers([address], timeout=30, raise_for_error=False)

    def _on_workers(self, i: int | None, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """Run `fn` on item `i`'s worker (on every worker for None, or an item not begun yet):
        what each answered."""
        if self._watch.client is None:
            return {}  # --local: the kernel's own thread cannot be forced; Ctrl-C stops it
        address = self.running.where.get(i) if i is not None else None
        workers = [address] if address else None
        return dict(self._watch.client.run(fn, *args, workers=workers, on_error="return"))

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
        told = self.stops.told
        if isinstance(value, trial.Stopped) or error_type == "TrialStopped" or (status == "failed" and i in told):
            return "timed out" if told.get(i) == "timed out" else "stopped"
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
        name = self.rules.objective.name if self.rules.objective else None
        if name is None:
            return None
        last = self.reports.last.get(i)
        if last is not None and name in last[1]:
            return last[1][name]
        if isinstance(value, dict) and isinstance(value.get(name), int | float):
            return float(value[name])
        if isinstance(value, int | float) and not isinstance(value, bool) and not self.reports.seen:
            return float(value)
        return None

    def unknown_objective(self) -> str | None:
        """The line saying that no report used the objective's name, naming those seen.

        Returns
        -------
        str or None
            None when the objective was reported, or nothing was.
        """
        objective, seen = self.rules.objective, self.reports.seen
        if objective is None or not seen or objective.name in seen:
            return None
        return (f"nbcluster: --objective {objective.name} was never reported; the items reported "
                f"{', '.join(sorted(seen))}: name one of those")  # fmt: skip

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
            rows = list(self.reports.rows)
            names = sorted(self.reports.seen)
        taken = {"item", "step", "time", *names}  # a parameter of one of these names gets a prefix

        def params(i: int) -> dict[str, Any]:
            return {(f"param_{k}" if k in taken else k): v for k, v in self.items.params(i).items()}

        records = [{"item": i, **params(i), "step": step, **{k: m.get(k) for k in names}, "time": at}
                   for i, step, at, m in rows]  # fmt: skip
        empty = pd.DataFrame(columns=["item", "step", *names, "time"])
        return pd.DataFrame.from_records(records) if records else empty
