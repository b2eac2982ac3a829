"""`Results`: what a `%%distribute` cell (or `distribute()`) gives back, and `follow`, the
waiting cell that prints it.

A read-only view of one run. Ordered like the inputs and filled in as batches finish,
whichever order they finish in. The items' values, errors and output live in the run's
`RunState` (`state.py`), which the run's engine writes (and the kernel's main thread, for
``--local`` items); the verbs that act on the run (`cancel`, `retry`) are handed to the
run's control (`api.Run`, which makes the view). So a view holds no state of its own and cannot be written: its
attributes are properties, and what its methods return (lists, dicts) are fresh copies.

User-facing surface: `len`, indexing and iteration (values; a failed item re-raises its
own exception; iterating a run with items cancelled or still running raises `NotReady`
before yielding anything, naming `.values()`, which lists every value with a stand-in
for the missing ones), `.params`, `.errors`, `.ok`, `.done`, `.to_pandas()`, `.retry()`,
`.raise_first()`, `.output(i)`, `.wait()`, `.cancel()`, `.started` and
`.ended` (wall-clock times), and a compact table as the notebook display. A `--persist`
run's values are `Handle`s (`handles.py`) and it adds `.gather()`, `.gather(i)`,
`.nbytes` and `.release()`.

Observing a run (the live widget's hook)
----------------------------------------
- `results.counts()` -> `{"total", "done", "failed", "cancelled", "running"}`;
  `running` counts items queued or executing.
- `results.subscribe(fn)` calls `fn(results)` after every change (a batch arrived, items
  cancelled, the run finished) and returns a function that unsubscribes; listeners are
  dropped once the run has finished (the last call sees `results.done`). It is called
  from nbcluster's driver thread (or the kernel's main thread for `--local` items), so
  `fn` must be quick and must not block; a widget should just copy `counts()` into its
  traits. An exception in `fn` is printed to stderr and does not stop the run.
- `results.add_done_callback(fn)` calls `fn(results)` once when the run has finished
  (at once if it already has).
- `distribute(..., progress=fn)` subscribes `fn` before anything is submitted and calls
  it once straight away, so a widget sees the run from its first state.
- `results.mode` is how the items were given (`"over"`, `"grid"`, `"zip"`, `"once"`,
  `"everywhere"`, `"ranks"`); `results.client` the run's Dask client (None for `--local`
  runs).
- Names: every batch is named `distribute-<run id>-<n>`, and a `--persist` item
  `persist-<run id>-<n>`. A batch that goes through the scheduler is a Dask task of that
  key; a batch sent straight to a worker (`transport.py`) is no Dask task, but its worker
  reports a task-stream record of that name after the answer. `results.run_id` is that id,
  for matching the scheduler's records.

Waiting in the cell (`follow`)
------------------------------
`follow(results)` runs in the kernel's main thread (the cell that waits: the
`%%distribute` cell itself, `%distribute wait NAME`, or `results.retry()`), so whatever it
prints lands in that cell and no other. Item output is shown grouped by item, the first
`SHOWN_OUTPUTS` items in full (of a ``--ranks`` job, rank 0 only) and the rest counted
(`results.output(i)` has them all); a trial's output is shown while it runs. `display()`
output is re-displayed with its rich representation. In a kernel, no item output is
printed before the live widget is in the cell (it would land above the widget), until
one refresh past the widget's delay. A Ctrl-C / the stop button there cancels the run and
raises `Interrupted`, a `KeyboardInterrupt` (so "Run all" stops) that IPython shows as one
line. Once the run is over, `report` writes the failure summary and the first traceback.
"""

from __future__ import annotations

import html
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nbcluster import config
from nbcluster.errors import ClusterCannotRun, ClusterLost, HandleGone, Interrupted, NbclusterError, NotReady
from nbcluster.persist.handles import GONE, Handle
from nbcluster.run import ranks as rank_jobs
from nbcluster.run.cell import Plan, describe
from nbcluster.run.state import CANCELLED, DONE, FAILED, RunState
from nbcluster.run.tracebacks import ItemError, reraise
from nbcluster.run.trial_results import TrialResults
from nbcluster.widgets import end_open_lines, in_kernel, shell, widget_shown_since

