"""`Results`: what a `%%distribute` cell (or `distribute()`) gives back.

Ordered like the inputs and filled in as batches finish, whichever order they finish in.
Each item is in exactly one state: *pending* (queued or running), *done*, *failed* or
*cancelled*; a late or repeated delivery for an item that has already left *pending*
is ignored, which is what makes "every item exactly once" hold when Dask re-runs a batch
after losing a worker.

User-facing surface: `len`, indexing and iteration (values; a failed item re-raises its
own exception), `.params`, `.errors`, `.ok`, `.done`, `.to_pandas()`, `.retry()`,
`.raise_first()`, `.output(i)`, `.wait()`, `.cancel()`, `.futures`, and a compact table
as the notebook display.

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
- Dask keys: every batch of a run is a task `distribute-<run id>-<n>` (Dask's key prefix
  is `distribute`); `results.run_id` is that id, for matching the scheduler's records.
"""

from __future__ import annotations

import html
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nbcluster.distribute.tracebacks import ItemError, describe, reraise
from nbcluster.errors import NbclusterError

if TYPE_CHECKING:
    from nbcluster.distribute.plan import Plan

PENDING, DONE, FAILED, CANCELLED = 0, 1, 2, 3
_SHOW_ROWS = 8


class NotReady(NbclusterError):
    """An item asked for has not finished yet."""


