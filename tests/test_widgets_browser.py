"""One drawing, checked in a real Chromium: graphs.js (the live widget, the sidebar) and
_static.py (the frozen picture of a saved notebook) draw the same snapshot alike, and every
label they write reads well in JupyterLab's light and dark themes.

The page is the real theme CSS of the installed JupyterLab (its ``--jp-*`` variables) and
graphs.js with theme.json, loaded as the widget's ESM loads it; no Jupyter server needed.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from nbcluster.widgets._static import render_html
from nbcluster.widgets._theme import STATIC, inline_theme
from tests.browser_helpers import CONTRAST, MIN_CONTRAST, launch_chromium
from tests.drawing_helpers import COUNTS, GRID, W0, W1, snapshot

THEMES = Path(sys.prefix) / "share" / "jupyter" / "lab" / "themes" / "@jupyterlab"
PARTS = (".nbc-progress", ".nbc-grid", ".nbc-stream", ".nbc-resources")

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>{theme}</style>
<style>body {{ background: var({background}); margin: 8px; width: 900px; }}</style></head>
<body><div id="frozen">{frozen}</div><div id="live"></div></body></html>"""

# Draw the same data with graphs.js into #live, in the frozen picture's order.
DRAW_LIVE = """([counts, grid, view, resourceWindow, end]) => {
  const live = document.getElementById("live");
  const part = () => live.appendChild(document.createElement("div"));
  G.renderProgress(part(), counts);
  G.renderGrid(part(), grid);
  G.renderTaskStream(part(), view, { window: null, end });
  G.renderResources(part(), view, { window: resourceWindow });
}"""

# What a reader sees of each element: its structure, text, geometry and computed colours.
DESCRIBE = """(root) => {
  const props = ["color", "backgroundColor", "fill", "stroke", "fontSize", "fontFamily", "fontWeight",
    "display", "width", "height", "marginLeft", "gridTemplateColumns", "opacity", "fillOpacity",
    "whiteSpace", "textOverflow", "borderBottomColor"];
  const attrs = ["class", "data-worker", "data-lane", "data-percent", "data-state", "data-done", "data-failed",
    "data-total", "x", "y", "width", "height", "viewBox", "points", "preserveAspectRatio"];
  const out = [];
  for (const el of [root, ...root.querySelectorAll("*")]) {
    const cs = getComputedStyle(el);
    const own = [...el.childNodes].filter((n) => n.nodeType === 3).map((n) => n.data).join("");
    out.push({ tag: el.tagName.toLowerCase(), text: own,
      attrs: Object.fromEntries(attrs.map((a) => [a, el.getAttribute(a)])),
      style: Object.fromEntries(props.map((p) => [p, cs[p]])) });
  }
  return out;
}"""

def _module() -> str:
    graphs = inline_theme((STATIC / "graphs.js").read_text(encoding="utf-8"))
    return graphs + "\nwindow.G = { renderProgress, renderGrid, renderTaskStream, renderResources, THEME };\n"


@pytest.fixture  # per test: a module-wide sync Playwright keeps its loop running under
# pytest-jupyter's per-test loop fixture, which then fails to close it
def browser() -> Iterator[Any]:
    with sync_playwright() as p:
        b = launch_chromium(p)
        try:
            yield b
        finally:
            b.close()


def _open(browser: Any, theme: str, background: str, view: dict[str, Any] | None = None) -> Any:
    css = (THEMES / f"theme-{theme}-extension" / "index.css").read_text(encoding="utf-8")
    view = view or snapshot()
    frozen = render_html(COUNTS, view, GRID, window=None, resource_window=5.0)
    page = browser.new_page(viewport={"width": 1000, "height": 1400})
    page.set_content(PAGE.format(theme=css, background=background, frozen=frozen))
    page.add_script_tag(content=_module(), type="module")
    page.wait_for_function("window.G !== undefined")
    end = page.evaluate("G.THEME.text.frozenEnd")
    page.evaluate(DRAW_LIVE, [COUNTS, GRID, view, 5.0, end])
    return page


def _assert_drawn_alike(page: Any) -> None:
    for part in PARTS:
        live = page.locator(f"#live {part}").evaluate(DESCRIBE)
        frozen = page.locator(f"#frozen {part}").evaluate(DESCRIBE)
        assert len(live) == len(frozen), f"{part}: {len(live)} elements live, {len(frozen)} frozen"
        for a, b in zip(live, frozen, strict=True):
            assert a == b, f"{part} differs:\nlive   {json.dumps(a)}\nfrozen {json.dumps(b)}"


def test_live_and_frozen_pictures_draw_the_same_snapshot_alike(browser: Any) -> None:
    page = _open(browser, "light", "--jp-layout-color0")
    try:
        _assert_drawn_alike(page)
        # The comparison is only worth something if the picture holds what the data says.
        stream = page.locator("#frozen .nbc-stream")
        lanes = "ls => ls.map(l => l.dataset.worker || l.dataset.lane)"
        assert stream.locator(".nbc-lane").evaluate_all(lanes) == [W0, W1, "departed"]
        assert stream.locator(".nbc-task").count() == 5 and stream.locator(".nbc-task-error").count() == 1
        assert "2 (simulated GPU)" in stream.inner_text() and "1 departed worker" in stream.inner_text()
        fills = set(stream.locator(".nbc-task").evaluate_all("rs => rs.map(r => getComputedStyle(r).fill)"))
        assert len(fills) == 3  # one colour per prefix: inc, slow_inc, train
        assert "no GPU" in page.locator("#frozen .nbc-resources").inner_text()
        assert page.locator("#frozen .nbc-grid-row").count() == 3
    finally:
        page.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("background", ["--jp-layout-color0", "--jp-layout-color1"])  # notebook, sidebar
