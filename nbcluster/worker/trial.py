"""Worker side of trials: `report`, `should_stop`, and stopping a running item.

An item of a trial run (one whose context carries a `TrialSpec`: see ``run/trials.py``)
runs inside `run_item`, which makes it this thread's *current item*. Then:

- `report(step, **metrics)` appends ``[step, time, metrics]`` to the item's buffer, and
  sends the buffer as one Dask event (`Worker.log_event` on the run's topic, a
  `TrialEvent`) when the item's last message is `GAP_S` old; a flusher thread (one a
  process) sends what is left every `FLUSH_S`. So metrics reach the kernel within a
  second (a stopper hears of a short epoch at once), however often an item reports, in
  at most 20 messages a second an item. A
  buffer holds at most `MAX_BUFFER` reports; past that the oldest are dropped and counted
  (the message says how many). The item's first message (``begun``) goes at once, so the
  kernel can time it; its last (``final``) goes as it ends, before its result.
- `stop_items(topic, indices, reason)`, run on the worker by the kernel, marks items told
  to stop: `should_stop()` is then True in them and `report()` raises `TrialStopped`,
  which `run_item` turns into a `Stopped` value (the item is *stopped*, not failed). The
  run's stop token (Ctrl-C, `Results.cancel`) counts too.
- At a stopper's rung (ASHA's 1, 3, 9 steps: ``rungs`` in the `TrialSpec`), a report of
  the objective is sent at once and `report()` waits for the kernel's verdict:
  `go_on(topic, ...)` or `stop_items`, whichever comes, or `VERDICT_WAIT_S` at most. A
  trial the stopper drops then stops at the rung, not some epochs past it; one it
  promotes loses a round trip to the kernel (milliseconds). Without rungs, nothing waits.
- `interrupt(topic, index)` raises `TrialStopped` in the item's thread by force
  (`PyThreadState_SetAsyncExc`): the kernel's next step, after ``nbcluster.stop.grace``,
  for an item that does not report. Python delivers it at the item's next bytecode; a C
  call that never returns is not reached, and the kernel then restarts the worker.

In the kernel (``--local``), the reports go to the run's tracker directly (`LOCAL_SINKS`).
Outside any run, `report` keeps the last `MAX_LOCAL` reports in `recorded()` and never
fails; `should_stop` is False.

This module imports only base modules: it runs on workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import numbers
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbcluster.errors import TrialStopped
from nbcluster.worker import context

if TYPE_CHECKING:  # types only: the worker package loads no more than it runs
    from nbcluster._wire import TrialEvent, TrialSpec

FLUSH_S = 0.2  # how often buffered reports are sent: within a second of the report, batched
GAP_S = 0.05  # a report sends its buffer at once when the last message is this old: a stopper hears it soon
MAX_BUFFER = 10_000  # reports an item holds unsent at most (the oldest are dropped past it)
MAX_BATCH = 2_000  # reports in one message at most
MAX_LOCAL = 10_000  # reports kept outside any run
_KEEP_STOPPED = 4096
VERDICT_WAIT_S = 2.0  # the longest a report at a rung waits for the kernel: a lost verdict never hangs a trial

#: In the kernel: a ``--local`` run's topic -> what takes its messages (``run/trials.py``).
LOCAL_SINKS: dict[str, Callable[[TrialEvent], None]] = {}
_STOP: OrderedDict[tuple[str, int], str] = OrderedDict()  # (topic, item) -> why it must stop
_LOCAL: deque[tuple[int, float, dict[str, float]]] = deque(maxlen=MAX_LOCAL)
_RUNNING: dict[int, _Item] = {}  # thread id -> the item it runs
_WAITING: dict[tuple[str, int], tuple[int, threading.Event]] = {}  # (topic, item) -> (rung, its verdict)
_LOCK = threading.Lock()
_here = threading.local()
_flusher: threading.Thread | None = None


@dataclass(frozen=True)
class Stopped:
    """The value of an item that was stopped while it ran: its last step and metrics.

    Attributes
    ----------
    step : int or None
        The step of its last report (None if it never reported).
    metrics : dict of str to float
        Its last reported metrics.
    reason : str
        Who stopped it: a stopper's name, ``"timed out"``, or ``"stopped from the notebook"``.
    """

    step: int | None
    metrics: dict[str, float]
    reason: str

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items())
        return f"<stopped ({self.reason}) at step {self.step}{': ' + shown if shown else ''}>"


@dataclass
class _Outbox:
    """What an item has still to send the kernel: its reports, and its output past what was sent."""

    reports: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)  # (step, time, metrics)
    dropped: int = 0  # reports dropped past MAX_BUFFER since the last message
    sent: float = 0.0  # time.monotonic() of its last message
    output: dict[int, list[list[Any]]] | None = None  # this thread's output, by item (`context.running`)
    printed: tuple[int, int] = (0, 0)  # output sent so far: whole chunks, then characters of the next


@dataclass
class _Item:
    """One running item of a trial run: who it is, where it runs, its last report, its messages."""

    spec: TrialSpec
    index: int
    token: str | None
    thread: int
    worker: Any  # the distributed.Worker, None in the kernel
    address: str
    outbox: _Outbox
    last: tuple[int, dict[str, float]] = field(default_factory=lambda: (0, {}))  # its last (step, metrics)
    ended: bool = False
    interrupted: bool = False


def report(step: int | None = None, **metrics: float) -> None:
    """Report this item's metrics at a step; they reach the notebook while the item runs.

    Parameters
    ----------
    step : int, optional
        The step (epoch, iteration) the metrics are for; default: one more than the last
        report's (the first report is step 1).
    **metrics : float
        Numbers by name, such as ``loss=0.3, accuracy=0.91``.

    Raises
    ------
    nbcluster.TrialStopped
        Once the item was told to stop (a stopper, ``--timeout``, `Results.stop`, Ctrl-C):
        let it propagate, and the item ends *stopped* with these metrics kept.
    TypeError
        A metric that is not a number, or a step that is not a whole number.

    Examples
    --------
    Outside a run, reports are kept here and nothing fails:

    >>> import nbcluster
    >>> nbcluster.report(loss=0.5)
    >>> nbcluster.report(step=7, loss=0.25, accuracy=0.9)
    >>> nbcluster.worker.trial.recorded()[-1]
    (7, {'loss': 0.25, 'accuracy': 0.9})
    """
    values = _numbers(metrics)
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
        raise TypeError(f"nbcluster.report(step={step!r}): the step must be a whole number, such as the epoch")
    item: _Item | None = getattr(_here, "item", None)
    if item is None:
        last = _LOCAL[-1][0] if _LOCAL else 0
        _LOCAL.append((int(step) if step is not None else last + 1, time.time(), values))
        return
    item.last = (int(step) if step is not None else item.last[0] + 1, values)
    outbox = item.outbox
    with _LOCK:
        if len(outbox.reports) >= MAX_BUFFER:
            del outbox.reports[0]
            outbox.dropped += 1
        outbox.reports.append((item.last[0], time.time(), values))
    spec = item.spec
    if item.worker is not None and item.last[0] in spec.get("rungs", ()) and spec.get("metric") in values:
        _await_verdict(item)
    elif item.worker is None or time.monotonic() - outbox.sent >= GAP_S:  # in the kernel (--local): at once
        _flush(item)
    if _told(item) is not None:
        raise TrialStopped(f"item {item.index} was told to stop ({_told(item)})")


def should_stop() -> bool:
    """Whether this item has been told to stop; False outside a trial run.

    Returns
    -------
    bool
        True once a stopper, ``--timeout``, `Results.stop` or Ctrl-C asked the item to stop:
        save what you need and return (or raise `nbcluster.TrialStopped`).

    Examples
    --------
    >>> import nbcluster
    >>> nbcluster.should_stop()
    False
    """
    item: _Item | None = getattr(_here, "item", None)
    return item is not None and _told(item) is not None


def recorded() -> list[tuple[int, dict[str, float]]]:
    """The reports made outside any run in this process (the last `MAX_LOCAL`), oldest first.

    Returns
    -------
    list of (int, dict)
        ``(step, metrics)`` pairs.
    """
    return [(step, values) for step, _, values in _LOCAL]


def current() -> tuple[TrialSpec, int] | None:
    """This thread's trial item, for checkpoints and output.

    Returns
    -------
    tuple of (TrialSpec, int) or None
        Its run's spec and its index; None outside a trial item.
    """
    item: _Item | None = getattr(_here, "item", None)
    return None if item is None else (item.spec, item.index)


def run_item(spec: TrialSpec, index: int, token: str | None, fn: Callable[[], Any]) -> Any:
    """Run one item of a trial run as this thread's current item; see the module docstring.

    Parameters
    ----------
    spec : TrialSpec
        The run's trial spec.
    index : int
        The item's index in the run.
    token : str or None
        The run's stop token (Ctrl-C and `Results.cancel` stop the item through it).
    fn : callable
        Runs the item; its return value is the item's.

    Returns
    -------
    Any
        What `fn` returned, or a `Stopped` when it raised `TrialStopped`.
    """
    worker, address = _worker()
    outbox = _Outbox(output=context.running.outputs)
    item = _Item(spec, index, token, threading.get_ident(), worker, address, outbox)
    _here.item = item
    with _LOCK:
        _RUNNING[item.thread] = item
    _send(item, {"item": index, "worker": address, "reports": [], "begun": time.time(), "dropped": 0,
                 "final": False, "output": [], "key": _task_key()})  # fmt: skip
    _start_flusher()
    try:
        try:
            return fn()
        except TrialStopped:
            return Stopped(item.last[0] or None, item.last[1], _told(item) or "stopped")
    finally:
        _leave(item)


def _leave(item: _Item) -> None:
    with _LOCK:
        item.ended = True
        _RUNNING.pop(item.thread, None)
        if item.interrupted:  # an interrupt not yet delivered must not hit what runs next
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(item.thread), None)
    _here.item = None
    _flush(item, final=True)


def _await_verdict(item: _Item) -> None:
    key = (item.spec["topic"], item.index)
    verdict = threading.Event()
    with _LOCK:
        _WAITING[key] = (item.last[0], verdict)
    try:
        _flush(item)
        if _told(item) is None:
            verdict.wait(VERDICT_WAIT_S)
    finally:
        with _LOCK:
            _WAITING.pop(key, None)


def go_on(topic: str, judged: list[tuple[int, int]]) -> None:
    """Let items waiting at a rung go on: the stopper kept them (run on the worker by the kernel).

    Parameters
    ----------
    topic : str
        The run's trial topic.
    judged : list of (int, int)
        ``(item, rung)`` pairs; a pair whose item no longer waits at that rung is ignored.
    """
    with _LOCK:
        for index, rung in judged:
            waiting = _WAITING.get((topic, int(index)))
            if waiting is not None and waiting[0] == int(rung):
                waiting[1].set()


def stop_items(topic: str, indices: list[int], reason: str) -> None:
    """Tell the items `indices` of the run `topic` to stop (run on the worker by the kernel).

    Parameters
    ----------
    topic : str
        The run's trial topic.
    indices : list of int
        The items.
    reason : str
        Why, as their `Stopped` value will say.
    """
    with _LOCK:
        for i in indices:
            _STOP[(topic, int(i))] = reason
            waiting = _WAITING.get((topic, int(i)))
            if waiting is not None:
                waiting[1].set()
        while len(_STOP) > _KEEP_STOPPED:
            _STOP.popitem(last=False)


def interrupt(topic: str, index: int) -> bool:
    """Raise `TrialStopped` in the thread running item `index` of run `topic`, by force.

    Parameters
    ----------
    topic : str
        The run's trial topic.
    index : int
        The item.

    Returns
    -------
    bool
        True when the item was running here and was interrupted; False when it is not
        running here (any more).
    """
    with _LOCK:
        for item in _RUNNING.values():
            if item.spec["topic"] == topic and item.index == index and not item.ended:
                item.interrupted = True
                exc = ctypes.py_object(TrialStopped)
                return bool(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(item.thread), exc))
    return False


def running(topic: str) -> list[int]:
    """The items of run `topic` running in this process now.

    Parameters
    ----------
    topic : str
        The run's trial topic.

    Returns
    -------
    list of int
        Their indices.
    """
    with _LOCK:
        return [item.index for item in _RUNNING.values() if item.spec["topic"] == topic]


def _told(item: _Item) -> str | None:
    reason = _STOP.get((item.spec["topic"], item.index))
    if reason is None and item.token is not None and context.stopped_run(item.token):
        reason = "stopped from the notebook"
    return reason


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    values = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"nbcluster.report({name}={value!r}): a metric must be a number; report float(...) of it"
            )
        values[name] = float(value)  # nan and inf too: a diverged loss is worth seeing
    return values


def _task_key() -> str | None:
    try:
        from nbcluster._compat import running_task_key

        key = running_task_key()
        return None if key is None else str(key)
    except Exception:
        return None


def _worker() -> tuple[Any, str]:
    try:
        from distributed import get_worker

        worker = get_worker()
        return worker, str(worker.address)
    except Exception:  # in the kernel (--local), or a thread Dask did not start
        return None, ""


def _send(item: _Item, event: TrialEvent) -> None:
    topic = item.spec["topic"]
    sink = LOCAL_SINKS.get(topic)
    try:
        if sink is not None:
            sink(event)
        elif item.worker is not None:
            item.worker.log_event(topic, event)
    except Exception:  # a report must never fail the item: the kernel then misses these
        pass


def _new_output(item: _Item) -> list[tuple[str, str]]:
    """What the item printed since the last message (its text; display() output is skipped)."""
    outbox = item.outbox
    chunks = outbox.output.get(item.index) if outbox.output is not None else None
    if not chunks:
        return []
    whole, chars = outbox.printed
    new = []
    for k in range(whole, len(chunks)):
        stream, payload = chunks[k][0], chunks[k][1]
        if stream != "display":
            text = payload[chars if k == whole else 0 :]
            if text:
                new.append((str(stream), str(text)))
    last = chunks[-1]
    outbox.printed = (len(chunks) - 1, len(last[1])) if last[0] != "display" else (len(chunks), 0)
    return new


def _flush(item: _Item, final: bool = False) -> None:
    with _LOCK:
        outbox = item.outbox
        taken, outbox.reports = outbox.reports, []
        dropped, outbox.dropped = outbox.dropped, 0
        printed = _new_output(item)
        outbox.sent = time.monotonic()
    for start in range(0, max(len(taken), 1), MAX_BATCH):
        part = taken[start : start + MAX_BATCH]
        last = start + MAX_BATCH >= len(taken)
        if part or final or dropped or printed:
            event: TrialEvent = {"item": item.index, "worker": item.address, "reports": part, "begun": None,
                                 "dropped": dropped, "final": final and last, "output": printed,
                                 "key": None}  # fmt: skip
            _send(item, event)
            dropped, printed = 0, []


def _start_flusher() -> None:
    global _flusher
    with _LOCK:
        if _flusher is not None and _flusher.is_alive():
            return
        _flusher = threading.Thread(target=_flush_forever, name="nbcluster-trial-reports", daemon=True)
        _flusher.start()


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_S)
        with _LOCK:
            items = list(_RUNNING.values())
        for item in items:
            with contextlib.suppress(Exception):
                _flush(item)
