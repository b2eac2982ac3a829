"""Waiting for a run in the kernel: output as it arrives, the failure summary, Ctrl-C.

`follow(results)` runs in the kernel's main thread (the cell that waits: the
`%%distribute` cell itself, `%distribute wait NAME`, or `results.retry()`), so whatever it
prints lands in that cell and no other. Item output is shown grouped by item, the first
`SHOWN_OUTPUTS` items in full and the rest counted (`results.output(i)` has them all);
`display()` output is re-displayed with its rich representation. A Ctrl-C / the stop
button there cancels the run and raises `Interrupted`, a `KeyboardInterrupt` (so "Run
all" stops) that IPython shows as one line.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from nbcluster import config
from nbcluster.errors import ClusterCannotRun, ClusterLost, Interrupted
from nbcluster.run import ranks as rank_jobs
from nbcluster.run.results import Results
from nbcluster.widgets._output import end_open_lines as end_open_lines_of_bar
from nbcluster.widgets._output import in_kernel, widget_shown_since

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
    if results.lost:
        raise lost(results)
    if results._state.halted:
        raise cannot_run(results)


def _hold_for_widget(results: Results) -> None:
    """In a kernel, print no item output before the live widget is in the cell.

    The widget appears `widget.delay` after the start (so instant cells stay clean), from
    its own thread. Output printed before that went above it and the rest below: a
    notebook showed items 0-3 over the widget and item 4 under it. So item output waits
    until the widget is shown, the run is over, or one refresh past the delay has gone by
    (a run with no widget: `distribute()` called directly).
    """
    if not in_kernel():
        return
    start = time.monotonic()
    until = start + config.seconds("widget.delay") + 2 * config.seconds("widget.interval")
    while not results.done and not widget_shown_since(start) and time.monotonic() < until:
        results.wait(min(0.05, max(until - time.monotonic(), 0)))


def end_open_lines() -> None:
    """End a terminal progress bar's line, so that what follows does not share it."""
    end_open_lines_of_bar()


def _kept_in(results: Results) -> str:
    """Where a stopped run's results are for the user: its ``--into`` name, else where IPython
    keeps the exception (`magics.py` re-raises it, so ``sys.last_value`` is the one raised)."""
    return results.label or "sys.last_value.results"


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
    where = f"`{results.label}`" if results.label else f"{_kept_in(results)} (use --into NAME to keep them)"
    return Interrupted(
        f"{c['done']}/{c['total']} items finished, {c['cancelled']} cancelled; partial results are in {where}",
        results,
    )


def lost(results: Results) -> ClusterLost:
    """The `ClusterLost` to raise for a run whose cluster went away.

    Parameters
    ----------
    results : Results
        The run.

    Returns
    -------
    nbcluster.errors.ClusterLost
        It says what happened, how many items finished and where they are, and to start a
        cluster and call ``retry()``.
    """
    c = results.counts()
    name = _kept_in(results)
    return ClusterLost(
        f"{results.lost}: {c['done']}/{c['total']} items finished and are in {name}; "
        f"start a cluster and run {name}.retry()",
        results,
    )


def cannot_run(results: Results) -> ClusterCannotRun:
    """The `ClusterCannotRun` to raise for a run the cluster halted (it cannot run the items).

    Parameters
    ----------
    results : Results
        The run.

    Returns
    -------
    nbcluster.errors.ClusterCannotRun
        It says why, that ``retry()`` runs the rest, and where the finished items are.
    """
    c = results.counts()
    name = _kept_in(results)
    return ClusterCannotRun(
        f"{results._state.halted}, then {name}.retry() runs the rest; "
        f"{c['done']}/{c['total']} items finished and are in {name}",
        results,
    )