class Results:
    """Ordered results of a distributed cell; see the module docstring."""

    def __init__(self, plan: Plan, *, run_id: str, label: str | None = None):
        self._plan = plan
        self.run_id = run_id
        self.label = label  # the --into name, for messages
        n = len(plan)
        self._values: list[Any] = [None] * n
        self._state = bytearray(n)
        self._counts = {DONE: 0, FAILED: 0, CANCELLED: 0}
        self._errors: dict[int, ItemError] = {}
        self._outputs: dict[int, list[list[str]]] = {}
        self._output_order: list[int] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[Callable[[Results], None]] = []
        self._done_callbacks: list[Callable[[Results], None]] = []
        self._finished = threading.Event()
        self._active = 0  # runs (the first, retries) still going
        self.started = time.time()
        self.ended: float | None = None
        self.shipped = ""  # the capture report line
        self.lost: str | None = None  # why the unfinished items were given up (cluster gone)
        self._engine: Any = None  # engine.Engine.bind sets it: cancel(), retry(indices), client
        self._item_futures: list[Any] | None = None
        self.code_index: dict[str, list[tuple[str, int, int]]] = {}  # see capture.code_index

    # -- list-like -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._state)

    def __getitem__(self, i: int | slice | str) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if isinstance(i, str):
            return self[self._by_worker(i)]
        __tracebackhide__ = True
        index = range(len(self))[i]
        state = self._state[index]
        if state == DONE:
            return self._values[index]
        if state == FAILED:
            self._errors[index].exception  # noqa: B018 - build it before hiding this frame
            reraise(self._errors[index])
        if state == CANCELLED:
            raise NotReady(f"item {index} was cancelled ({self._progress_text()}); .retry() runs it again")
        name = self.label or "NAME"
        raise NotReady(
            f"item {index} has not finished yet ({self._progress_text()}); `%distribute wait {name}` "
            "or .wait() blocks until the run is done"
        )

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def _by_worker(self, address: str) -> int:
        if self._plan.mode == "everywhere" and address in self._plan.items:
            return self._plan.items.index(address)
        raise KeyError(address)

    # -- user-facing views ---------------------------------------------------------------
    @property
    def params(self) -> list[dict[str, Any]]:
        """Per-item bindings, e.g. `[{'x': 0}, {'x': 1}]` (`{'worker': ...}` for --everywhere)."""
        return [self._plan.params(i) for i in range(len(self))]

    @property
    def errors(self) -> list[ItemError]:
        with self._lock:
            return [self._errors[i] for i in sorted(self._errors)]

    @property
    def ok(self) -> bool:
        """Every item finished without an error."""
        return self._counts[DONE] == len(self)

    @property
    def done(self) -> bool:
        """Nothing is pending any more (items succeeded, failed or were cancelled)."""
        return self._finished.is_set()

    def counts(self) -> dict[str, int]:
        with self._lock:
            done, failed, cancelled = self._counts[DONE], self._counts[FAILED], self._counts[CANCELLED]
        total = len(self)
        return {
            "total": total,
            "done": done,
            "failed": failed,
            "cancelled": cancelled,
            "running": total - done - failed - cancelled,
        }

    def values(self, missing: Any = None) -> list[Any]:
        """All values, with `missing` for items that failed, were cancelled or are pending."""
        with self._lock:
            return [v if s == DONE else missing for v, s in zip(self._values, self._state, strict=True)]

    def output(self, i: int) -> str:
        """What item `i` printed (stderr lines marked `[stderr]`)."""
        chunks = self._outputs.get(range(len(self))[i], [])
        return "".join(_chunk_text(stream, payload) for stream, payload in chunks)

    def raise_first(self) -> None:
        """Raise the first failed item's exception (original type, remote traceback attached)."""
        __tracebackhide__ = True
        errors = self.errors
        if errors:
            reraise(errors[0])

    def to_pandas(self) -> Any:
        """A DataFrame: one column per parameter, then `result` (and `error` if any failed)."""
        try:
            import pandas as pd
        except ImportError:
            raise NbclusterError("to_pandas() needs pandas: pip install pandas") from None
        rows = []
        with self._lock:
            for i in range(len(self)):
                row = dict(self._plan.params(i))
                row["result"] = self._values[i] if self._state[i] == DONE else None
                if self._errors:
                    error = self._errors.get(i)
                    row["error"] = f"{error.type_name}: {error.message}" if error else None
                rows.append(row)
        return pd.DataFrame(rows)

    @property
    def futures(self) -> list[Any]:
        """Dask futures of the values (None for failed items), for further Dask work.

        Batches travel as opaque blobs, so these are made on first use by scattering the
        finished values back to the cluster; this waits for the run to finish.
        """
        self.wait()
        if self._item_futures is None:
            if self._engine is None or self._engine.client is None:
                raise NbclusterError("these results never reached a cluster (they ran with --local)")
            ok = [i for i in range(len(self)) if self._state[i] == DONE]
            scattered = self._engine.client.scatter([self._values[i] for i in ok], hash=False)
            futures: list[Any] = [None] * len(self)
            for i, f in zip(ok, scattered, strict=True):
                futures[i] = f
            self._item_futures = futures
        return self._item_futures

    # -- control -------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> Results:
        """Block until the run has finished (or `timeout` seconds have passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._finished.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(1.0 if left is None else min(left, 1.0))
        return self

    def cancel(self) -> None:
        """Cancel the items still pending, on the cluster too; finished ones are kept."""
        if self._engine is not None:
            self._engine.cancel()
        self._cancel_pending()

    def retry(self, wait: bool = True) -> Results:
        """Run again, in place, the items that failed or were cancelled."""
        if self._engine is None:
            raise NbclusterError("these results cannot be retried")
        if not self.done:
            raise NbclusterError("the run is still going: wait for it (or cancel it) before retrying")
        indices = [i for i in range(len(self)) if self._state[i] in (FAILED, CANCELLED)]
        if not indices:
            return self
        self.lost = None
        self._engine.retry(indices)
        if wait:
            from nbcluster.distribute.follow import follow

            follow(self)
        return self

    def subscribe(self, fn: Callable[[Results], None]) -> Callable[[], None]:
        """Call `fn(results)` after every change; returns the unsubscribe function."""
        with self._lock:
            self._listeners.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._listeners:
                    self._listeners.remove(fn)

        return unsubscribe

    def add_done_callback(self, fn: Callable[[Results], None]) -> None:
        """Call `fn(results)` once the run has finished (now, if it has)."""
        with self._lock:
            if not self._finished.is_set():
                self._done_callbacks.append(fn)
                return
        _call(fn, self)

    # -- engine side (run.py) --------------------------------------------------------------
    def _begin(self, indices: list[int]) -> None:
        with self._lock:
            for i in indices:
                if self._state[i] != PENDING:
                    self._counts[self._state[i]] -= 1
                    self._state[i] = PENDING
                    self._errors.pop(i, None)
                    self._outputs.pop(i, None)
            self._active += 1
            self._finished.clear()
            self.ended = None

    def _deliver(
        self,
        indices: Any,
        values: list[Any],
        errors: dict[int, dict[str, Any]],
        outputs: dict[int, list[list[str]]],
        where: str = "the cluster",
    ) -> None:
        """Store a batch: `values[j]` is the value of item `indices[j]`; `errors` by `j`."""
        with self._lock:
            for j, value in enumerate(values):
                i = indices[j]
                if self._state[i] != PENDING:
                    continue  # a re-run after a lost worker, or a result after cancel
                record = errors.get(j)
                if record is None:
                    self._values[i] = value
                    self._state[i] = DONE
                    self._counts[DONE] += 1
                else:
                    self._errors[i] = ItemError(i, self._plan.params(i), record, where, self.code_index)
                    self._state[i] = FAILED
                    self._counts[FAILED] += 1
                if i in outputs:
                    self._outputs[i] = outputs[i]
                    self._output_order.append(i)
            self._changed.notify_all()
        self._notify()

    def _fail(self, indices: Any, record: dict[str, Any], where: str = "the cluster") -> None:
        self._deliver(indices, [None] * len(indices), dict.fromkeys(range(len(indices)), record), {}, where)

    def _cancel_pending(self) -> None:
        with self._lock:
            changed = False
            for i, state in enumerate(self._state):
                if state == PENDING:
                    self._state[i] = CANCELLED
                    self._counts[CANCELLED] += 1
                    changed = True
            self._changed.notify_all()
        if changed:
            self._notify()

    def _lose(self, reason: str) -> None:
        """The cluster went away: the items not finished are given up (retry() runs them)."""
        with self._lock:
            self.lost = reason
        self._cancel_pending()

    def _end(self) -> None:
        """One run (first or retry) is over; the last one to end finishes the Results."""
        with self._lock:
            self._active -= 1
            if self._active > 0:
                return
            if self._counts[DONE] + self._counts[FAILED] + self._counts[CANCELLED] < len(self):
                for i, state in enumerate(self._state):
                    if state == PENDING:  # never delivered: treat as cancelled, never as lost
                        self._state[i] = CANCELLED
                        self._counts[CANCELLED] += 1
            self.ended = time.time()
            self._finished.set()
            self._changed.notify_all()
            callbacks, self._done_callbacks = self._done_callbacks, []
        self._notify()
        # The run is over: nothing more to tell. A finished Results often lives on in
        # IPython's output history, and must not keep its live view (and that view's
        # metrics) alive with it.
        with self._lock:
            if self._finished.is_set():
                self._listeners = []
        for fn in callbacks:
            _call(fn, self)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            _call(fn, self)

    def _wait_change(self, seen: int, timeout: float) -> None:
        """Block until more output has arrived than `seen`, the run ends, or `timeout`."""
        with self._changed:
            if len(self._output_order) == seen and not self._finished.is_set():
                self._changed.wait(timeout)

    # -- summaries and display ------------------------------------------------------------
    def _progress_text(self) -> str:
        c = self.counts()
        text = f"{c['done']}/{c['total']} done"
        if c["failed"]:
            text += f", {c['failed']} failed"
        if c["cancelled"]:
            text += f", {c['cancelled']} cancelled"
        return text

    def summary(self) -> str:
        """One line: how many items failed and the first failure, or that all succeeded."""
        c = self.counts()
        if not c["failed"]:
            state = "done" if self.ok else self._progress_text()
            return f"{c['total']} items {state}" if self.ok else state
        first = self.errors[0]
        where = f" ({describe(first.params)})" if first.params else ""
        line = f"{c['failed']}/{c['total']} items failed: {first.type_name} at item {first.index}{where}"
        if first.where == "the kernel":
            line += " in the kernel (--local)"
        if c["cancelled"]:
            line += f"; {c['cancelled']} not run"
        return line

    def __repr__(self) -> str:
        return "\n".join(self._rows_text())

    def _rows_text(self) -> list[str]:
        lines = [f"Results: {self._headline()}"]
        for i in self._shown_rows():
            lines.append(
                f"  [{i}] {describe(self._plan.params(i))}{' -> ' if self._plan.params(i) else ''}{self._cell(i)}"
            )
        if len(self) > _SHOW_ROWS:
            lines.append(f"  ... {len(self) - _SHOW_ROWS} more")
        return lines

    def _headline(self) -> str:
        c = self.counts()
        parts = [f"{c['total']} items", f"{c['done']} ok"]
        if c["failed"]:
            parts.append(f"{c['failed']} failed")
        if c["cancelled"]:
            parts.append(f"{c['cancelled']} cancelled")
        if c["running"]:
            parts.append(f"{c['running']} running")
        if self.ended is not None:
            parts.append(f"{self.ended - self.started:.2f} s")
        return " · ".join(parts)

    def _shown_rows(self) -> list[int]:
        n = len(self)
        if n <= _SHOW_ROWS:
            return list(range(n))
        failed = sorted(self._errors)[:2]
        head = [i for i in range(n) if i not in failed][: _SHOW_ROWS - len(failed)]
        return sorted(set(head) | set(failed))

    def _cell(self, i: int) -> str:
        state = self._state[i]
        if state == DONE:
            text = repr(self._values[i])
            return text if len(text) <= 60 else text[:57] + "..."
        if state == FAILED:
            e = self._errors[i]
            return f"{e.type_name}: {e.message}"[:80]
        return "cancelled" if state == CANCELLED else "…"

    def _repr_html_(self) -> str:
        names = list(self._plan.params(0)) if len(self) else []
        head = "".join(f"<th>{html.escape(n)}</th>" for n in ["#", *names, "result"])
        rows = []
        for i in self._shown_rows():
            params = self._plan.params(i)
            cells = [str(i), *(repr(params.get(n)) for n in names), self._cell(i)]
            style = ' style="color:#b00"' if self._state[i] == FAILED else ""
            rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        more = f"<div>… {len(self) - _SHOW_ROWS} more rows</div>" if len(self) > _SHOW_ROWS else ""
        return (
            f"<div><b>Results</b>: {html.escape(self._headline())}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}</div>"
        )


def _chunk_text(stream: str, payload: Any) -> str:
    if stream == "display":
        return str(payload.get("text/plain", "")) + "\n"
    if stream == "stderr":
        return "".join(f"[stderr] {line}" for line in payload.splitlines(keepends=True))
    return payload


def _call(fn: Callable[[Results], None], results: Results) -> None:
    try:
        fn(results)
    except Exception:
        print(f"nbcluster: a Results listener failed:\n{traceback.format_exc()}", file=sys.stderr)
