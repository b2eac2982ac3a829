"""The teaching notebooks run top to bottom on a real kernel, as in CI and on Binder.

Every `notebooks/*.ipynb` is picked up (a new notebook needs no edit here) and executed with
`NBCLUSTER_SMALL=1`, the size CI can afford, and a per-cell timeout. A notebook passes when
no cell raised, no `%%distribute` cell reported failed items (a failing item does not raise:
the cell ends with a summary line on stderr, which is checked here), every cluster it started
is stopped, and none of its processes (kernel, supervisors, workers) is left running.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import nbcluster

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 240  # seconds; a whole small-mode notebook takes about a minute
FAILED_ITEMS = re.compile(r"\d+/\d+ items failed")


def execute(path: Path, cwd: Path | None = None) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in a fresh kernel; raises on the first cell that raises."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd or path.parent)}},
    )
    client.execute()
    return nb


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """Error outputs, and failed-item summaries that a %%distribute cell wrote to stderr."""
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.output_type == "error":
                found.append(f"cell {index}: {out.ename}: {out.evalue}")
            elif out.output_type == "stream" and out.name == "stderr" and FAILED_ITEMS.search(out.text):
                found.append(f"cell {index}: {out.text.strip()}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, no_leftovers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_SMALL", "1")
    nb = execute(path)
    assert problems(nb) == []
    # Each notebook cleans up after itself: it stops what it started.
    assert nbcluster.clusters() == []


def test_a_failing_item_fails_the_notebook(tmp_path: Path, no_leftovers: Path) -> None:
    """A failing item does not raise in the cell, so the check must read the outputs."""
    nb = nbformat.v4.new_notebook()
    # In this process (--local) and on a real cluster with its live widget, as the notebooks run.
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext nbcluster"),
        nbformat.v4.new_code_cell('%%distribute --local --over "x in [1, 0, 2]" --into r\n1 / x'),
        nbformat.v4.new_code_cell("%cluster start --workers 1"),
        nbformat.v4.new_code_cell('%%distribute --over "x in [0, 1, 0, 3]" --into s\n1 / x'),
        nbformat.v4.new_code_cell("%cluster stop"),
    ]
    path = tmp_path / "failing.ipynb"
    nbformat.write(nb, path)
    found = problems(execute(path))
    assert len(found) == 2, found
    assert found[0].startswith("cell 1: 1/3 items failed: ZeroDivisionError"), found
    assert found[1].startswith("cell 3: 2/4 items failed: ZeroDivisionError"), found
