"""The notebooks are nbgrader assignments: student versions lose the solutions, still run up to
their first exercise, and the instructor's version autogrades to full marks.

One temporary course directory per test module: `source/nbcluster/` holds copies of every
notebook, `nbgrader generate_assignment` writes `release/nbcluster/`. Autograding runs whole
notebooks, so it covers two quick ones (`AUTOGRADED`); the other checks cover them all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _has_exercise(path: Path) -> bool:
    return any(
        c.metadata.get("nbgrader", {}).get("solution") for c in nbformat.read(path, as_version=4).cells
    )


EXERCISES = [p for p in NOTEBOOKS if _has_exercise(p)]
AUTOGRADED = ["04-simulation", "05-gpu-workers"]
ASSIGNMENT = "nbcluster"


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # nbgrader runs `alembic` from the PATH: this Python's scripts folder must be on it.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args, "--CourseDirectory.root=" + str(course)],
        cwd=course, capture_output=True, text=True, timeout=900, env={**os.environ, "PATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("course")
    (root / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.course_id = {ASSIGNMENT!r}\n"
        "c.Execute.timeout = 240\n"  # per cell; nbgrader's default of 30 s is too short for a search
    )
    source = root / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    for path in NOTEBOOKS:
        shutil.copy(path, source)
    nbgrader(root, "generate_assignment", ASSIGNMENT, "--force")
    yield root


def solution_lines(cell: nbformat.NotebookNode) -> list[str]:
    lines, inside = [], False
    for line in cell.source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside and line.strip():
            lines.append(line.strip())
    return lines


def test_every_notebook_has_a_graded_exercise() -> None:
    assert len(EXERCISES) == len(NOTEBOOKS) - 1, "only 00-getting-started has no exercise"
    for path in EXERCISES:
        cells = nbformat.read(path, as_version=4).cells
        graded = [c for c in cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert graded and all("VERIFY" in c.source for c in graded), path.name
        for cell in cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                assert solution_lines(cell), f"{path.name}: a solution cell without a solution region"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_version_has_no_solutions(course: Path, path: Path) -> None:
    source = nbformat.read(path, as_version=4)
    released = nbformat.read(course / "release" / ASSIGNMENT / path.name, as_version=4)
    assert len(released.cells) == len(source.cells)
    text = "\n".join(c.source for c in released.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    for mine, theirs in zip(source.cells, released.cells, strict=True):
        if mine.metadata.get("nbgrader", {}).get("solution"):
            assert "raise NotImplementedError()" in theirs.source
            student = {line.strip() for line in theirs.source.splitlines()}
            assert not student & set(solution_lines(mine)), f"solution left in {path.name}: {theirs.source}"
        else:
            assert theirs.source == mine.source  # everything else reaches the students unchanged


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("path", EXERCISES, ids=[p.stem for p in EXERCISES])
def test_student_version_runs_up_to_the_first_exercise(
    course: Path, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_SMALL", "1")
    nb = nbformat.read(course / "release" / ASSIGNMENT / path.name, as_version=4)
    grading = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    first = next(i for i, g in enumerate(grading) if g.get("solution"))
    graded = next(i for i, g in enumerate(grading) if g.get("grade") and i > first)
    nb.cells = nb.cells[: graded + 1]  # up to the exercise's graded VERIFY cell
    NotebookClient(nb, timeout=240, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()  # fmt: skip
    errors = [(i, o.ename) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]  # fmt: skip
    # Everything before the exercise runs; the first error is the stub that students replace,
    # raised by the exercise cell itself or, for a function to write, by its VERIFY cell.
    assert errors and errors[0][1] == "NotImplementedError" and errors[0][0] in (first, graded), errors


@pytest.mark.usefixtures("no_leftovers")
def test_instructor_version_autogrades_to_full_marks(course: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbgrader.api import Gradebook

    monkeypatch.setenv("NBCLUSTER_SMALL", "1")
    submitted = course / "submitted" / "instructor" / ASSIGNMENT
    submitted.mkdir(parents=True)
    for name in AUTOGRADED:
        shutil.copy(ROOT / "notebooks" / f"{name}.ipynb", submitted)
    (submitted / "timestamp.txt").write_text("2026-01-01 00:00:00.000000 UTC")
    nbgrader(course, "db", "student", "add", "instructor")
    nbgrader(course, "autograde", ASSIGNMENT, "--force")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for name in AUTOGRADED:
            notebook = gradebook.find_submission_notebook(name, ASSIGNMENT, "instructor")
            assert notebook.max_score > 0
            assert notebook.score == notebook.max_score, (name, notebook.score, notebook.max_score)
    autograded = course / "autograded" / "instructor" / ASSIGNMENT
    for name in AUTOGRADED:
        nb = json.loads((autograded / f"{name}.ipynb").read_text())
        errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
        assert not errors, (name, errors)
