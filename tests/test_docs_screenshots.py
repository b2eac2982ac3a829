"""The docs' screenshots, taken in a real JupyterLab by headless Chromium, so they never go stale.

One walk through the getting-started page: a notebook starts a cluster with `%cluster start`,
runs a `%%distribute` cell, and the sidebar is open beside it. The test checks what each
picture must show (the live view with one lane per worker, the sidebar's card of the
notebook's cluster with its task stream moving, the frozen picture at 100%) and only then
writes it to ``docs/_static/screenshots/`` (committed: the README shows one on GitHub, the
docs include them all). A run of the browser lane therefore refreshes them; commit them with
a change that alters what they show (CONTRIBUTING.md says how).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.browser_helpers import JupyterLab, Screenshots, launch_chromium
from tests.docs_helpers import NAMES, SHOTS

ROOT = Path(__file__).resolve().parent.parent
# The screenshots the docs and the README include; test_docs checks each is referenced.
CLUSTER_TIMEOUT_MS = 90_000  # a cluster start, and the sidebar seeing it, on a busy 2-core machine

CELLS = [
    "%load_ext nbcluster\n%cluster start --workers 2 --name first",
    # 60 items of 0.2 s on 2 workers: several seconds live, after the widget's 0.75 s delay.
    '%%distribute --over "x in range(60)" --batch 1 --into squares\nimport time\ntime.sleep(0.2)\nx ** 2',
    "squares[3], squares.values()[:5]",
]


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple[JupyterLab, Any]]:
    with JupyterLab(tmp_path) as lab, sync_playwright() as p:
        kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        notebook = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(c) for c in CELLS], metadata={"kernelspec": kernelspec}
        )
        nbformat.write(notebook, lab.root_dir / "first-steps.ipynb")
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 860}, device_scale_factor=1)
            page.set_default_timeout(60_000)
            yield lab, page
            # The last state, pass or fail: what to look at when a step failed.
            Screenshots(page, "test_docs_screenshots")("final")
        finally:
            browser.close()


def test_docs_screenshots_show_a_live_cell_the_sidebar_and_the_frozen_picture(
    page: tuple[JupyterLab, Any],
) -> None:
    lab, browser_page = page
    p = browser_page
    p.goto(f"{lab.url}lab/tree/first-steps.ipynb?token={lab.token}")
    expect(p.get_by_role("button", name="Python 3 (ipykernel) | Idle")).to_be_visible(timeout=90_000)
    p.locator('.jp-SideBar [data-id="nbcluster-sidebar"]').click()
    panel = p.locator(".nbc-panel")
    expect(panel).to_have_attribute("data-connected", "true")
    # The first cell starts the cluster; the sidebar lists it, whoever started it.
    p.locator(".jp-Notebook .jp-Cell").first.click()
    p.keyboard.press("Shift+Enter")
    card = panel.locator('.nbc-card[data-name="first"]')
    expect(card).to_have_attribute("data-workers", "2", timeout=CLUSTER_TIMEOUT_MS)
    expect(card.locator(".nbc-card-meta")).to_contain_text("owned by")
    # Then the %%distribute cell and the one that reads its results, queued behind it.
    p.keyboard.press("Shift+Enter")
    p.keyboard.press("Control+Enter")  # runs the last cell without adding one below it

    # Live: the widget under the cell with a lane per worker, and the sidebar's task stream
    # filling while the cell runs.
    live = p.locator(".nbc-live:not(.nbc-static)")
    expect(live.locator(".nbc-lane")).to_have_count(2, timeout=CLUSTER_TIMEOUT_MS)
    expect(panel.locator(".nbc-graph-tasks .nbc-task").first).to_be_attached()
    expect(live.locator(".nbc-task").nth(11)).to_be_attached()  # a few bars in each lane
    SHOTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(SHOTS / "live-cell-and-sidebar.png"))
    panel.screenshot(path=str(SHOTS / "sidebar.png"))

    # Frozen: the output becomes the static picture at 100%, which a saved notebook keeps.
    frozen = p.locator(".nbc-static")
    expect(frozen.locator('.nbc-progress[data-percent="100"]')).to_be_visible(timeout=120_000)
    expect(frozen.locator(".nbc-progress-text")).to_contain_text("60 / 60 done (100%)")
    expect(p.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea")).to_contain_text(
        "(9, [0, 1, 4, 9, 16])"
    )
    frozen.scroll_into_view_if_needed()
    frozen.screenshot(path=str(SHOTS / "frozen-picture.png"))
    for name in NAMES:
        assert (SHOTS / f"{name}.png").stat().st_size > 10_000, name
    print(f"screenshots refreshed in {SHOTS}")
