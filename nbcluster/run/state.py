"""`RunState`: the per-item record of one run.

Every item is in exactly one state: *pending* (queued or running), *done*, *failed* or
*cancelled*. A delivery for an item that has already left *pending* is ignored, which is
what makes "every item exactly once" hold when Dask re-runs a batch after losing a
worker, or a batch returns after a cancel.

Shape, for a run of `n` items:

- `status`: a `bytearray(n)` of `PENDING`, `DONE`, `FAILED`, `CANCELLED`;
- `values[i]`: item `i`'s value once *done* (else None);
- `errors[i]`: an `ItemError` for each *failed* item;
- `output[i]`: what item `i` printed, as `[stream, payload]` chunks (stream `stdout`,
  `stderr` or `display`), and `printed`, the items with output in arrival order since the
  run's last start (what the waiting cell prints);
- `span` (a `Span`): `started`, `ended`, wall-clock times (`ended` is None while the run goes
  on: it is the one record of whether the run has finished); `lost`, why the unfinished items were given up (the cluster went away), and `halted`,
  why they were given up on a cluster that is there but cannot run them (nbcluster missing
  on its scheduler), each else None;
- `direct_keys`: the keys of the batches a worker ran for the kernel directly, not as Dask
  tasks (`transport.py`), whose task-stream records reach the scheduler after their answers.

A state is made running: the first start is its creation. Each `retry()` is a further
start (`begin`), made only once the run has finished (`Run.retry` refuses one before), so
starts never overlap and `span.ended` alone says whether one is going. A start's `end`
finishes the run: whatever is still pending is cancelled, the `on_end` hooks run, then
`span.ended` is set. Writers are the engine's driver thread and, for `--local`
items and a resumed journal's, the kernel's main thread (`api.py`); readers (the `Results`
view, the waiting cell, the live widget) may be any thread. One re-entrant lock guards it
all (`lock`, the lock of `changed`); `changed` wakes the waiters when items printed output,
and when the run ends (or its pending items are cancelled).

Listeners: `subscribe(fn)` calls `fn()` after every change, from the writing thread, so it
must be quick; listeners are dropped once the run has finished, so that a finished run kept
in IPython's output history does not keep its live view (and the view's metrics) alive.
An exception in a listener is printed to stderr and does not stop the run.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nbcluster.run.tracebacks import ItemError

PENDING, DONE, FAILED, CANCELLED = 0, 1, 2, 3


@dataclass
class Span:
    """When a run started and ended, and why its unfinished items were given up, if they were."""

    started: float
    ended: float | None = None  # None while the run goes on
    lost: str | None = None  # the cluster went away
    halted: str | None = None  # the cluster is there but cannot run them (what to do, in a line)


class RunState:
    """What is known about each item of one run; see the module docstring.

    Parameters
    ----------
    n : int
        Items in the run: all pending, and the run started (its first start).

    Examples
    --------
    A run of three items: two delivered, then its only start ends, and the third, never
    delivered, counts as cancelled.

    >>> state = RunState(3)
    >>> state.deliver(range(2), ["a", "b"], {}, {})
    >>> state.pending(range(3))
    [2]
    >>> state.end()
    >>> state.counts()
    {'total': 3, 'done': 2, 'failed': 0, 'cancelled': 1, 'running': 0}
    >>> list(state.values), state.unfinished()
    (['a', 'b', None], [2])
    """

    def __init__(self, n: int):
        self.status = bytearray(n)
        self.values: list[Any] = [None] * n
        self.errors: dict[int, ItemError] = {}
        self.output: dict[int, list[list[Any]]] = {}
        self.printed: list[int] = []  # the items with output, as it came, since the last start
        self.span = Span(time.time())
        self.direct_keys: list[str] = []
        # One re-entrant lock: hold `lock` to read several fields at once; `changed` wakes the waiters.
        self.lock = self.changed = threading.Condition(threading.RLock())
        # fn() after each change, once the run finished, at each start's end: dicts as ordered sets
        self._hooks: dict[str, dict[Callable[[], None], None]] = {"change": {}, "done": {}, "end": {}}

    def __len__(self) -> int:
        return len(self.status)

    # -- reading -------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """How many items are in each state.

        Returns
        -------
        dict of str to int
            ``total``, ``done``, ``failed``, ``cancelled``, and ``running`` (the pending
            items: queued or running).
        """
        with self.lock:
            done, failed, cancelled, running = map(self.status.count, (DONE, FAILED, CANCELLED, PENDING))
        return {"total": len(self), "done": done, "failed": failed, "cancelled": cancelled, "running": running}

    def unfinished(self) -> list[int]:
        """The items a retry runs again: failed or cancelled.

        Returns
        -------
        list of int
            Their indices, in order.
        """
        # One field, read once the run has ended (a retry waits for that): no lock to hold.
        return [i for i, s in enumerate(self.status) if s in (FAILED, CANCELLED)]

    def pending(self, indices: Iterable[int]) -> list[int]:
        """Those of `indices` still pending: what is left to send of a batch.

        Parameters
        ----------
        indices : iterable of int
            Item indices.

        Returns
        -------
        list of int
            The pending ones among them, in the order given.
        """
        # No lock: an item cancelled as we look is skipped when its batch is stored (`deliver`).
        return [i for i in indices if self.status[i] == PENDING]

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call `fn()` after every change, from the writing thread, until the run finishes.

        Parameters
        ----------
        fn : callable
            Called with no arguments; it must be quick. An exception in it is printed to
            stderr and does not stop the run.

        Returns
        -------
        callable
            Unsubscribes `fn` when called (doing nothing once it is gone).
        """
        with self.lock:
            if self.span.ended is None:  # a finished run changes no more (until a retry)
                self._hooks["change"][fn] = None
        return lambda: self._hooks["change"].pop(fn, None)  # gone already: nothing to do

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once the run has finished (now, if it has).

        Parameters
        ----------
        fn : callable
            Called with no arguments, once; an exception in it is printed to stderr.
        """
        with self.lock:
            if self.span.ended is None:
                self._hooks["done"][fn] = None
                return
        _call([fn])

    def on_end(self, fn: Callable[[], None]) -> None:
        """Call `fn()` each time the run ends (its first start, each retry), before anyone
        waiting sees it finished: the journal's end is written before the cell goes on.
        Given at the run's set-up, before anything runs.

        Parameters
        ----------
        fn : callable
            Called with no arguments, with the state's lock held; an exception in it is
            printed to stderr.
        """
        self._hooks["end"][fn] = None  # at set-up, before anything runs: nothing to race

    # -- writing: the engine only ---------------------------------------------------------
    def begin(self, indices: Iterable[int]) -> None:
        """A retry starts: `indices` are pending again, and the run is going again.

        Their errors and output are dropped, `printed` starts again, and the span's `lost`,
        `halted` and `ended` are cleared; the run finishes when this start `end`s.

        Parameters
        ----------
        indices : iterable of int
            The items the retry runs (done items among them are run again too).
        """
        with self.lock:
            for i in indices:
                self.status[i] = PENDING
                self.errors.pop(i, None)
                self.output.pop(i, None)
            self.printed.clear()  # the waiting cell shows what this start prints, once
            self.span.lost = self.span.halted = self.span.ended = None

    def deliver(self, indices: Sequence[int], values: Sequence[Any], errors: dict[int, ItemError],
                outputs: dict[int, Any]) -> None:  # fmt: skip
        """Store a batch: `values[j]` is item `indices[j]`'s value, `errors[j]` its failure.

        Items no longer pending are skipped, so a batch delivered twice (Dask ran it again
        after losing a worker) or after a cancel changes nothing.

        Parameters
        ----------
        indices : sequence of int
            The run's index of each item in the batch (a `range` for consecutive items).
        values : sequence
            The value of each item the batch ran, by position; a failed item's is ignored.
        errors : dict of int to ItemError
            The failed items, by position in the batch.
        outputs : dict of int to list
            What items printed, by the item's index in the run: ``[stream, payload]``
            chunks.
        """
        status, n = self.status, len(values)  # locals: the loop below runs once per item
        with self.lock:
            start = indices.start if isinstance(indices, range) and indices.step == 1 else -1
            if start >= 0 and not errors and not outputs and n <= len(indices) and status.count(PENDING, start, start + n) == n:
                # The common batch (consecutive, all pending, none failed, no output): by slices.
                self.values[start : start + n] = values
                status[start : start + n] = bytes([DONE]) * n
                values = ()
            for j, value in enumerate(values):
                i = indices[j]
                if status[i] != PENDING:
                    continue  # a re-run after a lost worker, or a result after cancel
                error = errors.get(j)
                if error is None:
                    self.values[i] = value
                    status[i] = DONE
                else:
                    self.errors[i] = error
                    status[i] = FAILED
                if outputs and i in outputs:
                    self.output[i] = outputs[i]
                    self.printed.append(i)
            if outputs:  # only output (and cancels) wake the waiting cell before the end (`follow`)
                self.changed.notify_all()
        self._notify()

    def cancel_pending(self) -> None:
        """Mark every pending item cancelled (a batch still out is ignored when it returns)."""
        with self.lock:
            if PENDING not in self.status:
                return
            self.status[:] = self.status.replace(bytes([PENDING]), bytes([CANCELLED]))
            self.changed.notify_all()
        self._notify()

    def lose(self, reason: str, *, halted: bool = False) -> None:
        """Give up the unfinished items (a retry runs them): the cluster went away, or is there
        but cannot run them (nbcluster missing on its scheduler).

        Parameters
        ----------
        reason : str
            Why (and for `halted`, what to do), in a line the user is shown.
        halted : bool
            Whether the cluster cannot run them (`Span.halted`), rather than went away (`Span.lost`).
        """
        with self.lock:
            if halted:
                self.span.halted = reason
            else:  # the first says it: the watch thread and the driver may both notice, the
                self.span.lost = self.span.lost or reason  # second after the first closed the link
        self.cancel_pending()

    def end(self) -> None:
        """The start is over, and with it the run (see the module docstring)."""
        self.cancel_pending()  # never delivered: cancelled, never lost
        with self.lock:
            _call(self._hooks["end"])
            self.span.ended = time.time()  # finished: what the waiters wait for
            self.changed.notify_all()
            # The listeners' last call (a finished run changes no more), then the callbacks'.
            last = [*self._hooks["change"], *self._hooks["done"]]
            self._hooks["change"], self._hooks["done"] = {}, {}
        _call(last)

    def _notify(self) -> None:
        _call(list(self._hooks["change"]))  # a copy: a listener may unsubscribe while called


def _call(hooks: Iterable[Callable[[], None]]) -> None:
    """Call each of `hooks`; one that fails is printed to stderr and stops neither the others nor the run."""
    for fn in hooks:
        try:
            fn()
        except Exception:
            print(f"nbcluster: a Results listener failed:\n{traceback.format_exc()}", file=sys.stderr)