if TYPE_CHECKING:
    from nbcluster.run.api import Run
    from nbcluster.run.trials import Trials

_SHOW_ROWS = 8
SHOWN_OUTPUTS = 5  # items whose output the waiting cell prints in full; the rest are counted


class Results(TrialResults):
    """The results of one `%%distribute` cell or `distribute()` call, in the order of the items.

    A read-only view that fills in while the run goes on. Index it, loop over it or take
    ``len()`` as a list of the items' values: a failed item re-raises its own exception
    (with the cell's line numbers) where it is read; an item not finished yet raises
    `NotReady`, saying how to wait. For a ``--everywhere`` run, a worker's address is also
    an index. In a notebook it displays as a compact table.

    Examples
    --------
    >>> runs = nbcluster.distribute(lambda x: 10 / x, over=[1, 2, 0])
    >>> runs[1]
    5.0
    >>> runs.values()
    [10.0, 5.0, None]
    >>> runs.ok, runs.counts()["failed"]
    (False, 1)
    >>> runs.errors[0].type_name
    'ZeroDivisionError'
    """

    __slots__ = ("__weakref__", "_control", "_label", "_plan", "_run_id", "_state", "_trials")

    def __init__(self, state: RunState, plan: Plan, control: Run, *, run_id: str, label: str | None):
        self._state, self._plan, self._control, self._run_id, self._label = state, plan, control, run_id, label
        self._trials: Trials | None = None  # a trial run's (`trials.py`), set by `distribute`

    @property
    def run_id(self) -> str:
        """The run's unique id, as the live graphs and the scheduler know it."""
        return self._run_id

    @property
    def label(self) -> str | None:
        """The `--into` name, for messages."""
        return self._label

    @property
    def mode(self) -> str:
        """How the items were made: ``"over"``, ``"grid"``, ``"zip"``, ``"once"``, ``"everywhere"`` or ``"ranks"``."""
        return self._plan.mode

    @property
    def client(self) -> Any:
        """The `distributed.Client` the run was submitted through (None for a ``--local`` run)."""
        return self._control.engine.client

    @property
    def started(self) -> float:
        """When the run started: seconds since the epoch (`time.time`)."""
        return self._state.span.started

    @property
    def ended(self) -> float | None:
        """When the last item finished (seconds since the epoch), or None while it runs."""
        return self._state.span.ended

    @property
    def _direct_keys(self) -> tuple[str, ...]:
        """The names of the batches a worker ran directly, not as Dask tasks: the live view
        waits for their task-stream records, which reach the scheduler after the answers."""
        return tuple(self._state.direct_keys)

    @property
    def lost(self) -> str | None:
        """Why the unfinished items were given up (the cluster went away), else None."""
        return self._state.span.lost

    # -- list-like -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._state)

    def __getitem__(self, i: int | slice | str) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if isinstance(i, str):  # a worker's address, for an --everywhere run
            if self._plan.mode != "everywhere" or i not in self._plan.items:
                raise KeyError(i)
            i = self._plan.items.index(i)
        __tracebackhide__ = True
        index = range(len(self))[i]
        state = self._state.status[index]
        if state == DONE:
            return self._state.values[index]
        if state == FAILED:
            reraise(self._state.errors[index])
        if state == CANCELLED:
            raise NotReady(f"item {index} was cancelled ({self._progress_text()}); .retry() runs it again")
        wait = f"`%distribute wait {self._label or 'NAME'}` or .wait() blocks until the run is done"
        raise NotReady(f"item {index} has not finished yet ({self._progress_text()}); {wait}")

    def __iter__(self) -> Iterator[Any]:
        # All or nothing: a loop over the values must not stop halfway, nor zip them with
        # the params out of step. Failed items still re-raise their own error, in order.
        c = self.counts()
        if c["cancelled"] or c["running"]:
            what = "was interrupted" if c["cancelled"] else "is still running"
            wait = "" if c["cancelled"] else f", `%distribute wait {self._label or 'NAME'}` waits for the rest"
            raise NotReady(f"the run {what} ({self._progress_text()}): .values() lists every value, with None "
                           f"for the missing ones{wait}; .retry() runs what is missing")  # fmt: skip
        yield from (self[i] for i in range(len(self))) if c["failed"] else self._state.values

    # -- reading -------------------------------------------------------------------------
    @property
    def params(self) -> list[dict[str, Any]]:
        """Per-item bindings, e.g. `[{'x': 0}, {'x': 1}]` (`{'worker': ...}` for --everywhere)."""
        return [self._plan.params(i) for i in range(len(self))]

    @property
    def errors(self) -> list[ItemError]:
        """The failed items, in item order: each with ``index``, ``params``, ``type_name``,
        ``message`` and the original ``exception``, its traceback attached."""
        return [error for _, error in sorted(self._state.errors.items())]  # a copy: taken in one step

    @property
    def ok(self) -> bool:
        """Every item finished without an error."""
        return self._state.status.count(DONE) == len(self)

    @property
    def done(self) -> bool:
        """Nothing is pending any more (items succeeded, failed or were cancelled)."""
        return self._state.span.ended is not None

    def counts(self) -> dict[str, int]:
        """How many items are in each state now.

        Returns
        -------
        dict
            ``{"total", "done", "failed", "cancelled", "running"}``; ``running`` counts the
            items queued or executing.

        Examples
        --------
        >>> runs = nbcluster.distribute(lambda x: 10 / x, over=[1, 2, 0])
        >>> runs.counts()
        {'total': 3, 'done': 2, 'failed': 1, 'cancelled': 0, 'running': 0}
        """
        return self._state.counts()

    def values(self, missing: Any = None) -> list[Any]:
        """All values, in item order, never raising.

        Parameters
        ----------
        missing : object, default None
            The stand-in for items that failed, were cancelled or are still pending.

        Returns
        -------
        list
            One value per item.

        Examples
        --------
        >>> runs = nbcluster.distribute(lambda x: 10 / x, over=[1, 2, 0])
        >>> runs.values(missing=float("nan"))
        [10.0, 5.0, nan]
        """
        with self._state.lock:
            return [v if s == DONE else missing for v, s in zip(self._state.values, self._state.status, strict=True)]

    def output(self, i: int | None = None, *, rank: int | None = None) -> str:
        """What item `i` printed on its worker (for a ``--ranks`` job: what rank `rank` printed).

        Parameters
        ----------
        i : int
            The item's index (negative counts from the end).
        rank : int, optional
            A ``--ranks`` job's rank instead of `i` (ranks are the items, in order).

        Returns
        -------
        str
            Its stdout and stderr in the order printed, stderr lines marked ``[stderr]``;
            empty if it printed nothing.

        Raises
        ------
        IndexError
            If there is no item `i`.
        """
        if (i is None) == (rank is None):
            raise TypeError("output() takes an item index, or rank= for a --ranks job")
        text, index = [], range(len(self))[i if i is not None else rank]  # type: ignore[index]
        for stream, payload in self._state.output.get(index, []):
            if stream == "stderr":
                text += [f"[stderr] {line}" for line in payload.splitlines(keepends=True)]
            else:  # stdout's text, or a display()'s bundle
                text.append(payload if stream == "stdout" else str(payload.get("text/plain", "")) + "\n")
        return "".join(text)

    def raise_first(self) -> None:
        """Raise the first failed item's exception; do nothing when no item failed.

        The exception is the original type, its traceback the item's own, in the cell's
        line numbers.

        Raises
        ------
        Exception
            The first failed item's exception.
        """
        __tracebackhide__ = True
        if self.errors:
            reraise(self.errors[0])

    def to_pandas(self) -> Any:
        """The results as a table: one row per item.

        Returns
        -------
        pandas.DataFrame
            One column per parameter (``x``, or the `grid` names), then ``result``, and
            ``error`` (type and message) when any item failed.

        Raises
        ------
        NbclusterError
            If pandas is not installed, or did not import (the error says why).

        Examples
        --------
        >>> nbcluster.distribute("lr * 2", grid="lr=[0.1, 0.2]").to_pandas()
            lr  result
        0  0.1     0.2
        1  0.2     0.4
        """
        try:
            import pandas as pd
        except ImportError as e:  # missing, or installed but broken: the error says which
            raise NbclusterError(f"to_pandas() needs pandas, which did not import ({e}): pip install pandas") from None
        with self._state.lock:
            failed = {e.index: f"{e.type_name}: {e.message}" for e in self.errors}
            rows = [{**self._plan.params(i), "result": value} for i, value in enumerate(self.values())]
        return pd.DataFrame([{**row, "error": failed.get(i)} for i, row in enumerate(rows)] if failed else rows)

    def wait(self, timeout: float | None = None) -> Results:
        """Block until the run has finished, or `timeout` seconds have passed.

        Unlike `nbcluster.wait`, this prints nothing. Either way Ctrl-C in the kernel
        interrupts it within a second.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most (default: as long as it takes).

        Returns
        -------
        Results
            This view; check `done` after a timeout.
        """
        deadline, state = math.inf if timeout is None else time.monotonic() + timeout, self._state
        with state.changed:
            while state.span.ended is None and (left := deadline - time.monotonic()) > 0:
                state.changed.wait(min(left, 1.0))  # short waits: Ctrl-C in the kernel lands within a second
        return self

    def subscribe(self, fn: Callable[[Results], None]) -> Callable[[], None]:
        """Call `fn` after every change of the run: a progress display's hook.

        Parameters
        ----------
        fn : callable
            Called as ``fn(results)`` from the run's driver thread; keep it quick.

        Returns
        -------
        callable
            Call it (no arguments) to unsubscribe.
        """
        return self._state.subscribe(lambda: fn(self))

    def add_done_callback(self, fn: Callable[[Results], None]) -> None:
        """Call `fn` once the run has finished (at once, if it has).

        Parameters
        ----------
        fn : callable
            Called as ``fn(results)``.
        """
        self._state.add_done_callback(lambda: fn(self))

    # -- acting on the run (api.Run does it) ----------------------------------------------
    def cancel(self) -> None:
        """Cancel the items still pending, on the cluster too; finished ones are kept.

        `retry` runs the cancelled items later. Interrupting the kernel (Ctrl-C) during a
        waiting cell does the same.
        """
        self._control.cancel()

    def retry(self, wait: bool = True) -> Results:
        """Run again, in place, the items that failed or were cancelled.

        A retry runs the same code on the values the run captured, not on the notebook's
        variables as they are now: fix first a cause outside them (a data file, a service, a
        worker that ran out of memory). Finished items are kept, not run again.

        Parameters
        ----------
        wait : bool, default True
            False: return at once, as a ``--no-wait`` cell does.

        Returns
        -------
        Results
            This view, now holding the new attempts.

        Examples
        --------
        The items read a file that is not there yet; once it is written, the retry succeeds:

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "offset")
        >>> def shift(x):
        ...     with open(path) as f:
        ...         return x + int(f.read())
        >>> runs = nbcluster.distribute(shift, over=range(3))
        >>> runs.counts()["failed"]
        3
        >>> with open(path, "w") as f:
        ...     f.write("10")
        2
        >>> runs.retry().values()
        [10, 11, 12]
        """
        self._control.retry(self, wait)
        return self

    # -- persisted results (--persist): the values are handles on the workers ------------------
    def gather(self, i: int | None = None) -> Any:
        """Bring persisted values (``--persist``) to the kernel.

        Parameters
        ----------
        i : int, optional
            One item's index; default: every item.

        Returns
        -------
        object or list
            Item `i`'s value, or every item's value in item order.

        Raises
        ------
        nbcluster.errors.HandleGone
            The cluster was stopped, or items were lost and Dask could not compute them
            again: one line that names them and how to rebuild them.

        Examples
        --------
        >>> shards = nbcluster.distribute(lambda i: [i] * 3, over=range(4), persist=True, into="shards")
        >>> shards.gather(1)
        [1, 1, 1]
        """
        if i is not None:
            return self._handles([i])[0].gather()
        values, lost = [], []
        for j, handle in enumerate(self._handles(range(len(self)))):
            try:
                values.append(handle.gather())
            except HandleGone:
                if handle.gone == GONE:
                    raise  # the cluster was stopped: that is the one line, not a list of every item
                lost.append(j)
        if lost:
            name, many = self._label or "NAME", len(lost) > 1
            raise HandleGone(f"item{'s' * many} {', '.join(map(str, lost))} of {name} {'are' if many else 'is'} lost "
                             "(released, or its worker died and Dask could not compute it again): "
                             f"run the cell that made {name} again; {name}.gather(i) brings the others")  # fmt: skip
        return values

    @property
    def nbytes(self) -> int:
        """Bytes the workers hold for these persisted results."""
        return sum(h.nbytes for h in self._handles())

    def release(self) -> None:
        """Let the workers free every persisted value of this run (handles taken from it too)."""
        for h in self._handles():
            h.release()

    def _handles(self, items: range | list[int] | None = None) -> list[Handle]:
        """The handles of `items` (read as `self[i]` reads them), else of the finished items."""
        if not self._control.persist:
            raise NbclusterError("only --persist results live on the workers: these values are already here")
        return [h for h in self.values() if h is not None] if items is None else [self[j] for j in items]

    # -- summaries and display ------------------------------------------------------------
    def summary(self) -> str:
        """One line: how many items failed and the first failure, or that all succeeded.

        Returns
        -------
        str
            Such as ``"3 items done"`` or ``"1/3 items failed: ZeroDivisionError at item 2 (x=0)"``.
        """
        c = self.counts()
        if not c["failed"]:
            return f"{c['total']} items done" if self.ok else self._progress_text()
        first = self.errors[0]
        where = f" ({describe(first.params)})" if first.params else ""
        line = f"{c['failed']}/{c['total']} items failed: {first.type_name} at item {first.index}{where}"
        line += " in the kernel (--local)" if first.where == "the kernel" else ""
        return line + (f"; {c['cancelled']} not run" if c["cancelled"] else "")

    def _progress_text(self) -> str:
        c = self.counts()
        return ", ".join([f"{c['done']}/{c['total']} done", *(f"{c[k]} {k}" for k in ("failed", "cancelled") if c[k])])

    def _rows(self) -> Iterator[tuple[int, dict[str, Any], str]]:
        """The rows a display shows: the first ones, and (of a long run) the first failures."""
        failed = sorted(self._state.errors)[:2] if len(self) > _SHOW_ROWS else []
        head = [i for i in range(min(len(self), _SHOW_ROWS)) if i not in failed][: _SHOW_ROWS - len(failed)]
        for i in sorted(head + failed):
            state, text = self._state.status[i], repr(self._state.values[i])
            if state == FAILED:  # whole: a message's end often says what to do
                text = f"{self._state.errors[i].type_name}: {self._state.errors[i].message}"
            elif state != DONE:
                text = "cancelled" if state == CANCELLED else "…"
            elif len(text) > 60:
                text = text[:57] + "..."
            yield i, self._plan.params(i), text

    def __repr__(self) -> str:
        lines = [f"Results: {self._headline()}"]
        lines += [f"  [{i}] {describe(params)}{' -> ' if params else ''}{text}" for i, params, text in self._rows()]
        more = [f"  ... {len(self) - _SHOW_ROWS} more"] if len(self) > _SHOW_ROWS else []
        return "\n".join(lines + more)

    def _repr_html_(self) -> str:
        names = list(self._plan.params(0)) if len(self) else []
        head = "".join(f"<th>{html.escape(n)}</th>" for n in ["#", *names, "result"])
        rows = []
        for i, params, text in self._rows():
            cells = [str(i), *(repr(params.get(n)) for n in names), text]
            style = ' style="color:#b00"' if self._state.status[i] == FAILED else ""
            rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        more = f"<div>… {len(self) - _SHOW_ROWS} more rows</div>" if len(self) > _SHOW_ROWS else ""
        return (
            f"<div><b>Results</b>: {html.escape(self._headline())}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}</div>"
        )

    def _headline(self) -> str:
        c = self.counts()
        parts = [f"{c['total']} items", f"{c['done']} ok", *(f"{c[k]} {k}" for k in ("failed", "cancelled", "running") if c[k])]
        parts += [f"{self.ended - self.started:.2f} s"] if self.ended is not None else []
        # A run left with --no-wait shows why it stopped here, where its owner looks next.
        stopped = self.lost or self._state.span.halted
        return " · ".join(parts + ([f"stopped: {stopped}"] if stopped else []))


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
    printer, state = _Printer(results), results._state
    try:
        if in_kernel():  # no item output above the live widget: wait for it to show
            start = time.monotonic()
            until = start + config.seconds("widget.delay") + 2 * config.seconds("widget.interval")
            while not results.done and not widget_shown_since(start) and time.monotonic() < until:
                results.wait(min(0.05, max(until - time.monotonic(), 0)))
        while not results.done:
            with state.changed:  # woken when items printed, and at the end
                if len(state.printed) == printer.seen and state.span.ended is None:
                    state.changed.wait(1.0)
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
    if halted := results._state.span.halted:
        raise ClusterCannotRun(f"{halted}, then {name}.retry() runs the rest; {kept}", results)


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
    return Interrupted(f"{c['done']}/{c['total']} items finished, {c['cancelled']} cancelled; partial results are in {where}", results)


