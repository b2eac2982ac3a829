"""`RunState`: the per-item record of one run, written by its engine alone.

Every item is in exactly one state: *pending* (queued or running), *done*, *failed* or
*cancelled*. A delivery for an item that has already left *pending* is ignored, which is
what makes "every item exactly once" hold when Dask re-runs a batch after losing a
worker, or a batch returns after a cancel.

Shape, for a run of `n` items:

- `status`: a `bytearray(n)` of `PENDING`, `DONE`, `FAILED`, `CANCELLED`;
- `values[i]`: item `i`'s value once *done* (else None);
- `errors[i]`: an `ItemError` for each *failed* item;
- `outputs[i]`: what item `i` printed, as `[stream, payload]` chunks (stream `stdout`,
  `stderr` or `display`), and `output_order`, the items with output in arrival order;
- `lost`: why the unfinished items were given up (the cluster went away), else None;
- `halted`: why they were given up on a cluster that is there but cannot run them
  (nbcluster missing on its scheduler), else None;
- `started`, `ended`: wall-clock times (`ended` is None while the run goes on);
- `direct_keys`: the keys of the batches a worker ran for the kernel directly, not as Dask
  tasks (`direct.py`), whose task-stream records reach the scheduler after their answers.

A state is made running: the first start is its creation. Each `retry()` is a further
start (`begin`); the state finishes when its last start `end`s, and then whatever is still
pending counts as cancelled. Writers are the engine's driver thread and, for `--local`
items, the kernel's main thread; readers (the `Results` view, the waiting cell, the live
widget) may be any thread. One re-entrant lock guards it all; `changed` wakes the waiters
when items printed output, and when the run ends (or its pending items are cancelled).

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
from typing import Any

from nbcluster.run.tracebacks import ItemError

PENDING, DONE, FAILED, CANCELLED = 0, 1, 2, 3


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
        self.outputs: dict[int, list[list[Any]]] = {}
        self.output_order: list[int] = []
        self.lost: str | None = None
        self.halted: str | None = None
        self.started = time.time()
        self.ended: float | None = None
        self.direct_keys: list[str] = []
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.finished = threading.Event()
        self._tally = {DONE: 0, FAILED: 0, CANCELLED: 0}
        self._starts = 1  # starts (the first, retries) not yet ended
        self._listeners: list[Callable[[], None]] = []
        self._done_callbacks: list[Callable[[], None]] = []
        self._closers: list[Callable[[], None]] = []

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
            done, failed, cancelled = self._tally[DONE], self._tally[FAILED], self._tally[CANCELLED]
        total = len(self)
        running = total - done - failed - cancelled
        return {"total": total, "done": done, "failed": failed, "cancelled": cancelled, "running": running}

    def all_done(self) -> bool:
        """Whether every item is done (none failed, cancelled or pending).

        Returns
        -------
        bool
            True when every item has its value.
        """
        return self._tally[DONE] == len(self)

    def unfinished(self) -> list[int]:
        """The items a retry runs again: failed or cancelled.

        Returns
        -------
        list of int
            Their indices, in order.
        """
        with self.lock:
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
        with self.lock:
            return [i for i in indices if self.status[i] == PENDING]

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run has finished, or `timeout` seconds have passed.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait at most; None waits until the end. Either way Ctrl-C in the
            kernel interrupts it within a second.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while not self.finished.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                # Short waits, so that Ctrl-C in the kernel lands within a second.
                self.changed.wait(1.0 if left is None else min(left, 1.0))

    def wait_output(self, seen: int, timeout: float) -> None:
        """Block until more items have output than `seen`, the run ends, or `timeout`.

        Parameters
        ----------
        seen : int
            Items with output the caller has shown (a length of `output_order`).
        timeout : float
            Seconds to wait at most.
        """
        with self.changed:
            if len(self.output_order) == seen and not self.finished.is_set():
                self.changed.wait(timeout)

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
            if not self.finished.is_set():  # a finished run changes no more (until a retry, which drops listeners)
                self._listeners.append(fn)

        def unsubscribe() -> None:
            with self.lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)

        return unsubscribe

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once the run has finished (now, if it has).

        Parameters
        ----------
        fn : callable
            Called with no arguments, once; an exception in it is printed to stderr.
        """
        with self.lock:
            if not self.finished.is_set():
                self._done_callbacks.append(fn)
                return
        _call(fn)

    def on_end(self, fn: Callable[[], None]) -> None:
        """Call `fn()` each time the run ends (its first start, each retry), before anyone
        waiting sees it finished: the journal's end is written before the cell goes on.

        Parameters
        ----------
        fn : callable
            Called with no arguments, with the state's lock held; an exception in it is
            printed to stderr.
        """
        with self.lock:
            self._closers.append(fn)

    # -- writing: the engine only ---------------------------------------------------------
    def begin(self, indices: Iterable[int]) -> None:
        """A retry starts: `indices` are pending again, and the run is going again.

        Their errors and output are dropped, and `lost`, `halted` and `ended` are cleared;
        the run finishes when this start, and any other still going, has ended.

        Parameters
        ----------
        indices : iterable of int
            The items the retry runs (done items among them are run again too).
        """
        with self.lock:
            for i in indices:
                if self.status[i] != PENDING:
                    self._tally[self.status[i]] -= 1
                    self.status[i] = PENDING
                    self.errors.pop(i, None)
                    self.outputs.pop(i, None)
            self._starts += 1
            self.lost = self.halted = None
            self.finished.clear()
            self.ended = None

    def deliver(
        self,
        indices: Sequence[int],
        values: Sequence[Any],
        errors: dict[int, ItemError],
        outputs: dict[int, list[list[Any]]],
    ) -> None:
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
        status = self.status  # a local: this loop runs once per item
        done = failed = 0
        with self.lock:
            fresh = self._deliver_fresh(indices, values, errors, outputs)
            stored = self.values
            printed = len(self.output_order)
            for j, value in enumerate(() if fresh else values):
                i = indices[j]
                if status[i] != PENDING:
                    continue  # a re-run after a lost worker, or a result after cancel
                error = errors.get(j) if errors else None
                if error is None:
                    stored[i] = value
                    status[i] = DONE
                    done += 1
                else:
                    self.errors[i] = error
                    status[i] = FAILED
                    failed += 1
                if outputs and i in outputs:
                    self.outputs[i] = outputs[i]
                    self.output_order.append(i)
            self._tally[DONE] += done
            self._tally[FAILED] += failed
            if len(self.output_order) != printed:
                # Only output wakes the waiting cell before the end (`wait_output`): a wake per
                # batch was a GIL hand-off to the main thread and back for nothing.
                self.changed.notify_all()
        self._notify()

    def _deliver_fresh(
        self,
        indices: Sequence[int],
        values: Sequence[Any],
        errors: dict[int, ItemError],
        outputs: dict[int, list[list[Any]]],
    ) -> bool:
        """The common batch, stored by slices at C speed, or kept packed;
        False if not it.

        It is a run of consecutive items (a `range`), all pending, none failed, none with
        output. Lock held.
        """
        n = len(values)
        if errors or outputs or not n or not isinstance(indices, range) or indices.step != 1:
            return False
        if n > len(indices):
            return False
        start, stop = indices.start, indices.start + n
        if self.status.count(PENDING, start, stop) != n:
            return False  # some delivered already (a re-run after a lost worker): item by item
        self.values[start:stop] = values
        self.status[start:stop] = bytes([DONE]) * n
        self._tally[DONE] += n
        return True

    def cancel_pending(self) -> None:
        """Mark every pending item cancelled (a batch still out is ignored when it returns)."""
        with self.lock:
            changed = self._cancel_pending()
            self.changed.notify_all()
        if changed:
            self._notify()

    def lose(self, reason: str) -> None:
        """The cluster went away: the unfinished items are given up (a retry runs them).

        Parameters
        ----------
        reason : str
            Why, in a line the user is shown (`lost`).
        """
        with self.lock:
            # The first says it: the watch thread and the driver may both notice, and the
            # second, after the first closed the link, no longer knows the cluster's name.
            self.lost = self.lost or reason
        self.cancel_pending()

    def halt(self, reason: str) -> None:
        """The cluster cannot run the items: the unfinished ones are given up (a retry runs them).

        Parameters
        ----------
        reason : str
            Why, and what to do, in a line the user is shown (`halted`).
        """
        with self.lock:
            self.halted = reason
        self.cancel_pending()

    def end(self) -> None:
        """One start is over; the last one to end finishes the run."""
        with self.lock:
            self._starts -= 1
            if self._starts > 0:
                return
            self._cancel_pending()  # never delivered: cancelled, never lost
            for fn in self._closers:
                _call(fn)
            self.ended = time.time()
            self.finished.set()
            self.changed.notify_all()
            callbacks, self._done_callbacks = self._done_callbacks, []
        self._notify()
        with self.lock:
            if self.finished.is_set():  # not restarted meanwhile: nothing more to tell
                self._listeners = []
        for fn in callbacks:
            _call(fn)

    def _cancel_pending(self) -> bool:
        if sum(self._tally.values()) == len(self):
            return False
        for i, s in enumerate(self.status):
            if s == PENDING:
                self.status[i] = CANCELLED
                self._tally[CANCELLED] += 1
        return True

    def _notify(self) -> None:
        with self.lock:
            listeners = list(self._listeners)
        for fn in listeners:
            _call(fn)


def _call(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:
        print(f"nbcluster: a Results listener failed:\n{traceback.format_exc()}", file=sys.stderr)
