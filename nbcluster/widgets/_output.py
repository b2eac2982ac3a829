"""Where a live view goes, and what it says there.

Progress arithmetic shared by the widget and the terminal bar: a progress source is any
callable returning a mapping with ``done``, ``running``, ``failed`` and ``total`` (and
optionally ``finished`` and ``grid``, see `nbcluster.widgets`); `RateMeter`, `decorate` and
`rank_grid` turn a stream of such readings into what a person wants to read: items per
second over the last few seconds, time left, and the grid table (best first by an
objective, else in item order).

Where it goes: a kernel's output area (`KernelDisplay`), a terminal's text bar (`TextBar`),
or a test's recorder (the `Seams`).
"""

from __future__ import annotations

import math
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TextIO

from nbcluster.widgets._static import progress_line

Best = Literal["max", "min"] | None
GRID_ROWS = 10


class ProgressSource(Protocol):
    def __call__(self) -> Mapping[str, Any]: ...


class RateMeter:
    """Items per second over a sliding `horizon`, from (time, completed) readings."""

    def __init__(self, horizon: float = 10.0) -> None:
        self.horizon = horizon
        self._points: deque[tuple[float, int]] = deque()

    def add(self, t: float, completed: int) -> float | None:
        """Record a reading and return the rate.

        Parameters
        ----------
        t : float
            When (seconds, any clock).
        completed : int
            Items completed by then.

        Returns
        -------
        float or None
            Items per second, or None while it cannot be told (or is zero).
        """
        points = self._points
        points.append((t, completed))
        while len(points) > 2 and t - points[1][0] >= self.horizon:
            points.popleft()
        t0, c0 = points[0]
        dt = t - t0
        return (completed - c0) / dt if dt >= 0.2 and completed > c0 else None


def is_finished(counts: Mapping[str, Any]) -> bool:
    """Whether a run is over.

    Parameters
    ----------
    counts : Mapping
        The run's counts.

    Returns
    -------
    bool
        The source's ``finished`` when it gives one; else whether done and failed items
        account for the total.
    """
    if "finished" in counts:
        return bool(counts["finished"])
    total = counts.get("total") or 0
    return total > 0 and (counts.get("done") or 0) + (counts.get("failed") or 0) >= total


def decorate(
    counts: Mapping[str, Any], *, elapsed: float, rate: float | None, state: str, label: str | None
) -> dict[str, Any]:
    """The counts the drawing code takes: the four numbers plus rate, ETA, state, label.

    Parameters
    ----------
    counts : Mapping
        The run's counts (``done``, ``running``, ``failed``, ``total``, ...).
    elapsed : float
        Seconds since the run started.
    rate : float or None
        Items per second (`RateMeter`).
    state : str
        ``running``, ``done``, ``cancelled``, ...
    label : str or None
        Shown before the progress text.

    Returns
    -------
    dict
        What ``graphs.js`` and the frozen picture draw.
    """
    out: dict[str, Any] = {k: int(counts.get(k) or 0) for k in ("done", "running", "failed", "total")}
    for extra in ("cancelled", "pending"):
        if counts.get(extra):
            out[extra] = int(counts[extra])
    out["elapsed"] = elapsed
    out["state"] = state
    if rate:
        out["rate"] = rate
        remaining = out["total"] - out["done"] - out["failed"] - out.get("cancelled", 0)
        out["eta"] = remaining / rate if remaining > 0 else 0.0
    if label:
        out["label"] = label
    return out


def reported(counts: Mapping[str, Any]) -> dict[str, Any]:
    """The part of decorated counts that goes to the cluster's sidebar (the scheduler's plugin).

    Parameters
    ----------
    counts : Mapping
        Decorated counts (`decorate`).

    Returns
    -------
    dict
        ``label``, ``done``, ``failed``, ``total``, ``cancelled``, ``state`` and ``elapsed``,
        those that are set.
    """
    keep = ("label", "done", "failed", "total", "cancelled", "state", "elapsed")
    return {k: counts[k] for k in keep if counts.get(k) is not None}


