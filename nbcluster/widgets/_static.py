"""The frozen picture: the live widget's final state as script-free HTML + inline SVG.

A saved notebook reopened without its kernel, nbconvert's HTML, and GitHub's viewer can
show no widget, only what the output's mimebundle holds. So when a run ends the widget's
output is replaced by this HTML, drawn from the same data and with the same layout, CSS
variables (with fallbacks) and colours as ``static/graphs.js``; keep the two in step.

No ``<script>`` and no stylesheet: everything is inline styles and SVG, which survives
notebook trust rules and HTML export alike. Charts stretch with the page the same way as
the live ones (fixed viewBox, ``preserveAspectRatio="none"``, non-scaling strokes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

C = {
    "fg": "var(--jp-ui-font-color1, #1f1f1f)",
    "fg2": "var(--jp-ui-font-color2, #616161)",
    "border": "var(--jp-border-color2, #d0d0d0)",
    "track": "var(--jp-layout-color2, #eeeeee)",
    "done": "var(--jp-success-color1, #388e3c)",
    "error": "var(--jp-error-color1, #d32f2f)",
    "running": "var(--jp-brand-color2, #64b5f6)",
    "cpu": "var(--jp-brand-color1, #1976d2)",
    "memory": "var(--jp-warn-color1, #f57c00)",
    "gpu": "var(--jp-success-color1, #388e3c)",
    "font": "var(--jp-ui-font-family, system-ui, -apple-system, 'Segoe UI', sans-serif)",
    "fontSize": "var(--jp-ui-font-size1, 13px)",
    "small": "var(--jp-ui-font-size0, 11px)",
}


def prefix_color(prefix: str) -> str:
    """The colour graphs.js gives `prefix` (FNV-1a over UTF-16 code units, hue 30..330)."""
    h = 2166136261
    data = str(prefix).encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 16777619) & 0xFFFFFFFF
    return f"hsl({30 + h % 300}, 55%, 55%)"


def format_bytes(n: float | None) -> str:
    if n is None or not math.isfinite(n):
        return "?"
    units = ["B", "kB", "MB", "GB", "TB"]
    i, v = 0, abs(n)
    while v >= 1000 and i < len(units) - 1:
        v /= 1000
        i += 1
    return f"{v:.0f} {units[i]}" if v >= 100 or i == 0 else f"{v:.1f} {units[i]}"


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{round(s)} s"
    if s < 3600:
        return f"{int(s // 60)} min {round(s % 60)} s"
    return f"{int(s // 3600)} h {round((s % 3600) / 60)} min"


def _style(**props: str) -> str:
    css = ";".join(f"{k.replace('_', '-')}:{v}" for k, v in props.items())
    return f'style="{escape(css)}"'


def _box(cls: str, inner: str, extra: str = "") -> str:
    return (
        f'<div class="{cls}" {extra} '
        f"{_style(font_family=C['font'], font_size=C['small'], color=C['fg'], margin='4px 0')}>"
        f"{inner}</div>"
    )


def progress_line(counts: Mapping[str, Any]) -> str:
    """The text under the progress bar (also the terminal bar's and text/plain's text)."""
    total = max(0, int(counts.get("total") or 0))
    done = int(counts.get("done") or 0)
    failed = int(counts.get("failed") or 0)
    running = int(counts.get("running") or 0)
    pct = (100 * (done + failed)) // total if total else 0
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
    total = max(0, int(counts.get("total") or 0))
    done = int(counts.get("done") or 0)
    failed = int(counts.get("failed") or 0)
    running = int(counts.get("running") or 0)
    pct = (100 * (done + failed)) // total if total else 0

    def seg(n: int, color: str, cls: str) -> str:
        width = f"{100 * n / total if total else 0:.3f}%"
        return f'<div class="{cls}" {_style(width=width, background=color)}></div>'

    bar = (
        f"<div {_style(display='flex', height='10px', background=C['track'], border_radius='2px', overflow='hidden')}>"
        + seg(done, C["done"], "nbc-done")
        + seg(failed, C["error"], "nbc-failed")
        + seg(running, C["running"], "nbc-running")
        + "</div>"
    )
    label = counts.get("label")
    label_html = f"<b {_style(margin_right='0.5em')}>{escape(str(label))}</b>" if label else ""
    text = (
        f'<div class="nbc-progress-text" {_style(margin_top="2px", font_size=C["fontSize"])}>'
        f"{label_html}{escape(progress_line(counts))}</div>"
    )
    data = f'data-done="{done}" data-failed="{failed}" data-total="{total}" data-percent="{pct}"'
    if counts.get("state"):
        data += f' data-state="{escape(str(counts["state"]))}"'
    return _box("nbc-progress", bar + text, data)


def render_grid(grid: Mapping[str, Any]) -> str:
    rows = grid.get("rows") or []
    if not rows:
        return ""
    params = list(grid.get("params") or [])
    th = _style(
        text_align="left", padding="1px 8px", border_bottom=f"1px solid {C['border']}", color=C["fg2"]
    )
    head = "<tr>" + "".join(f"<th {th}>{escape(str(p))}</th>" for p in [*params, "result"]) + "</tr>"
    body = []
    for r in rows:
        cells = "".join(
            f"<td {_style(padding='1px 8px')}>{escape(str((r.get('params') or {}).get(p)))}</td>"
            for p in params
        )
        color = C["error"] if r.get("status") == "error" else C["fg"]
        value = "…" if r.get("value") is None else str(r["value"])
        cells += f"<td {_style(padding='1px 8px', font_family='var(--jp-code-font-family, monospace)', color=color)}>{escape(value)}</td>"
        body.append(f'<tr class="nbc-grid-row">{cells}</tr>')
    table = f"<table {_style(border_collapse='collapse', font_size=C['small'])}>{head}{''.join(body)}</table>"
    total = grid.get("total")
    more = (
        f"<div {_style(color=C['fg2'])}>best {len(rows)} of {total}</div>"
        if total and total > len(rows)
        else ""
    )
    return _box("nbc-grid", table + more)


def _lane_order(view: Mapping[str, Any]) -> list[str]:
    workers = view.get("workers") or {}
    addrs = dict.fromkeys(workers)
    for t in view.get("tasks") or ():
        addrs.setdefault(t["worker"])

    def key(a: str) -> tuple[Any, ...]:
        name = str(workers[a]["name"]) if a in workers else a
        # Numeric-aware, like localeCompare(..., {numeric: true}) in graphs.js.
        return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _split_digits(name))

    return sorted(addrs, key=key)


def _split_digits(text: str) -> list[str]:
    parts: list[str] = []
    for ch in text:
        if parts and parts[-1][-1].isdigit() == ch.isdigit():
            parts[-1] += ch
        else:
            parts.append(ch)
    return parts


def _label(view: Mapping[str, Any], addr: str) -> str:
    w = (view.get("workers") or {}).get(addr)
    if not w:
        return f"{addr} (gone)"
    return f"{w['name']} (simulated GPU)" if (w.get("gpu") or {}).get("simulated") else str(w["name"])


def _svg(width: int, height: int, css_height: str, inner: str, extra_style: str = "") -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
        f'style="width:100%;height:{css_height};display:block;background:{C["track"]};{extra_style}">{inner}</svg>'
    )


def render_task_stream(view: Mapping[str, Any], window: float | None = None) -> str:
    tasks = list(view.get("tasks") or ())
    workers = view.get("workers") or {}
    lanes = _lane_order(view)
    end = max([view.get("now") or 0.0, *(t["stop"] for t in tasks)])
    start = min(t["start"] for t in tasks) if tasks else end - 1
    if window is not None and end - start > window:
        start = end - window
    span = max(end - start, 1e-3)
    W = 1000
    by_worker: dict[str, list[Mapping[str, Any]]] = {}
    for t in tasks:
        if t["stop"] >= start:
            by_worker.setdefault(t["worker"], []).append(t)
    out = []
    for addr in lanes:
        nthreads = max(1, int((workers.get(addr) or {}).get("nthreads") or 1))
        row_end = [-math.inf] * nthreads
        row_h = 10
        rects = []
        for t in sorted(by_worker.get(addr, ()), key=lambda t: t["start"]):
            row = next((i for i, e in enumerate(row_end) if e <= t["start"]), nthreads - 1)
            row_end[row] = t["stop"]
            t0 = max(t["start"], start)
            x = (t0 - start) / span * W
            w = max((t["stop"] - t0) / span * W, 1.5)
            failed = t.get("status") == "error"
            fill = C["error"] if failed else prefix_color(t["prefix"])
            tip = f"{t['prefix']} on {_label(view, addr)}: {format_duration(t['stop'] - t['start'])}"
            tip += " (failed)" if failed else ""
            rects.append(
                f'<rect class="{"nbc-task-error" if failed else "nbc-task"}" x="{x:.2f}" y="{row * row_h + 1}" '
                f'width="{w:.2f}" height="{row_h - 2}" style="fill:{fill}"><title>{escape(tip)}</title></rect>'
            )
        svg = _svg(
            W, nthreads * row_h, f"{max(12, nthreads * 8)}px", "".join(rects), "flex:1 1 auto;min-width:0"
        )
        label_style = _style(
            width="7em",
            flex="none",
            overflow="hidden",
            text_overflow="ellipsis",
            white_space="nowrap",
            color=C["fg2"],
        )
        out.append(
            f'<div class="nbc-lane" data-worker="{escape(addr)}" {_style(display="flex", align_items="center", gap="6px", margin="2px 0")}>'
            f"<div {label_style}>{escape(_label(view, addr))}</div>{svg}</div>"
        )
    if not lanes:
        out.append(f"<div {_style(color=C['fg2'])}>no workers</div>")
    axis_style = _style(
        display="flex", justify_content="space-between", color=C["fg2"], margin_left="calc(7em + 6px)"
    )
    out.append(f"<div {axis_style}><span>-{escape(format_duration(span))}</span><span>end</span></div>")
    return _box("nbc-stream", "".join(out))


def _sparkline(
    series: Iterable[Mapping[str, Any]], key: str, t0: float, t1: float, vmax: float, color: str
) -> str:
    W, H = 300, 40
    pts = [r for r in series if r["time"] >= t0 and r.get(key) is not None]
    inner = ""
    if pts:
        span = max(t1 - t0, 1e-3)
        xy = [((r["time"] - t0) / span * W, H - min(r[key], vmax) / vmax * (H - 2)) for r in pts]
        if len(xy) == 1:
            xy.insert(0, (max(0.0, xy[0][0] - 4), xy[0][1]))
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        inner = (
            f'<polygon points="{xy[0][0]:.1f},{H} {line} {xy[-1][0]:.1f},{H}" style="fill:{color};fill-opacity:0.25;stroke:none"/>'
            f'<polyline points="{line}" vector-effect="non-scaling-stroke" style="fill:none;stroke:{color};stroke-width:1.5"/>'
        )
    return _svg(W, H, "26px", inner)


def _chart_cell(label: str, svg: str) -> str:
    label_style = _style(color=C["fg2"], white_space="nowrap", overflow="hidden", text_overflow="ellipsis")
    return f"<div {_style(min_width='0')}><div {label_style}>{escape(label)}</div>{svg}</div>"


def render_resources(view: Mapping[str, Any], window: float = 60.0) -> str:
    workers = view.get("workers") or {}
    samples = view.get("samples") or {}
    addrs = [a for a in _lane_order(view) if a in workers or a in samples]
    any_gpu = any(
        (workers.get(a) or {}).get("gpu") or any("gpu_util" in r for r in samples.get(a, ())) for a in addrs
    )
    t1 = view.get("now") or 0.0
    # Fit young histories to the width rather than leave most of each chart blank.
    firsts = [samples[a][0]["time"] for a in addrs if samples.get(a)]
    t0 = max(t1 - window, min([t1 - 1, *firsts]))
    cells = []
    for addr in addrs:
        w = workers.get(addr) or {}
        series = list(samples.get(addr, ()))
        last = series[-1] if series else {}
        name_style = _style(
            color=C["fg2"],
            overflow="hidden",
            text_overflow="ellipsis",
            white_space="nowrap",
            align_self="center",
        )
        cells.append(
            f'<div class="nbc-resource-worker" data-worker="{escape(addr)}" {name_style}>{escape(_label(view, addr))}</div>'
        )
        cpu_max = max([100 * (w.get("nthreads") or 1), *(r.get("cpu") or 0 for r in series)])
        cpu = "?" if last.get("cpu") is None else f"{round(last['cpu'])}"
        cells.append(_chart_cell(f"CPU {cpu}%", _sparkline(series, "cpu", t0, t1, cpu_max, C["cpu"])))
        limit = last.get("memory_limit") or w.get("memory_limit") or 0
        mem_max = max([limit, *(r.get("memory") or 0 for r in series), 1])
        mem = f"Mem {format_bytes(last.get('memory'))}" + (f" / {format_bytes(limit)}" if limit else "")
        cells.append(_chart_cell(mem, _sparkline(series, "memory", t0, t1, mem_max, C["memory"])))
        if any_gpu:
            if last.get("gpu_util") is not None:
                gpu = f"GPU {round(last['gpu_util'])}%"
                if last.get("gpu_memory") is not None:
                    gpu += f" · {format_bytes(last['gpu_memory'])}"
                    if last.get("gpu_memory_total"):
                        gpu += f" / {format_bytes(last['gpu_memory_total'])}"
                cells.append(_chart_cell(gpu, _sparkline(series, "gpu_util", t0, t1, 100, C["gpu"])))
            else:
                cells.append(f"<div {_style(color=C['fg2'], align_self='center')}>no GPU</div>")
    columns = "7em 1fr 1fr 1fr" if any_gpu else "7em 1fr 1fr"
    grid_style = _style(
        display="grid", grid_template_columns=columns, gap="2px 8px", align_items="end",
        font_family=C["font"], font_size=C["small"], color=C["fg"], margin="4px 0",
    )  # fmt: skip
    return f'<div class="nbc-resources" {grid_style}>{"".join(cells)}</div>'


def _heading(title: str) -> str:
    style = _style(
        color=C["fg2"], font_family=C["font"], font_size=C["small"],
        text_transform="uppercase", letter_spacing="0.04em", margin_top="6px",
    )  # fmt: skip
    return f"<div {style}>{escape(title)}</div>"


def render_html(
    counts: Mapping[str, Any] | None,
    view: Mapping[str, Any] | None,
    grid: Mapping[str, Any] | None = None,
    *,
    window: float | None = None,
    resource_window: float = 60.0,
) -> str:
    """The whole frozen widget: progress, grid table, task stream and worker charts."""
    parts = []
    if counts and counts.get("total") is not None:
        parts.append(render_progress(counts))
    if grid:
        parts.append(render_grid(grid))
    if view and (view.get("workers") or view.get("tasks")):
        parts.append(_heading("Tasks") + render_task_stream(view, window))
        parts.append(_heading("Workers") + render_resources(view, resource_window))
    return f'<div class="nbc-live nbc-static" {_style(padding="4px 0", max_width="1100px")}>{"".join(parts)}</div>'
