"""What a person reads from a run's counts: items per second, time left, one line of text, the grid table.

A progress source is any callable returning a mapping with ``done``, ``running``, ``failed``
and ``total`` (and optionally ``finished`` and ``grid``, see `nbcluster.widgets`). `Live`
(``_live.py``) reads one every tick and turns the stream of readings into what it draws:
`RateMeter` for items per second over the last few seconds, `decorate` for the counts with
rate, ETA and state, `rank_grid` for the table (best first by an objective, else in item
order), `text_line` for a terminal's bar and every output's text/plain.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal, Protocol

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
    out.update({k: int(counts[k]) for k in ("cancelled", "pending") if counts.get(k)}, elapsed=elapsed, state=state)
    if rate:
        remaining = out["total"] - out["done"] - out["failed"] - out.get("cancelled", 0)
        out.update(rate=rate, eta=remaining / rate if remaining > 0 else 0.0)
    if label:
        out["label"] = label
    return out


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
    if best is not None:  # a stable sort: equal values, and the rows without one, keep their order
        sign = -1 if best == "max" else 1
        rows.sort(key=lambda r: (1, 0.0) if (k := _sort_key(r.get("value"))) is None else (0, sign * k))
    shown = []
    for r in rows[:limit]:
        row: dict[str, Any] = {"params": {k: _format_value(v) for k, v in (r.get("params") or {}).items()}}
        if r.get("value") is not None:
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
