"""A trial run's curves as inline SVG, for the frozen picture (``graphs.js`` draws the live ones).

`curves` is what `nbcluster.run.trials.Trials.curves` makes: ``metric``, ``mode`` and
``series``, each ``label``, ``points`` (``[step, value]`` pairs), ``state`` and ``best``.
One polyline per trial over shared axes: the best drawn last, thick and in the accent
colour; stopped and timed-out trials grey; the others thin. The same rules as
``renderCurves`` in ``static/graphs.js``, so the frozen picture keeps what the live view
showed.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

WIDTH, HEIGHT, PAD = 480, 160, 4
COLORS = {"best": "#e8590c", "stopped": "#adb5bd", "other": "#4c6ef5"}  # as in graphs.js


def _kind(series: Mapping[str, Any]) -> str:
    if series.get("best"):
        return "best"
    return "stopped" if series.get("state") in ("stopped", "timed out") else "other"


def render_curves(curves: Mapping[str, Any]) -> str:
    """One curve per trial (metric against step), as an HTML box with an inline SVG.

    Parameters
    ----------
    curves : Mapping
        ``metric``, ``mode`` and ``series`` (see the module docstring).

    Returns
    -------
    str
        ``<div class="nbc-curves">`` with a heading and the SVG; "" without points.
    """
    series = [s for s in curves.get("series") or [] if s.get("points")]
    if not series:
        return ""
    steps = [p[0] for s in series for p in s["points"]]
    values = [p[1] for s in series for p in s["points"]]
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    y0, y1 = min(values), max(values)
    if y1 == y0:
        y1 = y0 + 1

    def xy(point: list[float]) -> str:
        x = PAD + (point[0] - x0) / (x1 - x0) * (WIDTH - 2 * PAD)
        y = HEIGHT - PAD - (point[1] - y0) / (y1 - y0) * (HEIGHT - 2 * PAD)
        return f"{x:.1f},{y:.1f}"

    lines = []
    for s in sorted(series, key=lambda s: {"stopped": 0, "other": 1, "best": 2}[_kind(s)]):  # the best on top
        kind = _kind(s)
        width = 2.5 if kind == "best" else 1
        opacity = 1 if kind == "best" else 0.6
        lines.append(
            f'<polyline class="nbc-curve nbc-curve-{kind}" fill="none" stroke="{COLORS[kind]}" '
            f'stroke-width="{width}" stroke-opacity="{opacity}" vector-effect="non-scaling-stroke" '
            f'points="{" ".join(xy(p) for p in s["points"])}"><title>{escape(str(s.get("label", "")))}</title></polyline>'
        )
    mode = curves.get("mode")
    metric = escape(str(curves.get("metric") or ""))
    head = f"{metric} by step" + (f" ({escape(str(mode))} is best)" if mode else "")
    scale = f"{y0:.4g} to {y1:.4g}, steps {x0} to {x1}"
    svg = (f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" '
           f'style="width:100%;height:{HEIGHT}px;display:block">{"".join(lines)}</svg>')  # fmt: skip
    return (f'<div class="nbc-curves" style="margin:6px 0"><div style="font-weight:600">{head}</div>'
            f'{svg}<div style="font-size:11px;opacity:.7">{escape(scale)}</div></div>')  # fmt: skip