def test_every_label_keeps_a_readable_contrast(browser: Any, theme: str, background: str) -> None:
    page = _open(browser, theme, background)
    try:
        for root in ("#live", "#frozen"):
            measured = page.locator(root).evaluate(CONTRAST)
            assert len(measured) > 20, "the picture lost its labels"
            print(theme, background, root, "lowest contrast:", min(m["ratio"] for m in measured))
            poor = [m for m in measured if m["ratio"] < MIN_CONTRAST]
            assert not poor, f"{theme} theme, {root}: text below a {MIN_CONTRAST} contrast: {poor[:5]}"
    finally:
        page.close()


def test_the_schedulers_own_view_says_what_the_task_stream_needs(browser: Any) -> None:
    # A scheduler without nbcluster's plugin: workers and samples, no tasks (`basic`).
    page = _open(browser, "light", "--jp-layout-color0", {**snapshot(), "tasks": [], "basic": True})
    try:
        _assert_drawn_alike(page)
        stream = page.locator("#live .nbc-stream")
        assert stream.locator(".nbc-lane").count() == 0
        assert stream.inner_text() == page.evaluate("G.THEME.text.noPlugin")
        assert page.locator("#live .nbc-resources polyline").count() > 0
    finally:
        page.close()


def big_view(workers: int = 1000, hosts: int = 1, tasks: int = 4000, seed: int = 0) -> dict[str, Any]:
    """A synthetic snapshot of a large cluster, as the plugin serves it with ``detail=16``:
    the 16 busiest workers described, all of them summarised, resources as bands."""
    import random

    rnd = random.Random(seed)
    addrs = [f"tls://10.0.0.{1 + i % hosts}:{9000 + i}" for i in range(workers)]
    table = {
        a: {"name": str(i), "nthreads": 2, "memory_limit": 4 * 2**30, "resources": {}}
        for i, a in enumerate(addrs)
    }
    detailed = dict(list(table.items())[:16])
    records = []
    for _ in range(tasks):
        start = 100 + rnd.random() * 50
        records.append({"prefix": rnd.choice(["inc", "train"]), "worker": rnd.choice(addrs), "start": start,
                        "stop": start + rnd.random() * 3, "status": "error" if rnd.random() < 0.01 else "ok"})  # fmt: skip
    by_host: dict[str, int] = {}
    for a in addrs:
        host = a.split("//")[1].rsplit(":", 1)[0]
        by_host[host] = by_host.get(host, 0) + 1
    summary = {
        "workers": workers, "threads": 2 * workers, "processing": workers, "memory": workers * 2**30,
        "memory_limit": workers * 4 * 2**30, "more_hosts": max(0, len(by_host) - 20),
        "hosts": [{"host": h, "workers": n, "threads": 2 * n, "processing": n, "memory": n * 2**30,
                   "memory_limit": n * 4 * 2**30} for h, n in sorted(by_host.items())[:20]],
    }  # fmt: skip
    bands = [
        {"time": 100.0 + i + rnd.random() / 3, "workers": workers,
         "cpu": sorted(rnd.random() * 200 for _ in range(3)),
         "memory": sorted(rnd.random() * 3e9 for _ in range(3)), "memory_limit": 4 * 2**30}
        for i in range(60)
    ]  # fmt: skip
    return {
        "now": 160.0,
        "workers": detailed,
        "summary": summary,
        "tasks": records,
        "samples": {},
        "bands": bands,
    }


@pytest.mark.parametrize("hosts", [1, 10])
def test_a_thousand_workers_draw_a_bounded_picture(browser: Any, hosts: int) -> None:
    view = big_view(hosts=hosts)
    page = _open(browser, "light", "--jp-layout-color0", view)
    try:
        _assert_drawn_alike(page)
        stream = page.locator("#live .nbc-stream")
        lanes = stream.locator(".nbc-lane").evaluate_all(
            "ls => ls.map(l => l.dataset.worker || l.dataset.lane)"
        )
        if hosts == 1:  # the busiest 15 workers, then everyone else
            assert len(lanes) == 16 and lanes[-1] == "others"
            assert "985 other workers" in stream.inner_text()
        else:  # one lane per host
            assert (
                len(lanes) == 10
                and all(lane.startswith("host:") for lane in lanes)
                and "(100 workers)" in stream.inner_text()
            )
        # The DOM is bounded by the theme's caps, not by 1,000 workers or 4,000 tasks.
        bars = stream.locator("rect").count()
        assert bars == page.evaluate("G.THEME.stream.maxBars")
        nodes = page.locator("#live").evaluate("el => el.querySelectorAll('*').length")
        assert nodes < 2 * bars + 200, nodes
        resources = page.locator("#live .nbc-resources")
        assert resources.locator(".nbc-resource-band").inner_text() == "1000 workers (median, min\u2013max)"
        assert (
            resources.locator("polygon").count() == 2
            and resources.locator(".nbc-resource-worker").count() == 0
        )
        assert re.search(r"CPU \d+% \(\d+%\u2013\d+%\)\nMem [\d.]+ [MG]iB \(", resources.inner_text())
    finally:
        page.close()