def _format_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _sort_key(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return None if math.isnan(f) else f


def rank_grid(grid: Mapping[str, Any] | None, best: Best, limit: int = GRID_ROWS) -> dict[str, Any]:
    """The table to draw: at most `limit` rows, values as short strings.

    With `best` ("max" or "min", from the run's objective), rows with a numeric value sort
    by it and rows without one (pending, failed, non-numeric) follow in their original
    order. With None the rows keep their order (item order): nothing says which way is
    better, so nothing is ranked.

    Parameters
    ----------
    grid : Mapping or None
        ``params`` and ``rows`` (each ``params`` and ``value``) of a ``--grid`` run.
    best : {"max", "min", None}
        Which values come first; None keeps the order.
    limit : int
        The most rows shown.

    Returns
    -------
    dict
        ``params``, ``rows`` (at most `limit`), ``total`` (all rows) and ``ranked`` (`best`:
        which way the rows were ranked, or None); {} without rows.
    """
    if not grid or not grid.get("rows"):
        return {}
    rows = list(grid["rows"])
    if best is not None:
        scored = [(k, i, r) for i, r in enumerate(rows) if (k := _sort_key(r.get("value"))) is not None]
        scored.sort(key=lambda x: (-x[0] if best == "max" else x[0], x[1]))
        rest = [r for r in rows if _sort_key(r.get("value")) is None]
        rows = [r for _, _, r in scored] + rest
    shown = []
    for r in rows[:limit]:
        row: dict[str, Any] = {"params": {k: _format_value(v) for k, v in (r.get("params") or {}).items()}}
        if "value" in r and r["value"] is not None:
            row["value"] = _format_value(r["value"])
        row["status"] = r.get("status", "ok" if "value" in r else "pending")
        shown.append(row)
    params = list(grid.get("params") or (rows[0].get("params") or {}).keys())
    return {"params": params, "rows": shown, "total": len(rows), "ranked": best}


def text_line(counts: Mapping[str, Any], width: int = 24) -> str:
    """``label [#####.....] 12 / 40 done (30%) · ...``: the terminal bar, and text/plain.

    Parameters
    ----------
    counts : Mapping
        Decorated counts (`decorate`).
    width : int
        Characters of the bar itself.

    Returns
    -------
    str
        One line.
    """
    total = counts.get("total") or 0
    finished = (counts.get("done") or 0) + (counts.get("failed") or 0)
    filled = int(width * finished / total) if total else 0
    label = f"{counts['label']} " if counts.get("label") else ""
    return f"{label}[{'#' * filled}{'.' * (width - filled)}] {progress_line(counts)}"


class TextBar:
    """The one-line progress bar for terminal IPython and plain Python.

    On a terminal the line is redrawn in place (carriage return); elsewhere (a log file,
    a pipe) only the final line is written, so logs do not fill with partial bars. Redrawn
    in place, the bar leaves the cursor at the end of its line; item output or an
    `Interrupted:` line printed then would be glued onto it (`... ETA 3.0 s── item 2 ──`), so
    whatever prints first ends the line (`end_open_lines`).
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_len = 0

    def update(self, counts: Mapping[str, Any]) -> None:
        """Redraw the line in place, on a terminal only.

        Parameters
        ----------
        counts : Mapping
            Decorated counts (`decorate`).
        """
        if self.live:
            self._write(text_line(counts), end="")
            _OPEN.add(self)

    def finish(self, counts: Mapping[str, Any]) -> None:
        """Write the final line (also to a log or a pipe).

        Parameters
        ----------
        counts : Mapping
            Decorated final counts.
        """
        _OPEN.discard(self)
        self._write(text_line(counts), end="\n")

    def end_line(self) -> None:
        """Leave the bar's line: the next redraw starts on a line of its own."""
        _OPEN.discard(self)
        if self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0

    def _write(self, text: str, end: str) -> None:
        pad = " " * max(0, self._last_len - len(text))
        prefix = "\r" if self.live else ""
        self.stream.write(prefix + text + pad + end)
        self.stream.flush()
        self._last_len = 0 if end else len(text)


_OPEN: weakref.WeakSet[TextBar] = weakref.WeakSet()  # bars whose line the cursor is still on


def end_open_lines() -> None:
    """End the line of every bar drawn in place, before other output is printed."""
    for bar in list(_OPEN):
        bar.end_line()


class Display(Protocol):
    """Where the widget goes: the kernel's display system, or a test's recorder."""

    def show(self, bundle: dict[str, Any]) -> None:
        """Put a MIME bundle into the output area.

        Parameters
        ----------
        bundle : dict
            MIME type to data (the widget view, and HTML and text fallbacks).
        """
        ...

    def update(self, bundle: dict[str, Any]) -> None:
        """Replace what `show` put there.

        Parameters
        ----------
        bundle : dict
            MIME type to data (the frozen picture).
        """
        ...


class KernelDisplay:
    """One output area of the current cell, addressed by a display id."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, bundle: dict[str, Any]) -> None:
        """Display `bundle` with a new display id.

        Parameters
        ----------
        bundle : dict
            MIME type to data.
        """
        from IPython.display import display

        global _last_shown
        self._handle = display(bundle, raw=True, display_id=True)
        _last_shown = time.monotonic()

    def update(self, bundle: dict[str, Any]) -> None:
        """Replace the displayed output in place (nothing before `show`).

        Parameters
        ----------
        bundle : dict
            MIME type to data.
        """
        if self._handle is not None:
            self._handle.update(bundle, raw=True)


_last_shown = float("-inf")  # when a live widget was last put into a cell (time.monotonic)


def widget_shown_since(t: float) -> bool:
    """Whether a live widget has been displayed since `t`.

    Parameters
    ----------
    t : float
        A `time.monotonic` reading.

    Returns
    -------
    bool
        True when one was shown at or after `t`.
    """
    return _last_shown >= t


def shell() -> Any:
    """The running IPython shell (kernel or terminal).

    Returns
    -------
    InteractiveShell or None
        None in plain Python.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def in_kernel() -> bool:
    """Whether we run inside a Jupyter kernel (where widgets can show).

    Returns
    -------
    bool
        True in a kernel; False in terminal IPython and plain Python.
    """
    ip = shell()
    return ip is not None and getattr(ip, "kernel", None) is not None


@dataclass(frozen=True)
class Seams:
    """Test seams of `Live`: a display, a clock, a text bar, and whether widgets can show.

    Left at None, each is what the running process offers. A test that sets `display` or
    `text` closes the widget itself: no end-of-cell hook is registered.
    """

    display: Display | None = None
    clock: Callable[[], float] = time.monotonic
    text: TextBar | None = None
    widgets: bool | None = None

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> Seams:
        """The seams among keyword arguments (``_display``, ``_clock``, ...), removed from them.

        Parameters
        ----------
        kwargs : dict
            Keyword arguments of `nbcluster.widgets.live`; the seams are popped from it.

        Returns
        -------
        Seams
            The seams given, the rest at their defaults.
        """
        given = {
            name: kwargs.pop(f"_{name}")
            for name in ("display", "clock", "text", "widgets")
            if f"_{name}" in kwargs
        }
        return cls(**given)

    @property
    def replaced(self) -> bool:
        """Whether a test replaced the display or the text bar (then it closes the view)."""
        return self.display is not None or self.text is not None


@dataclass
class Output:
    """The resolved output of one `Live`: a widget display, or a text bar, never both."""

    display: Display | None
    text: TextBar | None

    @classmethod
    def for_seams(cls, seams: Seams) -> Output:
        """The output for these seams: the kernel's display in a kernel, else a text bar.

        Parameters
        ----------
        seams : Seams
            What a test replaced, if anything.

        Returns
        -------
        Output
            A display, or a text bar.
        """
        widgets = in_kernel() if seams.widgets is None else seams.widgets
        if widgets:
            return cls(seams.display if seams.display is not None else KernelDisplay(), seams.text)
        return cls(seams.display, seams.text if seams.text is not None else TextBar())

    @property
    def widgets(self) -> bool:
        """Whether the output is a widget display (not a text bar)."""
        return self.text is None
