"""The sidebar panel in a real JupyterLab, driven by headless Chromium (Playwright).

One walk through what a user does: open the panel, start a cluster from the form, scale
it, use it from a notebook, watch the task stream while a cell runs, stop it. Every wait is
Playwright's auto-waiting `expect` on what the page shows; screenshots of each step go to
test-artifacts/<test name>/ (paths printed).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect, sync_playwright

import nbcluster
from nbcluster import config
from nbcluster.cluster.info import ClusterList
from nbcluster.cluster.spec import NAME_RULE
from tests.browser_helpers import JupyterLab, Screenshots, launch_chromium

CLUSTER_TIMEOUT_MS = 90_000  # a cluster start or scale on a busy 2-core CI machine
# One task per item (--batch 1), so the task stream shows 60 bars.
CELL = """\
%%distribute --over "i in range(60)" --batch 1
import time
time.sleep(0.05)
i"""


def write_notebook(folder: Path) -> None:
    kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("")], metadata={"kernelspec": kernelspec}
    )
    nbformat.write(notebook, folder / "demo.ipynb")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    with JupyterLab(tmp_path_factory.mktemp("lab")) as server:
        write_notebook(server.root_dir)
        yield server


@pytest.fixture
def page(lab: JupyterLab, request: pytest.FixtureRequest) -> Iterator[Any]:
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            yield page
            # The last state, pass or fail: the first thing to look at when a step failed.
            Screenshots(page, request.node.name)("final")
        finally:
            browser.close()


def card(page: Any, name: str) -> Any:
    return page.locator(f'.nbc-card[data-name="{name}"]')


def show_panel_from_palette(page: Any) -> None:
    # The panel's command activates it (a second click on its tab would close it again).
    # Enter runs the active item; wait until the filter made it ours. (The palette
    # re-renders as commands change state, so clicking an item can miss it.) A palette that
    # closed before the filter was typed (the page moved the focus) is opened again, for up
    # to a minute.
    ours = page.locator('.lm-CommandPalette-item.lm-mod-active[data-command="nbcluster:open"]')
    palette = page.locator(".lm-CommandPalette-input")
    deadline = time.monotonic() + 60
    while True:
        if not palette.is_visible():
            page.keyboard.press("Control+Shift+C")
        try:
            palette.fill("Show Dask Clusters", timeout=5_000)
            expect(ours).to_be_visible(timeout=10_000)
            break
        except (AssertionError, PlaywrightTimeout):
            if time.monotonic() > deadline:
                raise
            page.keyboard.press("Escape")
    page.keyboard.press("Enter")
    expect(page.locator(".nbc-panel")).to_be_visible()


def show_panel_from_view_menu(page: Any) -> None:
    # Notebook 7 lists the left area's panels under View > Left Sidebar. Menus go by the mouse:
    # unlike the palette's shortcut, they do not depend on where a loading notebook put the focus.
    page.get_by_role("menuitem", name="View").click()
    page.locator(".lm-Menu-itemLabel", has_text="Left Sidebar").hover()
    page.locator(".lm-Menu-itemLabel", has_text="Show Dask clusters (nbcluster)").click()
    expect(page.locator(".nbc-panel")).to_be_visible()


def test_panel_start_scale_use_watch_stop(lab: JupyterLab, page: Any) -> None:
    shot = Screenshots(page, "test_panel_start_scale_use_watch_stop")
    page.goto(f"{lab.url}lab?token={lab.token}")
    expect(page.locator("#jp-main-dock-panel")).to_be_visible()

    # The panel: its own icon in the left area.
    page.locator('.jp-SideBar [data-id="nbcluster-sidebar"]').click()
    panel = page.locator(".nbc-panel")
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-connected", "true")
    expect(panel.locator(".nbc-empty")).to_be_visible()

    # The form rejects a bad value itself, with a message, before asking the server.
    panel.get_by_role("button", name="New cluster").click()
    form = panel.locator(".nbc-form")
    # The name rule comes from the server with the backends: wait for them.
    expect(form.locator('select[name="profile"] option').first).to_be_attached()
    form.locator('input[name="name"]').fill("not a name")
    form.get_by_role("button", name="Start cluster").click()
    expect(form.locator(".nbc-form-error")).to_contain_text(f"Name: {NAME_RULE}")
    form.locator('input[name="memory"]').fill("lots")
    form.locator('input[name="name"]').fill("web")
    form.get_by_role("button", name="Start cluster").click()
    expect(form.locator(".nbc-form-error")).to_contain_text("Memory per worker")
    shot("form-error")
    form.locator('input[name="memory"]').fill("")
    # Each profile is offered with its description (from Dask config).
    expect(form.locator('select[name="profile"] option[value="local"]')).to_have_text(
        "local: Worker processes on this machine (CPU and GPU)"
    )
    form.get_by_role("button", name="Start cluster").click()

    web = card(page, "web")
    expect(web).to_have_attribute("data-workers", "2", timeout=CLUSTER_TIMEOUT_MS)
    expect(web.locator(".nbc-card-stats")).to_contain_text("2 workers")
    expect(web.locator(".nbc-card-meta")).to_contain_text("owned by this Jupyter server")
    # Where it runs, in the words of `%cluster list`'s "runs on" column.
    expect(web.locator(".nbc-card-runs-on")).to_have_text("local")
    shot("cluster-started")
    # Started through the server, visible to every other process through the registry.
    handles = nbcluster.clusters(runtime_dir=lab.runtime_dir)
    assert [h.name for h in handles] == ["web"]
    assert re.search(r"^ web +local +tls://", repr(ClusterList([h.entry for h in handles])), re.M)

    web.locator('[data-role="scale"]').fill("3")
    web.get_by_role("button", name="Scale").click()
    expect(web).to_have_attribute("data-workers", "3", timeout=CLUSTER_TIMEOUT_MS)
    expect(web.locator(".nbc-card-stats")).to_contain_text("3 workers")
    shot("scaled-to-3")

    # A notebook, then "use in this notebook" on the card.
    page.get_by_role("menuitem", name="File").click()
    page.locator('.lm-Menu-item[data-command="filebrowser:open-path"]').click()
    page.locator(".jp-Dialog input").fill("demo.ipynb")
    page.locator(".jp-Dialog").get_by_role("button", name="Open").click()
    expect(page.get_by_role("button", name="Python 3 (ipykernel) | Idle")).to_be_visible(timeout=60_000)
    # Opening a path reveals it in the file browser, which takes the left area.
    show_panel_from_palette(page)
    web.get_by_role("button", name="Use in this notebook").click()
    expect(page.get_by_text("demo.ipynb now uses cluster web")).to_be_visible(timeout=60_000)

    # Run a %%distribute cell on the cluster; the panel's task stream fills while it runs.
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.click()
    editor.fill(CELL)
    page.keyboard.press("Shift+Enter")
    tasks = panel.locator(".nbc-graph-tasks .nbc-task")
    expect(tasks.first).to_be_attached(timeout=60_000)
    shot("task-stream-moving")
    expect(page.locator(".jp-OutputArea").first).to_contain_text("60 ok", timeout=60_000)
    expect(panel.locator(".nbc-graph-progress")).to_contain_text("done")
    assert tasks.count() > 10
    shot("cell-done")

    # The notebook's kernel uses it: the panel asks before stopping.
    web.get_by_role("button", name="Stop").click()
    page.locator(".jp-Dialog").get_by_role("button", name="Stop it").click()
    expect(web).to_have_count(0, timeout=CLUSTER_TIMEOUT_MS)
    expect(panel.locator(".nbc-empty")).to_be_visible()
    assert nbcluster.clusters(runtime_dir=lab.runtime_dir) == []
    shot("stopped")


def test_panel_lists_a_cluster_started_elsewhere_with_its_dashboard(lab: JupyterLab, page: Any) -> None:
    shot = Screenshots(page, "test_panel_lists_a_cluster_started_elsewhere_with_its_dashboard")
    # Started by this test process, as a kernel or the CLI would: the server only reads
    # the registry.
    handle = nbcluster.start(workers=1, name="outside", dashboard=True, runtime_dir=lab.runtime_dir)
    try:
        # A workspace of its own: the default one would restore the previous test's layout.
        page.goto(f"{lab.url}lab/workspaces/elsewhere?token={lab.token}")
        page.locator('.jp-SideBar [data-id="nbcluster-sidebar"]').click()
        outside = card(page, "outside")
        expect(outside).to_have_attribute("data-workers", "1", timeout=CLUSTER_TIMEOUT_MS)
        expect(outside.locator(".nbc-card-meta")).to_contain_text("owned by pid")
        shot("started-elsewhere")

        # Its Dask dashboard, through the server's authenticated proxy: the Bokeh page
        # loads, and so does its live websocket.
        with page.expect_popup() as popup_info:
            outside.get_by_role("link", name="Dashboard").click()
        dashboard = popup_info.value
        assert dashboard.url.startswith(f"{lab.url}nbcluster/dashboard/outside/")
        # A Bokeh server app gets its document over that websocket: no socket, no canvas.
        expect(dashboard.locator("canvas").first).to_be_visible(timeout=60_000)
        Screenshots(dashboard, "test_panel_lists_a_cluster_started_elsewhere_with_its_dashboard")("dashboard")
        dashboard.close()
    finally:
        handle.stop()
    # Stopped behind the panel's back: the card goes, no spinner stays.
    expect(outside).to_have_count(0)
    expect(page.get_by_text("Cluster outside is gone")).to_be_visible()
    shot("gone")


def test_panel_stream_reconnects_and_rests_while_hidden(lab: JupyterLab, page: Any) -> None:
    # Every api/stream connection passes through here, so the test can drop one as a
    # server restart or a proxy timeout would.
    sockets: list[tuple[Any, Any]] = []

    def relay(ws: Any) -> None:
        sockets.append((ws, ws.connect_to_server()))

    page.route_web_socket(re.compile(r".*/nbcluster/api/stream.*"), relay)
    page.goto(f"{lab.url}lab/workspaces/stream?token={lab.token}")
    tab = page.locator('.jp-SideBar [data-id="nbcluster-sidebar"]')
    tab.click()
    panel = page.locator(".nbc-panel")
    expect(panel).to_have_attribute("data-connected", "true")
    # Its settings are the server's Dask config, not constants of the front end.
    sent = page.evaluate("JSON.parse(document.getElementById('jupyter-config-data').textContent)")
    assert json.loads(sent["nbclusterSidebar"]) == config.sidebar_settings()

    # Dropped: the panel says so, then reconnects by itself.
    page_side, server_side = sockets[-1]
    server_side.close()
    page_side.close()
    expect(panel).to_have_attribute("data-connected", "false")
    expect(panel).to_have_attribute("data-connected", "true")
    assert len(sockets) == 2

    # Hidden, the panel lets its stream go (the server stops polling for it); shown again,
    # it opens a new one.
    tab.click()
    expect(panel).to_be_hidden()
    expect(panel).to_have_attribute("data-connected", "false")
    tab.click()
    expect(panel).to_have_attribute("data-connected", "true")
    assert len(sockets) == 3


def test_panel_in_notebook_7(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with JupyterLab(tmp_path, app="notebook") as server, sync_playwright() as p:
        write_notebook(server.root_dir)
        handle = nbcluster.start(workers=1, name="nb7", runtime_dir=server.runtime_dir)
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            shot = Screenshots(page, request.node.name)
            page.goto(f"{server.url}notebooks/demo.ipynb?token={server.token}")
            expect(page.locator(".jp-NotebookPanel")).to_be_visible(timeout=60_000)
            show_panel_from_view_menu(page)
            expect(card(page, "nb7")).to_have_attribute("data-workers", "1", timeout=CLUSTER_TIMEOUT_MS)
            # Clicked while the kernel may still be starting: the panel waits for it.
            card(page, "nb7").get_by_role("button", name="Use in this notebook").click()
            expect(page.get_by_text("now uses cluster nb7")).to_be_visible(timeout=60_000)
            shot("notebook-7")
        finally:
            shot("final")
            browser.close()
            handle.stop()


def _functions() -> Any:
    # A local function is shipped by value: the workers cannot import this test module.
    def square(x: int) -> int:
        import time

        time.sleep(0.1)
        return x * x

    return square


_square = _functions()


def test_panel_card_reads_right_and_asks_before_stopping(lab: JupyterLab, page: Any) -> None:
    from nbcluster.run.api import distribute
    from nbcluster.widgets import progress_hook
    from tests.browser_helpers import CONTRAST, MIN_CONTRAST

    shot = Screenshots(page, "test_panel_card_reads_right_and_asks_before_stopping")
    # Started by this process, which keeps a Dask client on it: a notebook kernel using it.
    handle = nbcluster.start(workers=1, name="card", runtime_dir=lab.runtime_dir)
    try:
        page.goto(f"{lab.url}lab/workspaces/card?token={lab.token}")
        page.locator('.jp-SideBar [data-id="nbcluster-sidebar"]').click()
        panel = page.locator(".nbc-panel")
        c = card(page, "card")
        expect(c).to_have_attribute("data-workers", "1", timeout=CLUSTER_TIMEOUT_MS)
        c.locator(".nbc-card-head").click()  # its live graphs
        expect(c).to_have_class(re.compile("nbc-selected"))
        stats = c.locator(".nbc-card-stats")
        # "1 core", not "1 cores"; memory used of what the machine has, in binary units.
        expect(stats).to_contain_text("1 worker · 1 core · ")
        assert re.search(r"[\d.]+ [kMG]iB used of [\d.]+ [MG]iB", stats.inner_text()), stats.inner_text()
        assert not re.search(r"\d (kB|MB|GB)\b", stats.inner_text())
        # The empty-list note sets its commands as code, not in literal backticks.
        empty = panel.locator(".nbc-empty")
        assert "`" not in empty.text_content() and empty.locator("code").count() == 2
        # Every box says what it is, and min/max stay on one line with their button.
        for text in ("Workers", "Min", "Max"):
            expect(c.locator(".nbc-inline-label", has_text=text)).to_be_visible()
        tops = c.locator(".nbc-adapt-row > *").evaluate_all(
            "els => els.map(e => e.getBoundingClientRect().top)"
        )
        assert len(tops) == 3 and max(tops) - min(tops) < 4, tops
        # The form's size errors say "add --force": the form has that switch.
        panel.get_by_role("button", name="New cluster").click()
        expect(
            panel.locator(".nbc-field", has_text="--force").locator('input[name="force"]')
        ).to_be_attached()
        panel.get_by_role("button", name="Cancel").click()

        # Resized behind the panel's back (as adapt does): the scale box follows.
        handle.scale(2)
        expect(c).to_have_attribute("data-workers", "2", timeout=CLUSTER_TIMEOUT_MS)
        expect(c.locator('[data-role="scale"]')).to_have_value("2")
        expect(stats).to_contain_text("2 workers · 2 cores")

        # A run of 12 items in batches of 4: the sidebar counts items, as the cell does.
        hook = progress_hook(delay=0, interval=0.1, _display=_Sink(), _widgets=True)
        results = distribute(_square, over=range(12), batch=4, on=handle.client, progress=hook)
        hook.live.close()
        assert results.values() == [x * x for x in range(12)]
        progress = panel.locator(".nbc-graph-progress")
        expect(progress).to_contain_text("12 / 12 done (100%)")
        expect(progress).to_contain_text("done in")
        shot("items-counted")

        # Restart says what it did; the old workers' tasks share one "departed" lane.
        c.get_by_role("button", name="Restart workers").click()
        expect(c.get_by_role("button", name="Restarting…")).to_be_visible()
        expect(page.get_by_text("Restarted 2 workers of card")).to_be_visible(timeout=CLUSTER_TIMEOUT_MS)
        expect(panel.locator('.nbc-graph-tasks .nbc-lane[data-lane="departed"]')).to_contain_text(
            "2 departed workers"
        )
        assert "(gone)" not in panel.locator(".nbc-graph-tasks").inner_text()
        expect(panel.locator(".nbc-graph-tasks .nbc-lane")).to_have_count(3)  # 2 new workers, 1 departed
        shot("restarted")

        # The dark theme: the badge and the card's text stay readable.
        use_theme(page, "JupyterLab Dark")
        expect(page.locator("body")).to_have_attribute("data-jp-theme-light", "false")
        expect(c.locator(".nbc-badge")).to_have_text("running")
        page.wait_for_function(
            "getComputedStyle(document.querySelector('.nbc-panel')).backgroundColor !== 'rgb(255, 255, 255)'"
        )
        measured = c.evaluate(CONTRAST)
        labels = [m for m in measured if m["text"] == "running" or m["text"].startswith("2 workers")]
        assert len(labels) == 2, measured
        assert all(m["ratio"] >= MIN_CONTRAST for m in labels), labels
        shot("dark")

        # Stop asks first: a kernel (this process) uses the cluster.
        c.get_by_role("button", name="Stop").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Stop cluster card?")
        expect(dialog).to_contain_text("1 notebook kernel uses it")
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_have_count(0)
        assert [h.name for h in nbcluster.clusters(runtime_dir=lab.runtime_dir)] == ["card"]
        c.get_by_role("button", name="Stop").click()
        page.locator(".jp-Dialog").get_by_role("button", name="Stop it").click()
        expect(c).to_have_count(0, timeout=CLUSTER_TIMEOUT_MS)
        assert nbcluster.clusters(runtime_dir=lab.runtime_dir) == []
    finally:
        page.keyboard.press("Escape")
        use_theme(page, "JupyterLab Light")  # the theme is a user setting: later tests' pages share it
        if nbcluster.clusters(runtime_dir=lab.runtime_dir):
            handle.stop()


def use_theme(page: Any, name: str) -> None:
    page.keyboard.press("Control+Shift+C")
    page.locator(".lm-CommandPalette-input").fill(f"Use Theme: {name}")
    expect(page.locator(".lm-CommandPalette-item.lm-mod-active", has_text=name)).to_be_visible()
    page.keyboard.press("Enter")


class _Sink:
    """The display seam: the widget goes nowhere (this test watches the sidebar)."""

    def show(self, bundle: dict[str, Any]) -> None:
        pass

    def update(self, bundle: dict[str, Any]) -> None:
        pass
