"""A trial run's stop buttons while its cell blocks, in a real JupyterLab in headless Chromium.

JupyterLab 4.6 sends comm messages on a kernel subshell (ipykernel 7), so a button's click
reaches the kernel while the cell waits for its run: pressing one trial's stop button ends
that trial *stopped* and the other goes on to *done*. With comms over subshells turned off
(JupyterLab's ``commsOverSubshells`` setting, as in front ends without subshells) a click
would only arrive after the cell: the view shows no buttons and says to interrupt the
kernel instead. See ``nbcluster/widgets/_controls.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from nbcluster.cluster.handle import ClusterHandle
from tests.browser_helpers import jupyter_app, run_all_cells, watched_page, write_notebook

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "trial-controls"

SETUP = """\
%load_ext nbcluster
%cluster use {name}
"""

# Trials 0 and 1 report every 0.05 s, `long` and `steps` times: both at once on the 2 workers.
TRIALS = """\
%%distribute --over "x in range(2)" --objective loss:min --into runs
import time
import nbcluster
for step in range({long} if x == 0 else {steps}):
    nbcluster.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.05)
x
"""

STATES = "print('states:', runs.states)"


@pytest.fixture(params=["perCommTarget", "disabled"])
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """JupyterLab with comms over subshells as set; yields (notebook URL, root dir, setting)."""
    setting = request.param
    root = tmp_path / "root"
    root.mkdir()
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "kernels-settings.jupyterlab-settings").write_text(json.dumps({"commsOverSubshells": setting}))
    with jupyter_app(tmp_path, "jupyterlab", "LabApp", root) as (base, token):
        yield f"{base}/lab/tree/trials.ipynb?token={token}", root, setting


def test_a_trials_stop_button_works_while_the_cell_blocks_or_the_view_says_ctrl_c(
    lab: tuple[str, Path, str], cluster: ClusterHandle
) -> None:
    url, root, setting = lab
    subshells = setting != "disabled"
    # With buttons: trial 0 would run 30 s unless stopped, trial 1 runs 6 s (on after the stop).
    # Without: trial 1 ends after 2 s, trial 0 after 4 s.
    long, steps = (600, 120) if subshells else (80, 40)
    write_notebook(root / "trials.ipynb", SETUP.format(name=cluster.name), TRIALS.format(long=long, steps=steps), STATES)
    artifacts = ARTIFACTS / setting
    artifacts.mkdir(parents=True, exist_ok=True)
    with watched_page(artifacts) as page:
        run_all_cells(page, url)
        live = page.locator(".nbc-live:not(.nbc-static)")
        expect(live.locator(".nbc-progress")).to_be_visible(timeout=90_000)
        if subshells:
            # The buttons show once the kernel has answered the view's hello: while the cell runs.
            trial0 = live.locator('.nbc-controls-trial[data-item="0"] .nbc-stop')
            expect(trial0).to_be_visible(timeout=90_000)
            expect(live.locator('.nbc-controls-trial[data-item="1"] .nbc-stop')).to_be_visible()
            page.screenshot(path=str(artifacts / "buttons.png"))
            trial0.click()
            # Trial 0 leaves the running list, stopped, while trial 1 still runs.
            expect(live.locator('.nbc-controls-trial[data-item="0"]')).to_have_count(0, timeout=30_000)
            expect(live.locator('.nbc-controls-trial[data-item="1"]')).to_have_count(1)
            expected = "states: ['stopped', 'done']"
        else:
            note = live.locator(".nbc-controls-note")
            expect(note).to_be_visible(timeout=90_000)
            expect(note).to_contain_text("interrupt the kernel (Ctrl-C")
            # Trial 1 has ended and trial 0 still runs: still no button, only the note.
            expect(live.locator(".nbc-progress-text")).to_contain_text("1 / 2 done", timeout=30_000)
            assert live.locator(".nbc-stop").count() == 0 and note.is_visible()
            page.screenshot(path=str(artifacts / "note.png"))
            expected = "states: ['done', 'done']"
        expect(page.locator(".jp-OutputArea-output").filter(has_text="states:")).to_contain_text(
            expected, timeout=90_000
        )
        # The frozen picture has no buttons: they belong to the live run only.
        expect(page.locator(".nbc-static .nbc-stop")).to_have_count(0)
