"""Waiting for a run in the kernel: output as it arrives, the failure summary, Ctrl-C.

`follow(results)` runs in the kernel's main thread (the cell that waits: the
`%%distribute` cell itself, `%distribute wait NAME`, or `results.retry()`), so whatever it
prints lands in that cell and no other. Item output is shown grouped by item, the first
`SHOWN_OUTPUTS` items in full (of a ``--ranks`` job, rank 0 only) and the rest counted
(`results.output(i)` has them all); a trial's output is shown while it runs. `display()`
output is re-displayed with its rich representation. A Ctrl-C / the stop button there
cancels the run and raises `Interrupted`, a `KeyboardInterrupt` (so "Run all" stops) that
IPython shows as one line.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from nbcluster import config
from nbcluster.errors import ClusterCannotRun, ClusterLost, Interrupted
from nbcluster.run import ranks as rank_jobs
from nbcluster.run.results import Results
from nbcluster.widgets._output import end_open_lines, in_kernel, shell, widget_shown_since

SHOWN_OUTPUTS = 5  # items whose output is printed in full; the rest are counted


def follow(results: Results) -> None:
    """Wait in the kernel's main thread, printing output as it comes; Ctrl-C cancels.

    Once the run is over it prints the failure summary (`report`).

    Parameters
    ----------
    results : Results
        The run to wait for.

    Raises
    ------
    nbcluster.errors.Interrupted
        On Ctrl-C or the stop button: the run is cancelled, and the exception carries the
        partial results.
    nbcluster.errors.ClusterLost
        When the cluster went away during the run; the finished items are kept.
    nbcluster.errors.ClusterCannotRun
        When the cluster cannot run the items (none of its workers qualify, say).
    """
    printer = _Printer(results)
    try:
        _hold_for_widget(results)
        while not results.done:
            results._state.wait_output(printer.seen, 1.0)
            printer.flush()
        printer.flush()
    except KeyboardInterrupt:
        results.cancel()
        end_open_lines()  # a terminal's bar: "Interrupted:" on a line of its own
        raise interrupted(results) from None
    printer.finish()
    report(results)
    end_open_lines()
    c = results.counts()
    # Without --into, IPython keeps the exception (`magics.py` re-raises it) and its results.
    name = results.label or "sys.last_value.results"
    kept = f"{c['done']}/{c['total']} items finished and are in {name}"
    if results.lost:
        raise ClusterLost(f"{results.lost}: {kept}; start a cluster and run {name}.retry()", results)
    if results._state.halted:
        raise ClusterCannotRun(f"{results._state.halted}, then {name}.retry() runs the rest; {kept}", results)


def _hold_for_widget(results: Results) -> None:
    """In a kernel, print no item output before the live widget is in the cell.

    The widget appears `widget.delay` after the start (so instant cells stay clean), from
    its own thread; output printed before it would go above it and the rest below. So item
    output waits until the widget is shown, the run is over, or one refresh past the delay
    has gone by (a run with no widget: `distribute()` called directly).
    """
    if not in_kernel():
        return
    start = time.monotonic()
    until = start + config.seconds("widget.delay") + 2 * config.seconds("widget.interval")
    while not results.done and not widget_shown_since(start) and time.monotonic() < until:
        results.wait(min(0.05, max(until - time.monotonic(), 0)))


def interrupted(results: Results) -> Interrupted:
    """The `Interrupted` to raise for a run stopped by Ctrl-C.

    Parameters
    ----------
    results : Results
        The cancelled run.

    Returns
    -------
    nbcluster.errors.Interrupted
        It says how many items finished and were cancelled, and where the partial results
        are (the ``--into`` name, else ``sys.last_value.results``).
    """
    c = results.counts()
    where = f"`{results.label}`" if results.label else "sys.last_value.results (use --into NAME to keep them)"
    done = f"{c['done']}/{c['total']} items finished, {c['cancelled']} cancelled"
    return Interrupted(f"{done}; partial results are in {where}", results)


class _Printer:
    """Prints item output in the waiting cell, grouped by item; see the module docstring."""

    def __init__(self, results: Results):
        self.results = results
        self.seen = 0  # the items of `output_order` taken so far
        self.shows: dict[int, bool] = {}  # item -> its output is shown (decided at its first output)
        self.shown = 0
        self.current: int | None = None  # the item whose header was written last
        self.ended: set[int] = set()  # items delivered: all their output is shown by then

    def flush(self) -> None:
        state, trials = self.results._state, self.results._trials
        for i, chunks in trials.new_output() if trials is not None else ():
            if self._shows(i) and i not in self.ended:
                self._write(i, chunks)
        order = state.output_order
        new, self.seen = order[self.seen : len(order)], len(order)
        for i in new:
            live = i in self.shows  # its output came as it ran (a trial): only what had not come yet
            if self._shows(i) and i not in self.ended:
                if not live:
                    self.current = None  # a header, even after the same item's output of a former run
                self._write(i, state.outputs.get(i, []), skip=trials.shown.get(i, 0) if live and trials else 0)
            self.ended.add(i)
        sys.stdout.flush()
        sys.stderr.flush()

    def _shows(self, i: int) -> bool:
        if i not in self.shows:
            self.shows[i] = self.shown < SHOWN_OUTPUTS and (self.results._plan.mode != "ranks" or i == 0)
            self.shown += self.shows[i]
        return self.shows[i]

    def _write(self, i: int, chunks: Any, skip: int = 0) -> None:
        """Write item `i`'s chunks, leaving out its first `skip` characters of text (shown live)."""
        for stream, payload in chunks:
            if stream != "display":
                payload, skip = payload[skip:], max(0, skip - len(payload))
                if not payload:
                    continue
            end_open_lines()
            if self.current != i:
                self.current = i
                described = self.results._plan.describe(i)
                sys.stdout.write(f"── item {i}{f' ({described})' if described else ''} ──\n")
            if stream == "display":
                _show(payload)
            else:
                (sys.stdout if stream == "stdout" else sys.stderr).write(payload)
            sys.stdout.flush()
            sys.stderr.flush()

    def finish(self) -> None:
        hidden = len(self.shows) - self.shown
        if hidden:
            end_open_lines()
            ranks = self.results._plan.mode == "ranks"
            what, call, one = ("ranks", "output(rank=r)", "rank r") if ranks else ("items", "output(i)", "item i")
            # Without --into no variable holds the results yet: they are the cell's `_`.
            name = self.results.label
            where = f"{name}.{call}" if name else f"`_.{call}` right after the cell"
            print(f"── … and {hidden} more {what} printed output: {where} shows {one}'s ──")


def _show(bundle: dict[str, Any]) -> None:
    """Show an item's display() output here: rich in IPython, as text elsewhere."""
    if shell() is None:
        print(bundle.get("text/plain", ""))
        return
    from IPython.display import display

    sys.stdout.flush()
    display(bundle, raw=True)


def report(results: Results) -> None:
    """The summary line and first traceback, if items failed (to stderr).

    Parameters
    ----------
    results : Results
        A finished run; nothing is written when no item failed.
    """
    if not results.errors or (results._plan.mode == "ranks" and rank_jobs.stopped(results.run_id)):
        return  # a stopped job's own line (`ranks.summary`) says what happened and what to do
    end_open_lines()
    name = results.label
    # Without --into no variable holds them yet: say where they are rather than invent a name.
    hint = (f"({name}.errors lists the failures, {name}.raise_first() raises the first, {name}.retry() re-runs them)"
            if name else "(the results, `_` right after the cell, have .errors, .raise_first() and .retry(); "
            "--into NAME keeps them)")  # fmt: skip
    sys.stderr.write(f"{results.summary()}\n{results.errors[0].traceback}{hint}\n")
    sys.stderr.flush()
