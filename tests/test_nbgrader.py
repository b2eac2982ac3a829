"""The notebooks are nbgrader assignments: student versions lose the solutions and the hidden
tests, still run up to their first exercise, and the instructor's version of every notebook
autogrades to full marks. (That a wrong answer scores zero in every graded cell is checked where
the notebooks run, in `test_notebooks.py`, with its table of wrong answers.)

One temporary course directory per test module: `source/nbcluster/` holds copies of every
notebook, `nbgrader generate_assignment` writes `release/nbcluster/`, and one `nbgrader autograde`
grades the instructor's copies of them all (`AUTOGRADED`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import nbcluster

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _has_exercise(path: Path) -> bool:
    return any(
        c.metadata.get("nbgrader", {}).get("solution") for c in nbformat.read(path, as_version=4).cells
    )


EXERCISES = [p for p in NOTEBOOKS if _has_exercise(p)]
AUTOGRADED = [p.stem for p in EXERCISES]
MIN_AUTOGRADED_POINTS = 70  # over the course
MIN_DISTRIBUTED_POINTS = 45  # of them, for exercises that write distributed logic (notebooks/README.md)
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
ASSIGNMENT = "nbcluster"


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # nbgrader runs `alembic` from the PATH: this Python's scripts folder must be on it.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args, "--CourseDirectory.root=" + str(course)],
        cwd=course, capture_output=True, text=True, timeout=1800, env={**os.environ, "PATH": path},
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
    """The lines of a solution: its BEGIN/END SOLUTION region, or the whole cell without one."""
    if "### BEGIN SOLUTION" not in cell.source:
        return [line.strip() for line in cell.source.splitlines() if line.strip()]
    lines, inside = [], False
    for line in cell.source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside and line.strip():
            lines.append(line.strip())
    return lines


def without_hidden_tests(source: str) -> list[str]:
    """The non-blank lines of a test cell as students see it: hidden tests taken out."""
    lines, inside = [], False
    for line in source.splitlines():
        if HIDDEN[0] in line:
            inside = True
        elif HIDDEN[1] in line:
            inside = False
        elif not inside and line.strip():
            lines.append(line)
    return lines


def _grading(cell: nbformat.NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


def test_every_notebook_has_graded_exercises() -> None:
    assert len(EXERCISES) == len(NOTEBOOKS) - 1, "only 00-getting-started has no exercise"
    points = 0.0
    for path in EXERCISES:
        cells = nbformat.read(path, as_version=4).cells
        auto = [c for c in cells if _grading(c).get("grade") and c.cell_type == "code"]
        manual = [c for c in cells if _grading(c).get("grade") and c.cell_type == "markdown"]
        assert auto and all("VERIFY" in c.source for c in auto), path.name
        assert all(_grading(c).get("solution") for c in manual), (
            f"{path.name}: a graded markdown cell is an answer"
        )
        assert any(HIDDEN[0] in c.source for c in auto), f"{path.name}: no hidden tests"
        assert manual, f"{path.name}: no manually graded explain cell"
        points += sum(float(_grading(c)["points"]) for c in auto)
        for cell in cells:
            if _grading(cell).get("solution"):
                assert solution_lines(cell), f"{path.name}: an empty solution cell"
    assert points >= MIN_AUTOGRADED_POINTS, points


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_student_version_has_no_solutions(course: Path, path: Path) -> None:
    source = nbformat.read(path, as_version=4)
    released = nbformat.read(course / "release" / ASSIGNMENT / path.name, as_version=4)
    assert len(released.cells) == len(source.cells)
    text = "\n".join(c.source for c in released.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text and "HIDDEN TESTS" not in text
    for mine, theirs in zip(source.cells, released.cells, strict=True):
        if _grading(mine).get("solution"):
            stub = "raise NotImplementedError()" if mine.cell_type == "code" else "YOUR ANSWER HERE"
            assert stub in theirs.source
            student = {line.strip() for line in theirs.source.splitlines()}
            assert not student & set(solution_lines(mine)), f"solution left in {path.name}: {theirs.source}"
        elif HIDDEN[0] in mine.source:
            assert theirs.source.splitlines() and without_hidden_tests(mine.source) == without_hidden_tests(
                theirs.source
            )
        else:
            assert theirs.source == mine.source  # everything else reaches the students unchanged


@pytest.mark.usefixtures("no_leftovers")
@pytest.mark.parametrize("path", EXERCISES, ids=[p.stem for p in EXERCISES])
def test_student_version_runs_up_to_the_first_exercise(
    course: Path, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_SMALL", "1")
    nb = nbformat.read(course / "release" / ASSIGNMENT / path.name, as_version=4)
    grading = [_grading(c) for c in nb.cells]
    first = next(i for i, g in enumerate(grading) if g.get("solution"))
    graded = next(
        i for i, g in enumerate(grading) if g.get("grade") and i > first and nb.cells[i].cell_type == "code"
    )
    nb.cells = nb.cells[: graded + 1]  # up to the exercise's graded VERIFY cell
    NotebookClient(nb, timeout=240, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()  # fmt: skip
    errors = [(i, o.ename) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]  # fmt: skip
    # Everything before the exercise runs; the first error is the stub that students replace,
    # raised by the exercise cell itself or, for a function to write, by the first cell that
    # calls it (its VERIFY cell, or a cell that uses it on the way there).
    assert errors and errors[0][1] == "NotImplementedError" and first <= errors[0][0] <= graded, errors
    # A kept cluster (06 starts one from a terminal) outlives the kernel by design; the rest of
    # the notebook, which stops it, does not run here.
    for handle in nbcluster.clusters():
        handle.stop()


@pytest.mark.timeout(1800)  # every notebook, one after another: about 10 minutes on 2 cores
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
    autograded = course / "autograded" / "instructor" / ASSIGNMENT
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for name in AUTOGRADED:
            notebook = gradebook.find_submission_notebook(name, ASSIGNMENT, "instructor")
            # The explain cells wait for a person (written_score); everything else is automatic.
            assert notebook.max_code_score > 0 and notebook.max_written_score > 0
            # Which cells failed, and how: what a lost point needs to be looked into.
            cells = json.loads((autograded / f"{name}.ipynb").read_text())["cells"]
            errors = [(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", i), o["ename"], o["evalue"])
                      for i, c in enumerate(cells) for o in c.get("outputs", []) if o["output_type"] == "error"]  # fmt: skip
            assert notebook.code_score == notebook.max_code_score and not errors, (
                name,
                notebook.code_score,
                notebook.max_code_score,
                errors,
            )


def test_the_instructor_kit_states_each_notebooks_points() -> None:
    """notebooks/README's table of points is the notebooks' own nbgrader metadata."""
    kit = (ROOT / "notebooks" / "README.md").read_text()
    stated = {
        m[1]: (float(m[2]), float(m[3]))
        for m in re.finditer(r"^\| `([\w-]+)` \|.*\| (\d+) \+ (\d+) \|", kit, re.M)
    }
    total = 0.0
    for path in EXERCISES:
        cells = nbformat.read(path, as_version=4).cells
        points = {kind: sum(float(_grading(c)["points"]) for c in cells if _grading(c).get("grade") and c.cell_type == kind)
                  for kind in ("code", "markdown")}  # fmt: skip
        assert stated.get(path.stem) == (points["code"], points["markdown"]), path.stem
        total += points["code"]
    assert f"({total:.0f} points over the course" in kit


def test_the_instructor_kit_tabulates_the_points_for_distributed_logic() -> None:
    """notebooks/README's "Where the points are" lists every exercise with its points (as its
    graded cells' metadata gives them) and its kind; distributed logic has enough of them."""
    kit = (ROOT / "notebooks" / "README.md").read_text()
    rows = {
        m[1]: (m[2], float(m[3]), m[4])
        for m in re.finditer(r"^\| `([\w-]+)` \| (\d\d) \| (\d+) \| ([\w ]+) \|$", kit, re.M)
    }
    found = {}
    for path in EXERCISES:
        cells = nbformat.read(path, as_version=4).cells
        for cell in cells:
            grading = _grading(cell)
            if grading.get("grade") and cell.cell_type == "code":
                exercise = grading["grade_id"].removesuffix("-verify")
                found[exercise] = (path.stem[:2], float(grading["points"]))
    assert {k: v[:2] for k, v in rows.items()} == found
    distributed = sum(points for _, points, kind in rows.values() if kind == "distributed logic")
    assert distributed >= MIN_DISTRIBUTED_POINTS, distributed
    assert f"Distributed logic: {distributed:.0f} of {sum(p for _, p, _ in rows.values()):.0f} points" in kit
