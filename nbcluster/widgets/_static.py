"""The frozen picture: the live widget's final state as script-free HTML + inline SVG.

A saved notebook reopened without its kernel, nbconvert's HTML, and GitHub's viewer can
show no widget, only what the output's mimebundle holds. So when a run ends the widget's
output is replaced by this HTML. It is drawn from the same data as ``static/graphs.js``
draws live, with the same structure and classes, and every colour, font, size and label
taken from the same ``static/theme.json`` (`nbcluster.widgets._theme`); only the code is
written twice, and tests/test_widgets_browser.py renders one snapshot both ways in
Chromium and compares lanes, bars, colours and labels.

No ``<script>`` and no stylesheet: everything is inline styles and SVG, which survives
notebook trust rules and HTML export alike. Charts stretch with the page the same way as
the live ones (fixed viewBox, ``preserveAspectRatio="none"``, non-scaling strokes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from nbcluster.widgets._curves import render_curves
from nbcluster.widgets._format import format_bytes, format_duration, prefix_color
from nbcluster.widgets._theme import TEXT, THEME, VARS, css


def _div(style: str, inner: str, attrs: str = "") -> str:
    return f'<div{attrs} style="{escape(style)}">{inner}</div>'


def _box(cls: str, inner: str, extra: str = "", styles: str = "box") -> str:
    return _div(css(styles), inner, f' class="{cls}"{extra}')


def _tally(counts: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """total, done, failed, running, and the percent finished (done or failed)."""
    total = max(0, int(counts.get("total") or 0))
    done = int(counts.get("done") or 0)
    failed = int(counts.get("failed") or 0)
    running = int(counts.get("running") or 0)
    return total, done, failed, running, (100 * (done + failed)) // total if total else 0


def progress_line(counts: Mapping[str, Any]) -> str:
    """The text under the progress bar (also the terminal bar's and text/plain's text).

    Parameters
    ----------
    counts : Mapping
        Decorated counts (`nbcluster.widgets._progress.decorate`).

    Returns
    -------
    str
        e.g. ``12 / 40 done (30%) · 2 failed · 3.1 items/s · ETA 9.0 s``.
    """
    total, done, failed, running, pct = _tally(counts)
    parts = [f"{done} / {total} done ({pct}%)"]
    if failed:
        parts.append(f"{failed} failed")
    if counts.get("cancelled"):
        parts.append(f"{counts['cancelled']} cancelled")
    if running:
        parts.append(f"{running} running")
    elif counts.get("pending"):
        parts.append(f"{counts['pending']} pending")
    rate = counts.get("rate")
    if rate:
        parts.append(f"{rate:.0f} items/s" if rate >= 10 else f"{rate:.1f} items/s")
    state = counts.get("state")
    if state == "running" and counts.get("eta") is not None:
        parts.append(f"ETA {format_duration(counts['eta'])}")
    if state and state != "running" and counts.get("elapsed") is not None:
        parts.append(f"{state} in {format_duration(counts['elapsed'])}")
    return " · ".join(parts)


def render_progress(counts: Mapping[str, Any]) -> str:
    """The frozen progress bar and its text, as HTML.

    Parameters
    ----------
    counts : Mapping
        Decorated counts.

    Returns
    -------
    str
        An HTML fragment with inline styles (no script).
    """
    total, done, failed, running, pct = _tally(counts)

    def seg(n: int, color: str, cls: str) -> str:
        width = f"{100 * n / total if total else 0:.3f}%"
        return _div(css("", width=width, background=color), "", f' class="{cls}"')

    bar = _div(
        css("bar"),
        seg(done, VARS["done"], "nbc-done") + seg(failed, VARS["error"], "nbc-failed")
        + seg(running, VARS["running"], "nbc-running"),
    )  # fmt: skip
    label = counts.get("label")
    label_html = f'<b style="{escape(css("progressLabel"))}">{escape(str(label))}</b>' if label else ""
    text = _div(css("progressText"), label_html + escape(progress_line(counts)), ' class="nbc-progress-text"')
    data = f' data-done="{done}" data-failed="{failed}" data-total="{total}" data-percent="{pct}"'
    if counts.get("state"):
        data += f' data-state="{escape(str(counts["state"]))}"'
    return _box("nbc-progress", bar + text, data)


def render_grid(grid: Mapping[str, Any]) -> str:
    """The grid table of a ``--grid`` run, as HTML.

    Parameters
    ----------
    grid : Mapping
        A ranked grid (`nbcluster.widgets._progress.rank_grid`).

    Returns
    -------
    str
        An HTML table; "" without rows.
    """
    rows = grid.get("rows") or []
    if not rows:
        return ""
    params = list(grid.get("params") or [])
    th = escape(css("th"))
    head = "<tr>" + "".join(f'<th style="{th}">{escape(str(p))}</th>' for p in [*params, "result"]) + "</tr>"
    body = []
    td = escape(css("td"))
    for r in rows:
        cells = "".join(
            f'<td style="{td}">{escape(str((r.get("params") or {}).get(p)))}</td>' for p in params
        )
        value_css = css("value valueError" if r.get("status") == "error" else "value")
        value = "…" if r.get("value") is None else str(r["value"])
        cells += f'<td style="{escape(value_css)}">{escape(value)}</td>'
        body.append(f'<tr class="nbc-grid-row">{cells}</tr>')
    table = f'<table style="{escape(css("table"))}"><tbody>{head}{"".join(body)}</tbody></table>'
    total = grid.get("total")
    which = "best" if grid.get("ranked") else "first"
    more = _div(css("note"), f"{which} {len(rows)} of {total}") if total and total > len(rows) else ""
    return _box("nbc-grid", table + more)


def _natural(text: str) -> tuple[Any, ...]:
    # Numeric-aware, like localeCompare(..., {numeric: true}) in graphs.js.
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _split_digits(text))


def _by_name(view: Mapping[str, Any]) -> list[str]:
    workers = view.get("workers") or {}
    return sorted(workers, key=lambda a: _natural(str(workers[a]["name"])))


def _split_digits(text: str) -> list[str]:
    parts: list[str] = []
    for ch in text:
        if parts and parts[-1][-1].isdigit() == ch.isdigit():
            parts[-1] += ch
        else:
            parts.append(ch)
    return parts


def _label(view: Mapping[str, Any], addr: str) -> str:
    w = view["workers"][addr]
    return f"{w['name']} ({TEXT['simulated']})" if (w.get("gpu") or {}).get("simulated") else str(w["name"])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def host_of(addr: str) -> str:
    """``"tls://10.0.0.1:8786"`` -> ``"10.0.0.1"`` (graphs.js's hostOf).

    Parameters
    ----------
    addr : str
        A worker's address.

    Returns
    -------
    str
        Its host.
    """
    return re.sub(r":\d+$", "", re.sub(r"^[a-z0-9+.-]+://", "", str(addr), flags=re.I))


def _worker_count(view: Mapping[str, Any]) -> int:
    summary = view.get("summary")
    return int(summary["workers"]) if summary else len(view.get("workers") or {})


def lane_groups(
    view: Mapping[str, Any], tasks: list[Mapping[str, Any]], start: float
) -> list[dict[str, Any]]:
    """The task stream's lanes, grouped as graphs.js's laneGroups does (see there).

    Parameters
    ----------
    view : Mapping
        A metrics window's view (`nbcluster.metrics.feed.MetricsWindow.to_view`).
    tasks : list of Mapping
        The task records shown.
    start : float
        The time at the stream's left edge.

    Returns
    -------
    list of dict
        One per lane: a worker, a host, the busiest workers and "others", or departed ones.
    """
    g = THEME["stream"]
    max_lanes: int = g["maxLanes"]
    max_rows: int = g["maxRows"]
    workers = view.get("workers") or {}

    def rows(n: int) -> int:
        return min(max_rows, max(1, n))

    def threads(a: str) -> int:
        return int((workers.get(a) or {}).get("nthreads") or 1)

    def one(a: str) -> dict[str, Any]:
        return {"key": a, "worker": a, "label": _label(view, a), "workers": {a}, "rows": rows(threads(a))}

    known = _by_name(view)
    total = _worker_count(view)
    if total <= max_lanes and len(known) == total:
        lanes = [one(a) for a in known]
        gone = [a for a in dict.fromkeys(t["worker"] for t in tasks) if a not in workers]
        if gone:
            lanes.append(
                {
                    "key": "departed",
                    "label": _plural(len(gone), TEXT["departed"]),
                    "workers": set(gone),
                    "rows": 1,
                }
            )
        return lanes
    hosts: dict[str, int] = {}
    for a in known:
        hosts[host_of(a)] = hosts.get(host_of(a), 0) + 1
    summary = view.get("summary") or {}
    for h in summary.get("hosts") or ():
        hosts[h["host"]] = h["workers"]
    if 1 < len(hosts) <= max_lanes and not summary.get("more_hosts"):
        return [
            {"key": f"host:{h}", "label": f"{h} ({_plural(hosts[h], TEXT['worker'])})", "host": h,
             "workers": None, "rows": rows(hosts[h])}
            for h in sorted(hosts, key=_natural)
        ]  # fmt: skip
    busy: dict[str, float] = {}
    for t in tasks:
        busy[t["worker"]] = busy.get(t["worker"], 0) + (t["stop"] - max(t["start"], start))
    shown = sorted(known, key=lambda a: -busy.get(a, 0))[: max_lanes - 1]
    lanes = [one(a) for a in shown]
    lanes.append(
        {
            "key": "others",
            "label": _plural(total - len(shown), TEXT["other"]),
            "workers": None,
            "rows": max_rows,
        }
    )
    return lanes


def _svg(width: int, height: int, css_height: str, inner: str, styles: str = "chart") -> str:
    style = escape(css(styles, height=css_height))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'preserveAspectRatio="none" style="{style}">{inner}</svg>'
    )


# -- task stream (the units of graphs.js's renderTaskStream) --------------------------------


def _time_span(view: Mapping[str, Any], window: float | None) -> tuple[float, float]:
    tasks = view.get("tasks") or ()
    end = max([view.get("now") or 0.0, *(t["stop"] for t in tasks)])
    start = min(t["start"] for t in tasks) if tasks else end - 1
    if window is not None and end - start > window:
        start = end - window
    return start, max(end - start, 1e-3)


def _visible_tasks(view: Mapping[str, Any], start: float) -> list[Mapping[str, Any]]:
    shown = [t for t in view.get("tasks") or () if t["stop"] >= start]
    cap = THEME["stream"]["maxBars"]
    return sorted(shown, key=lambda t: t["stop"])[-cap:] if len(shown) > cap else shown


def _tasks_by_lane(
    lanes: list[dict[str, Any]], tasks: list[Mapping[str, Any]]
) -> list[list[Mapping[str, Any]]]:
    out: list[list[Mapping[str, Any]]] = [[] for _ in lanes]
    rest = next((i for i, lane in enumerate(lanes) if lane["workers"] is None and not lane.get("host")), -1)
    for t in tasks:
        i = next(
            (
                i for i, lane in enumerate(lanes)
                if (host_of(t["worker"]) == lane["host"] if lane.get("host") else t["worker"] in (lane["workers"] or ()))
            ),
            rest,
        )  # fmt: skip
        if i >= 0:
            out[i].append(t)
    for tasks_ in out:
        tasks_.sort(key=lambda t: t["start"])
    return out


def _pack_rows(tasks: list[Mapping[str, Any]], nthreads: int) -> list[int]:
    row_end = [-math.inf] * nthreads
    rows = []
    for t in tasks:
        row = next((i for i, e in enumerate(row_end) if e <= t["start"]), nthreads - 1)
        row_end[row] = t["stop"]
        rows.append(row)
    return rows


def _task_bar(t: Mapping[str, Any], row: int, start: float, span: float, who: str) -> str:
    g = THEME["stream"]
    failed = t.get("status") == "error"
    t0 = max(t["start"], start)
    x = (t0 - start) / span * g["width"]
    w = max((t["stop"] - t0) / span * g["width"], g["minBar"])
    fill = VARS["error"] if failed else prefix_color(t["prefix"])
    tip = f"{t['prefix']} on {who}: {format_duration(t['stop'] - t['start'])}" + (
        " (failed)" if failed else ""
    )
    return (
        f'<rect class="{"nbc-task-error" if failed else "nbc-task"}" x="{x:.2f}" y="{row * g["rowHeight"] + 1}" '
        f'width="{w:.2f}" height="{g["rowHeight"] - 2}" style="fill:{fill}"><title>{escape(tip)}</title></rect>'
    )


def _lane(group: Mapping[str, Any], tasks: list[Mapping[str, Any]], start: float, span: float) -> str:
    g = THEME["stream"]
    n = group["rows"]
    who = group["label"]
    bars = "".join(
        _task_bar(t, row, start, span, who) for t, row in zip(tasks, _pack_rows(tasks, n), strict=True)
    )
    pixels = f"{max(g['minPixels'], n * g['rowPixels'])}px"
    svg = _svg(g["width"], n * g["rowHeight"], pixels, bars, "chart laneChart")
    data = (
        f'data-worker="{escape(group["worker"])}"'
        if group.get("worker")
        else f'data-lane="{escape(group["key"])}"'
    )
    return _div(css("lane"), _div(css("label laneLabel"), escape(who)) + svg, f' class="nbc-lane" {data}')


def render_task_stream(view: Mapping[str, Any], window: float | None = None) -> str:
    """The frozen task stream, one lane per worker (or group), as HTML and SVG.

    Parameters
    ----------
    view : Mapping
        A metrics window's view.
    window : float, optional
        Seconds shown; None shows the whole run.

    Returns
    -------
    str
        An HTML fragment (a note instead where the scheduler has no nbcluster plugin).
    """
    if view.get("basic"):
        # The scheduler's own view has workers but no task records: say why, not empty lanes.
        return _box("nbc-stream", _div(css("note"), escape(TEXT["noPlugin"])))
    start, span = _time_span(view, window)
    shown = _visible_tasks(view, start)
    lanes = lane_groups(view, shown, start)
    out = [
        _lane(group, tasks, start, span)
        for group, tasks in zip(lanes, _tasks_by_lane(lanes, shown), strict=True)
    ]
    if not lanes:
        out.append(_div(css("note"), escape(TEXT["noWorkers"])))
    ends = f"<span>-{escape(format_duration(span))}</span><span>{escape(TEXT['frozenEnd'])}</span>"
    out.append(_div(css("axis"), ends))
    return _box("nbc-stream", "".join(out))


# -- resources ------------------------------------------------------------------------------


def _points(values: Iterable[tuple[float, float]], t0: float, t1: float, vmax: float) -> list[tuple[float, float]]:
    """``(time, value)`` pairs as a sparkline's points: time across from `t0` to `t1`, value
    up to `vmax` (clamped there); a lone point gets a short run before it, so that it shows."""
    W, H = THEME["spark"]["width"], THEME["spark"]["height"]
    span = max(t1 - t0, 1e-3)
    xy = [((t - t0) / span * W, H - min(v, vmax) / vmax * (H - 2)) for t, v in values]
    if len(xy) == 1:
        xy.insert(0, (max(0.0, xy[0][0] - 4), xy[0][1]))
    return xy


def _svg_points(xy: Iterable[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)


def _area_under(area: str, line: str, color: str) -> str:
    """A chart's shaded `area` (polygon points) and its `line` (polyline points) in `color`."""
    return (
        f'<polygon points="{area}" style="{escape(css("area", fill=color))}"/>'
        f'<polyline points="{line}" vector-effect="non-scaling-stroke" style="{escape(css("line", stroke=color))}"/>'
    )


def _sparkline(
    series: Iterable[Mapping[str, Any]], key: str, t0: float, t1: float, vmax: float, color: str
) -> str:
    W, H = THEME["spark"]["width"], THEME["spark"]["height"]
    pts = [r for r in series if r["time"] >= t0 and r.get(key) is not None]
    inner = ""
    if pts:
        xy = _points(((r["time"], r[key]) for r in pts), t0, t1, vmax)
        line = _svg_points(xy)
        inner = _area_under(f"{xy[0][0]:.1f},{H} {line} {xy[-1][0]:.1f},{H}", line, color)
    return _svg(W, H, THEME["spark"]["pixels"], inner)


def _chart_cell(label: str, svg: str) -> str:
    return _div(css("cell"), _div(css("label"), escape(label)) + svg)


def _gpu_cell(series: list[Mapping[str, Any]], last: Mapping[str, Any], t0: float, t1: float) -> str:
    if last.get("gpu_util") is None:
        return _div(css("note middle"), escape(TEXT["noGpu"]))
    gpu = f"GPU {round(last['gpu_util'])}%"
    if last.get("gpu_memory") is not None:
        gpu += f" · {format_bytes(last['gpu_memory'])}"
        if last.get("gpu_memory_total"):
            gpu += f" / {format_bytes(last['gpu_memory_total'])}"
    return _chart_cell(gpu, _sparkline(series, "gpu_util", t0, t1, 100, VARS["gpu"]))


def _bandline(bands: list[Mapping[str, Any]], key: str, t0: float, t1: float, vmax: float, color: str) -> str:
    W, H = THEME["spark"]["width"], THEME["spark"]["height"]
    pts = [b for b in bands if b["time"] >= t0 and b.get(key)]
    inner = ""
    if pts:

        def line(i: int) -> list[tuple[float, float]]:  # a band is (low, middle, high)
            return _points(((b["time"], b[key][i]) for b in pts), t0, t1, vmax)

        inner = _area_under(_svg_points(line(2) + line(0)[::-1]), _svg_points(line(1)), color)
    return _svg(W, H, THEME["spark"]["pixels"], inner)


def _band_label(name: str, spread: list[float] | None, fmt: Any) -> str:
    return f"{name} {fmt(spread[1])} ({fmt(spread[0])}\u2013{fmt(spread[2])})" if spread else f"{name} ?"


def _pct(v: float) -> str:
    return f"{math.floor(v + 0.5)}%"  # Math.round


def _render_bands(view: Mapping[str, Any], window: float | None) -> str:
    bands = list(view.get("bands") or ())
    any_gpu = any(b.get("gpu_util") for b in bands)
    t1 = view.get("now") or 0.0
    t0 = max(t1 - (math.inf if window is None else window), min(t1 - 1, bands[0]["time"]))
    last = bands[-1]
    label = f"{_plural(_worker_count(view), TEXT['worker'])} ({TEXT['spread']})"
    cells = [_div(css("label middle"), escape(label), ' class="nbc-resource-band"')]
    cpu_max = max([100, *(b["cpu"][2] if b.get("cpu") else 0 for b in bands)])
    cells.append(
        _chart_cell(
            _band_label("CPU", last.get("cpu"), _pct), _bandline(bands, "cpu", t0, t1, cpu_max, VARS["cpu"])
        )
    )
    mem_max = max(
        [1, *(max(b["memory"][2] if b.get("memory") else 0, b.get("memory_limit") or 0) for b in bands)]
    )
    cells.append(
        _chart_cell(
            _band_label("Mem", last.get("memory"), format_bytes),
            _bandline(bands, "memory", t0, t1, mem_max, VARS["memory"]),
        )
    )
    if any_gpu:
        cells.append(
            _chart_cell(
                _band_label("GPU", last.get("gpu_util"), _pct),
                _bandline(bands, "gpu_util", t0, t1, 100, VARS["gpu"]),
            )
        )
    return _box(
        "nbc-resources", "".join(cells), styles="box resources resourcesGpu" if any_gpu else "box resources"
    )


def render_resources(view: Mapping[str, Any], window: float | None = None) -> str:
    """The frozen CPU and memory (and GPU) charts: per worker, or bands past a few workers.

    Parameters
    ----------
    view : Mapping
        A metrics window's view.
    window : float, optional
        Seconds of samples shown.

    Returns
    -------
    str
        An HTML fragment with inline SVG.
    """
    if view.get("bands") and _worker_count(view) > THEME["resources"]["maxWorkers"]:
        return _render_bands(view, window)
    workers = view.get("workers") or {}
    samples = view.get("samples") or {}
    addrs = _by_name(view)
    any_gpu = any(
        (workers.get(a) or {}).get("gpu") or any("gpu_util" in r for r in samples.get(a, ())) for a in addrs
    )
    t1 = view.get("now") or 0.0
    # Fit young histories to the width rather than leave most of each chart blank.
    firsts = [samples[a][0]["time"] for a in addrs if samples.get(a)]
    t0 = max(t1 - (math.inf if window is None else window), min([t1 - 1, *firsts]))
    cells = []
    for addr in addrs:
        w = workers.get(addr) or {}
        series = list(samples.get(addr, ()))
        last = series[-1] if series else {}
        cells.append(
            _div(
                css("label middle"),
                escape(_label(view, addr)),
                f' class="nbc-resource-worker" data-worker="{escape(addr)}"',
            )
        )
        cpu_max = max([100 * (w.get("nthreads") or 1), *(r.get("cpu") or 0 for r in series)])
        cpu = "?" if last.get("cpu") is None else f"{round(last['cpu'])}"
        cells.append(_chart_cell(f"CPU {cpu}%", _sparkline(series, "cpu", t0, t1, cpu_max, VARS["cpu"])))
        limit = last.get("memory_limit") or w.get("memory_limit") or 0
        mem_max = max([limit, *(r.get("memory") or 0 for r in series), 1])
        mem = f"Mem {format_bytes(last.get('memory'))}" + (f" / {format_bytes(limit)}" if limit else "")
        cells.append(_chart_cell(mem, _sparkline(series, "memory", t0, t1, mem_max, VARS["memory"])))
        if any_gpu:
            cells.append(_gpu_cell(series, last, t0, t1))
    return _box(
        "nbc-resources", "".join(cells), styles="box resources resourcesGpu" if any_gpu else "box resources"
    )


def render_html(
    counts: Mapping[str, Any] | None,
    view: Mapping[str, Any] | None,
    grid: Mapping[str, Any] | None = None,
    *,
    window: float | None = None,
    resource_window: float | None = None,
    curves: Mapping[str, Any] | None = None,
) -> str:
    """The whole frozen widget: progress, grid table, curves, task stream and worker charts.

    Parameters
    ----------
    counts : Mapping or None
        Decorated counts; None for a status view (no progress bar).
    view : Mapping or None
        A metrics window's view; None draws no stream and no charts.
    grid : Mapping, optional
        A ranked grid.
    window : float, optional
        Seconds of task stream shown.
    resource_window : float, optional
        Seconds of worker charts shown.
    curves : Mapping, optional
        A trial run's curves (`nbcluster.widgets._curves`).

    Returns
    -------
    str
        HTML and inline SVG, no script: what a saved notebook keeps.
    """
    parts = []
    if counts and counts.get("total") is not None:
        parts.append(render_progress(counts))
    if grid:
        parts.append(render_grid(grid))
    if curves and curves.get("series"):
        parts.append(render_curves(curves))
    if view and (view.get("workers") or view.get("tasks")):
        parts.append(_div(css("heading"), escape(TEXT["tasks"])) + render_task_stream(view, window))
        parts.append(_div(css("heading"), escape(TEXT["workers"])) + render_resources(view, resource_window))
    return _div(css("live"), "".join(parts), ' class="nbc-live nbc-static"')
