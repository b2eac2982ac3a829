"""The course's full-size reference outputs (`notebooks/reference/`) match the notebooks as they are.

An instructor compares a student's run with these, so a reference made from an older version
of a notebook would mislead: each notebook must have one, made from its current code, in
which no cell raised and every speed check ran (`make.problems`). The references themselves
are made by hand on an idle machine (`python notebooks/reference/make.py NN`): a full-size
run takes minutes and its speed checks need quiet cores, which a test run does not have.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

ROOT = Path(__file__).parent.parent
REFERENCE = ROOT / "notebooks" / "reference"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def _make() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_make", REFERENCE / "make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make = _make()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_notebook_has_a_full_size_reference_of_its_current_code(path: Path) -> None:
    ref = REFERENCE / path.name
    regenerate = f"run `python notebooks/reference/make.py {path.name[:2]}` on an idle machine"
    assert ref.exists(), f"{path.name} has no reference output: {regenerate}"
    reference, notebook = nbformat.read(ref, as_version=4), nbformat.read(path, as_version=4)
    assert make.code(reference) == make.code(notebook), (
        f"{path.name} changed since its reference was made: {regenerate}"
    )
    assert make.problems(reference) == []
    about = reference.metadata["nbcluster_reference"]
    assert about["small"] is False and about["seconds"] > 0


def test_problems_finds_a_raised_cell_and_a_skipped_speed_check(capsys: pytest.CaptureFixture[str]) -> None:
    from nbcluster.teaching import undisturbed

    assert not undisturbed(1.2, limit=0.5)  # what a notebook prints on a busy machine
    skipped = capsys.readouterr().out
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("1/0", outputs=[nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])]),
        nbformat.v4.new_code_cell("check()", outputs=[nbformat.v4.new_output(
            "stream", name="stdout",
            text=skipped,
        )]),
        nbformat.v4.new_code_cell("ok()", outputs=[nbformat.v4.new_output("stream", name="stdout", text="speedup 1.9x\n")]),
    ]  # fmt: skip
    found = make.problems(nb)
    assert found == [
        "cell 0 raised ZeroDivisionError: division by zero",
        "cell 1: other programs used the cores, its speed checks were skipped",
    ]
