"""Full-size reference outputs of the course: each notebook executed at full size, as handed to instructors.

    python notebooks/reference/make.py [NN ...]      # all notebooks, or those numbered NN

Each ``notebooks/NN-*.ipynb`` (the instructor's version, solutions included) is executed
without ``NBCLUSTER_SMALL`` in a fresh kernel, on a real local cluster, one notebook at a
time, and written to ``notebooks/reference/NN-*.ipynb`` with its outputs: the plots, the
numbers, the frozen pictures of the live views. This is what a student's run should look like
on a quiet machine, so an instructor can compare.

A reference is only worth handing out if its lessons showed, so a run is refused (nothing
written, exit status 1) when:

- a cell raised;
- a speed check was skipped because other programs used the cores (`teaching.undisturbed`
  printed its line): run it again on an idle machine.

Each notebook starts once the 1-minute load average is under 1 (the previous notebook's
cluster has wound down), or after 5 minutes of waiting for that.

What the run was is kept in the notebook's metadata (``nbcluster_reference``): when, how long,
the machine's cores and load average before and after, and the nbcluster version.
tests/test_teaching.py checks that every notebook has a reference whose code is the
notebook's current code: after editing a notebook, regenerate its reference.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE.parent
CELL_TIMEOUT = 900  # seconds: a full-size cell may train for minutes
DISTURBED = "the speed checks are skipped"  # what teaching.undisturbed prints
QUIET_WAIT_S = 300  # how long a notebook's run waits for the machine to be quiet (load under 1)


def code(nb: NotebookNode) -> list[str]:
    """The sources of `nb`'s code cells: what a reference must share with its notebook."""
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def problems(nb: NotebookNode) -> list[str]:
    """Why executed notebook `nb` is no reference: cells that raised, speed checks skipped."""
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.output_type == "error":
                found.append(f"cell {index} raised {out.ename}: {out.evalue}")
            elif out.output_type == "stream" and DISTURBED in out.text:
                found.append(f"cell {index}: other programs used the cores, its speed checks were skipped")
    return found


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _quiet(limit: float = 1.0, patience: float = QUIET_WAIT_S) -> None:
    """Wait until the 1-minute load average is under `limit` (the last notebook's kernel and
    cluster have wound down), or `patience` seconds have passed; the metadata shows which."""
    deadline = time.monotonic() + patience
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(2)


def run(path: Path) -> tuple[NotebookNode, dict[str, Any]]:
    """Execute notebook `path` at full size; return it with outputs and what the run was."""
    import nbcluster

    nb = nbformat.read(path, as_version=4)
    env_small = os.environ.pop("NBCLUSTER_SMALL", None)  # the kernel inherits the environment
    _quiet()
    before, started = _load(), time.monotonic()
    try:
        NotebookClient(
            nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()  # fmt: skip
    finally:
        if env_small is not None:
            os.environ["NBCLUSTER_SMALL"] = env_small
    about = {
        "small": False,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.monotonic() - started, 1),
        "cores": os.cpu_count(),
        "load_before": before,
        "load_after": _load(),
        "nbcluster": nbcluster.__version__,
    }
    return nb, about


def reference(nb: NotebookNode, about: dict[str, Any]) -> NotebookNode:
    """`nb` as shipped: its outputs kept, run metadata added, no widget state (nothing to load from a CDN)."""
    out = copy.deepcopy(nb)
    out.metadata.pop("widgets", None)
    out.metadata["nbcluster_reference"] = about
    for cell in out.cells:
        cell.metadata.pop("execution", None)  # nbclient's timestamps: noise in every diff
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("numbers", nargs="*", help="notebook numbers (e.g. 01 08); default: all")
    args = parser.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    if args.numbers:
        paths = [p for p in paths if p.name[:2] in args.numbers]
    failed = 0
    for path in paths:
        nb, about = run(path)
        found = problems(nb)
        print(
            f"{path.name}: {about['seconds']} s, load {about['load_before']} -> {about['load_after']}",
            flush=True,
        )
        if found:
            failed += 1
            # Kept outside the repository, to read what the run showed.
            kept = Path(tempfile.gettempdir()) / f"refused-{path.name}"
            nbformat.write(reference(nb, about), kept)
            print(f"  not written ({kept} has the run): " + "; ".join(found), flush=True)
            continue
        nbformat.write(reference(nb, about), HERE / path.name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