class _Printer:
    """Prints item output in the waiting cell: the first few items in full, then a count."""

    def __init__(self, results: Results):
        self.results = results
        self.seen = 0
        self.shown = 0
        self.hidden = 0
        self.live: dict[int, int | None] = {}  # trial items whose output came live (None: not shown)
        self.current: int | None = None  # the item whose header was written last
        self.ended: set[int] = set()  # live items delivered: their output is all shown

    def flush(self) -> None:
        state = self.results._state
        trials = self.results._trials
        if trials is not None:
            self._live(trials.new_output())
        order = state.output_order
        new, self.seen = order[self.seen : len(order)], len(order)
        if new:
            end_open_lines()
        ranks = self.results._plan.mode == "ranks"  # a --ranks job shows rank 0's output only
        for i in new:
            if i in self.live:  # a trial's output, shown while it ran: only what had not come yet
                if self.live[i] is not None and i not in self.ended:
                    self._chunks(i, state.outputs.get(i, []), skip=trials.shown.get(i, 0) if trials else 0)
                self.ended.add(i)  # what comes of it live from now on is in its output already
                continue
            if self.shown >= SHOWN_OUTPUTS or (ranks and i != 0):
                self.hidden += 1
                continue
            self.shown += 1
            self.current = None  # its header, even right after its own live output
            self._chunks(i, state.outputs.get(i, []))
        sys.stdout.flush()
        sys.stderr.flush()

    def _live(self, printed: list[tuple[int, list[tuple[str, str]]]]) -> None:
        """A trial run's output as its items print it (`trials.py`), grouped by item, the
        first `SHOWN_OUTPUTS` items only; a header again whenever another item printed."""
        for i, chunks in printed:
            if i not in self.live:
                shown = self.shown < SHOWN_OUTPUTS
                self.shown += shown
                self.hidden += not shown
                self.live[i] = 0 if shown else None
            if self.live[i] is None or i in self.ended:
                continue
            if self.current != i:
                end_open_lines()
                self._header(i)
            for stream, text in chunks:
                (sys.stdout if stream == "stdout" else sys.stderr).write(text)

    def _header(self, i: int) -> None:
        self.current = i
        described = self.results._plan.describe(i)
        sys.stdout.write(f"── item {i}{f' ({described})' if described else ''} ──\n")

    def _chunks(self, i: int, chunks: list[list[Any]], skip: int = 0) -> None:
        """Write item `i`'s chunks, leaving out its first `skip` characters of text (shown live)."""
        for stream, payload in chunks:
            if stream == "display":
                text = None
            else:
                text = payload[skip:] if skip else payload
                skip = max(0, skip - len(payload))
                if not text:
                    continue
            if self.current != i:
                self._header(i)
            if text is None:
                _show(payload)
            else:
                (sys.stdout if stream == "stdout" else sys.stderr).write(text)
            sys.stdout.flush()
            sys.stderr.flush()

    def finish(self) -> None:
        if self.hidden:
            end_open_lines()
            name = self.results.label
            # Without --into no variable holds the results yet: they are the cell's `_`.
            if self.results._plan.mode == "ranks":
                where = f"{name}.output(rank=r)" if name else "`_.output(rank=r)` right after the cell"
                print(f"── … and {self.hidden} more ranks printed output: {where} shows rank r's ──")
                return
            where = f"{name}.output(i)" if name else "`_.output(i)` right after the cell"
            print(f"── … and {self.hidden} more items printed output: {where} shows item i's ──")


def _show(bundle: dict[str, Any]) -> None:
    """Show an item's display() output here: rich in IPython, as text elsewhere."""
    shell = sys.modules.get("IPython.core.interactiveshell")
    if shell is not None and shell.InteractiveShell.initialized():
        from IPython.display import display

        sys.stdout.flush()
        display(bundle, raw=True)
    else:
        print(bundle.get("text/plain", ""))


def report(results: Results) -> None:
    """The summary line and first traceback, if items failed (to stderr).

    Parameters
    ----------
    results : Results
        A finished run; nothing is written when no item failed.
    """
    errors = results.errors
    if not errors or (results._plan.mode == "ranks" and rank_jobs.stopped(results.run_id)):
        return  # a stopped job's own line (`ranks.summary`) says what happened and what to do
    end_open_lines()
    text = results.summary() + "\n" + errors[0].traceback
    if results.label:
        name = results.label
        text += f"({name}.errors lists the failures, {name}.raise_first() raises the first, {name}.retry() re-runs them)\n"
    else:  # no variable holds them yet: say where they are rather than invent a name
        text += "(the results, `_` right after the cell, have .errors, .raise_first() and .retry(); --into NAME keeps them)\n"
    sys.stderr.write(text)
    sys.stderr.flush()
