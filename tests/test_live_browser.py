"""The live widget in a real JupyterLab 4 and Notebook 7, in headless Chromium.

The test starts `jupyter lab` (or `jupyter notebook`) on a free loopback port with a token, opens a notebook in
Debian's Chromium through Playwright, runs its `%%distribute` cell, and watches the widget: the live view
(drawn by graphs.js in the browser) with one lane per worker, then the frozen picture at
100%. The second half of the cell's items waits for the test to have seen the live view (a
Dask `Event`), so a page slow to draw on a busy machine cannot miss it. It switches to the dark theme to check the picture follows JupyterLab's CSS
variables, with every label of the picture at a contrast of at least 7 in the dark theme,
and fails if the page asks anything of the network beyond the local server.
Screenshots go to test-artifacts/live-browser/<app>/ (printed). A missing Chromium fails
the test: it is never skipped.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Event
from playwright.sync_api import expect

from nbcluster.cluster.handle import ClusterHandle
from tests.browser_helpers import (
    CONTRAST,
    MIN_CONTRAST,
    jupyter_app,
    run_all_cells,
    watched_page,
    write_notebook,
)

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "live-browser"

SETUP = """\
%load_ext nbcluster
%cluster use {name}
"""

# 80 items of 0.15 s on 2 workers; items 40 on wait until the test has seen the live view.
CELL = """\
%%distribute --over "x in range(80)" --batch 1 --into results
import time
from distributed import Event
if x >= 40:
    assert Event("{gate}").wait(timeout=300)
time.sleep(0.15)
x * x
"""


APPS = {
    # app: (module, its app class for config, the notebook's URL path)
    "lab": ("jupyterlab", "LabApp", "lab/tree/live.ipynb"),
    "notebook7": ("notebook", "JupyterNotebookApp", "notebooks/live.ipynb"),
}


@contextlib.contextmanager
def _set_on_exit(gate: Event) -> Iterator[None]:
    """Let the held items go however the test ends: they must not hold the session's cluster."""
    try:
        yield
    finally:
        gate.set()


@pytest.fixture(params=sorted(APPS))
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """JupyterLab or Notebook 7 on a loopback port; yields (notebook URL with token, root dir)."""
    module, app_class, path = APPS[request.param]
    root = tmp_path / "root"
    root.mkdir()
    with jupyter_app(tmp_path, module, app_class, root) as (base, token):
        yield f"{base}/{path}?token={token}", root


def test_widget_renders_live_and_freezes_in_the_browser(
    lab: tuple[str, Path], cluster: ClusterHandle, request: pytest.FixtureRequest
) -> None:
    url, root = lab
    artifacts = ARTIFACTS / request.node.callspec.params["lab"]
    gate = Event(f"live-browser-{uuid.uuid4().hex[:8]}", client=cluster.client)
    write_notebook(root / "live.ipynb", SETUP.format(name=cluster.name), CELL.format(gate=gate.name))
    artifacts.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots in {artifacts}")

    outside: list[str] = []
    with watched_page(artifacts) as page, _set_on_exit(gate):
        page.on(
            "request",
            lambda r: None if r.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")) else outside.append(r.url),
        )  # fmt: skip
        run_all_cells(page, url)

        # Live: the anywidget view, drawn in the browser by graphs.js. The run holds half its
        # items until it has been seen, however long the page takes to draw it.
        live_view = page.locator(".nbc-live:not(.nbc-static)")
        expect(live_view.locator(".nbc-progress")).to_be_visible(timeout=120_000)
        expect(live_view.locator(".nbc-lane")).to_have_count(2, timeout=30_000)
        page.screenshot(path=str(artifacts / "live.png"))
        gate.set()

        # Frozen: the output is replaced by the static picture, at 100%.
        frozen = page.locator(".nbc-static")
        expect(frozen.locator('.nbc-progress[data-percent="100"]')).to_be_visible(timeout=120_000)
        expect(frozen.locator(".nbc-lane")).to_have_count(2)
        expect(page.locator(".nbc-live:not(.nbc-static)")).to_have_count(0)
        expect(frozen.locator(".nbc-progress-text")).to_contain_text("80 / 80 done (100%)")
        assert frozen.locator(".nbc-task").count() == 80
        frozen.screenshot(path=str(artifacts / "final-light.png"))
        light = frozen.locator(".nbc-progress-text").evaluate("e => getComputedStyle(e).color")

        page.evaluate(
            "window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
        )
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        # A theme change shows JupyterLab's splash over the page while it fades: a
        # screenshot taken then looks dim whatever the picture's colours.
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=30_000)
        dark = frozen.locator(".nbc-progress-text").evaluate("e => getComputedStyle(e).color")
        frozen.screenshot(path=str(artifacts / "final-dark.png"))
        assert light != dark, "the picture's text colour does not follow the theme"
        measured = frozen.evaluate(CONTRAST)
        poor = [m for m in measured if m["ratio"] < MIN_CONTRAST]
        assert len(measured) > 10 and not poor, f"hard to read in the dark theme: {poor[:5]}"
    assert not outside, f"the page reached outside the local server: {json.dumps(outside[:5])}"