def report(results: Results) -> None:
    """The summary line and first traceback, if items failed (to stderr).

    Parameters
    ----------
    results : Results
        A finished run; nothing is written when no item failed.
    """
    if not results.errors or (results.mode == "ranks" and rank_jobs.stopped(results.run_id)):
        return  # a stopped job's own line (`ranks.summary`) says what happened and what to do
    end_open_lines()
    name = results.label
    # Without --into no variable holds them yet: say where they are rather than invent a name.
    hint = (f"({name}.errors lists the failures, {name}.raise_first() raises the first, {name}.retry() re-runs them)"
            if name else "(the results, `_` right after the cell, have .errors, .raise_first() and .retry(); "
            "--into NAME keeps them)")  # fmt: skip
    print(f"{results.summary()}\n{results.errors[0].traceback}{hint}", file=sys.stderr, flush=True)


class _Printer:
    """Prints item output in the waiting cell, grouped by item; see the module docstring."""

    def __init__(self, results: Results):
        self.results = results
        self.seen = 0  # the items of `printed` taken so far
        self.shows: dict[int, bool] = {}  # item -> its output is shown (decided at its first output)
        self.shown = 0
        self.current: int | None = None  # the item whose header was written last
        self.ended: set[int] = set()  # items delivered: all their output is shown by then

    def flush(self) -> None:
        state, trials = self.results._state, self.results._trials
        for i, chunks in trials.new_output() if trials is not None else ():
            if self._shows(i) and i not in self.ended:
                self._write(i, chunks)
        new = state.printed[self.seen :]  # what came since: `printed` only grows while the cell waits
        self.seen += len(new)
        for i in new:  # of a trial's item, the output that came as it ran is shown: only the rest now
            if self._shows(i):  # (each item is in `printed` once: once delivered, it is `ended`)
                self._write(i, state.output[i], skip=trials.printed.shown.get(i, 0) if trials else 0)
            self.ended.add(i)

    def _shows(self, i: int) -> bool:
        if i not in self.shows:
            self.shows[i] = self.shown < SHOWN_OUTPUTS and (self.results.mode != "ranks" or i == 0)
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
            if stream == "display" and shell() is not None:
                from IPython.display import display

                sys.stdout.flush()
                display(payload, raw=True)
            else:  # plain Python shows a display()'s text
                text = f"{payload.get('text/plain', '')}\n" if stream == "display" else payload
                (sys.stderr if stream == "stderr" else sys.stdout).write(text)
            sys.stdout.flush()
            sys.stderr.flush()

    def finish(self) -> None:
        if hidden := len(self.shows) - self.shown:
            end_open_lines()
            ranks = self.results.mode == "ranks"
            what, call, one = ("ranks", "output(rank=r)", "rank r") if ranks else ("items", "output(i)", "item i")
            # Without --into no variable holds the results yet: they are the cell's `_`.
            where = f"{self.results.label}.{call}" if self.results.label else f"`_.{call}` right after the cell"
            print(f"── … and {hidden} more {what} printed output: {where} shows {one}'s ──")
