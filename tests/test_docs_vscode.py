"""What the live-graphs page says about VS Code and other front ends without JupyterLab, checked.

VS Code draws a cell's outputs itself: HTML outputs in its own web view, and widgets with a
manager of its own that loads third-party widget modules (anywidget's, which the live view
is) from a CDN unless told otherwise. There is no VS Code here, so the tests check the two
facts the page rests on, in headless Chromium with every request beyond the page refused:

- the frozen picture (what a finished cell shows, and what a saved notebook keeps) is plain
  HTML and inline SVG: it draws with no network, no JavaScript and no JupyterLab CSS;
- the live view, as a widget state embedded the standard way (`ipywidgets.embed`, drawn by
  ``@jupyter-widgets/html-manager``, the manager nbconvert's embedded widgets and static
  sites use), draws nothing offline: the manager and the widget's module come from a CDN.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from ipywidgets.embed import embed_minimal_html
from playwright.sync_api import sync_playwright

from nbcluster.widgets._static import render_html
from nbcluster.widgets.widget import LiveWidget
from tests.browser_helpers import launch_chromium
from tests.drawing_helpers import COUNTS, GRID, snapshot


@pytest.fixture
def offline_page() -> Iterator[tuple[Any, list[str]]]:
    """A Chromium page whose every request is refused, and the list of what it asked for."""
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            asked: list[str] = []
            context = browser.new_context(java_script_enabled=True, viewport={"width": 1000, "height": 900})

            def refuse(route: Any) -> None:
                asked.append(route.request.url)
                route.abort()

            context.route("**/*", refuse)
            yield context.new_page(), asked
        finally:
            browser.close()


def test_the_frozen_picture_draws_with_no_network_no_javascript_and_no_jupyterlab_css() -> None:
    frozen = render_html(COUNTS, snapshot(), GRID, window=None, resource_window=5.0)
    # Nothing to run and nothing to fetch (the SVG namespace is a name, not a request).
    assert "<script" not in frozen and not re.search(r"(src|href)=|url\(", frozen)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            context = browser.new_context(java_script_enabled=False, viewport={"width": 1000, "height": 900})
            asked: list[str] = []
            context.route("**/*", lambda route: (asked.append(route.request.url), route.abort()))
            page = context.new_page()
            page.set_content(f"<!doctype html><html><body>{frozen}</body></html>")
            bar = page.locator(".nbc-progress").first.bounding_box()
            lanes = page.locator(".nbc-lane")
            assert bar and bar["width"] > 100 and bar["height"] > 0
            assert lanes.count() == 3 and all(
                lanes.nth(i).bounding_box()["height"] > 0 for i in range(3)
            )  # 3 workers
            tasks = page.locator(".nbc-task")
            assert tasks.count() > 0 and tasks.first.bounding_box()["width"] > 0
            assert "7 / 12 done (75%)" in page.locator(".nbc-progress-text").inner_text()
            assert page.locator(".nbc-grid-row").count() > 0
            assert asked == []
        finally:
            browser.close()


def test_the_live_view_embedded_as_widget_state_draws_nothing_offline(
    offline_page: tuple[Any, list[str]],
) -> None:
    page, asked = offline_page
    widget = LiveWidget(progress=COUNTS, grid=GRID)
    try:
        out = io.StringIO()
        embed_minimal_html(out, views=[widget], title="live view")
    finally:
        widget.close()
    html = out.getvalue()
    # The state names the module and carries its code, but the manager that would run it is
    # a script from a CDN, and so is the loader of third-party modules.
    assert '"_model_module": "anywidget"' in html.replace("'", '"') or "anywidget" in html
    assert "cdn.jsdelivr.net/npm/@jupyter-widgets/html-manager" in html
    page.set_content(html)
    page.wait_for_load_state("load")
    assert any("@jupyter-widgets/html-manager" in url for url in asked), asked
    print("asked for:", *asked, sep="\n  ")
    assert page.locator(".nbc-live").count() == 0  # no live view: the manager never came
