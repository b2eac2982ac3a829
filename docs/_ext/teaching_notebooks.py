"""The teaching notebooks on the docs site: executed in small mode, from a cache, shown as a student gets them.

When the docs build, each ``notebooks/*.ipynb`` (the instructor's version, with solutions and
hidden tests) is looked up in the execution cache (jupyter-cache, the one myst-nb uses, in
``docs/_build/.jupyter_cache``, git-ignored) by the hash of its code cells. A notebook not
found there is executed with ``NBCLUSTER_SMALL=1`` on a real kernel and cached, and the build
fails on any cell that raised. tests/test_notebooks.py puts each notebook it has run and
graded into the same cache, so a docs build after the tests (as in ``.ci/run``) executes
nothing; a build from a fresh clone executes each notebook once (about a minute apiece). Every
notebook runs on the machine that builds the docs: none needs a service a docs build lacks
(05 simulates its GPUs; 06 shows its HPC profiles without submitting them, and the
scale-out tests run those against a real SLURM).

The pages show what a student receives: nbgrader's own preprocessors clear the solutions and
the hidden tests, and the solution cells lose their outputs, so the site does not publish the
answers. The rest keeps the outputs of the executed instructor's version. The notebooks are
written to ``docs/teaching/notebooks/`` (generated, git-ignored), where myst-nb renders them
without executing them again.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import nbformat
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
from nbclient import NotebookClient
from nbformat import NotebookNode
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
RENDERED = ROOT / "docs" / "teaching" / "notebooks"
CACHE = ROOT / "docs" / "_build" / ".jupyter_cache"
LOG = logging.getLogger(__name__)
# NBCLUSTER_DOCS_EXECUTE=0: a quick build that executes nothing (tests/test_docs.py's site;
# the teaching notebooks' own tests execute them). Uncached notebooks are shown without outputs.
EXECUTE = os.environ.get("NBCLUSTER_DOCS_EXECUTE", "1") != "0"
CELL_TIMEOUT = 240  # seconds, as tests/test_notebooks.py allows a cell


def _hashable(source: NotebookNode, executed: NotebookNode) -> NotebookNode:
    """`executed` with the cell metadata of `source` and consecutive execution counts.

    jupyter-cache hashes code cells' sources and metadata: nbclient's timing metadata would
    make every run a new entry, and the graded runs of tests/test_notebooks.py (wrong answers
    tried in between) leave gaps in the counts.
    """
    out = copy.deepcopy(executed)
    count = 0
    for cell, original in zip(out.cells, source.cells, strict=True):
        cell.metadata = copy.deepcopy(original.metadata)
        if cell.cell_type != "code":
            continue
        count += 1
        cell.execution_count = count
        for output in cell.get("outputs", []):
            if output.output_type == "execute_result":
                output.execution_count = count
    return out


def store(path: Path, executed: NotebookNode) -> None:
    """Put an executed copy of notebook `path` in the docs' execution cache.

    Parameters
    ----------
    path : Path
        The notebook's file (``notebooks/NN-name.ipynb``), as it is in the repository.
    executed : NotebookNode
        The same notebook after a run in small mode with no cell raising.
    """
    source = nbformat.read(path, as_version=4)
    executed = copy.deepcopy(executed)
    executed.metadata["kernelspec"] = source.metadata.get("kernelspec", {})
    bundle = CacheBundleIn(_hashable(source, executed), uri=str(path))
    get_cache(str(CACHE)).cache_notebook_bundle(bundle, check_validity=False, overwrite=True)


def errors(nb: NotebookNode) -> list[str]:
    """Each cell of `nb` that raised, as ``cell N: Error: message``."""
    return [
        f"cell {index}: {out.ename}: {out.evalue}"
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "error"
    ]


def executed(path: Path) -> tuple[NotebookNode, bool]:
    """Notebook `path` with its outputs, and whether it came from the cache.

    Not in the cache and `EXECUTE` false: the notebook without outputs.

    Raises
    ------
    ExtensionError
        When a cell raised: the docs must not show a broken lesson.
    """
    source = nbformat.read(path, as_version=4)
    cache = get_cache(str(CACHE))
    try:
        # The cache keeps code cells only: merged into the source, the Markdown comes back.
        _, merged = cache.merge_match_into_notebook(source)
    except KeyError:
        pass
    else:
        return merged, True
    nb = copy.deepcopy(source)
    if not EXECUTE:
        return nb, False
    small = os.environ.get("NBCLUSTER_SMALL")
    os.environ["NBCLUSTER_SMALL"] = "1"  # the kernel inherits it
    try:
        NotebookClient(
            nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()  # fmt: skip
    finally:
        if small is None:
            del os.environ["NBCLUSTER_SMALL"]
        else:
            os.environ["NBCLUSTER_SMALL"] = small
    if found := errors(nb):
        raise ExtensionError(f"{path.name} raised when executed for the docs: {'; '.join(found)}")
    store(path, nb)
    return nb, False


def for_students(nb: NotebookNode) -> NotebookNode:
    """`nb` as nbgrader hands it out (solutions and hidden tests cleared), outputs kept elsewhere."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    out = copy.deepcopy(nb)
    solutions = {i for i, c in enumerate(out.cells) if c.metadata.get("nbgrader", {}).get("solution")}
    out, _ = ClearSolutions().preprocess(out, {})
    out, _ = ClearHiddenTests().preprocess(out, {})
    # The live views were replaced by their frozen pictures (plain HTML): no widget state
    # is needed, and without it myst-nb loads no widget manager from a CDN.
    out.metadata.pop("widgets", None)
    # The kernel is IPython's: its magics (`%cluster start --workers $WORKERS`) need its
    # lexer. A run through nbclient's execute() records it; the graded runs that
    # tests/test_notebooks.py stores keep the source's language_info, which may lack it.
    out.metadata.setdefault("language_info", NotebookNode()).setdefault("pygments_lexer", "ipython3")
    for i in solutions:
        if out.cells[i].cell_type == "code":
            out.cells[i].outputs = []
            out.cells[i].execution_count = None
    return out


def render(app: Sphinx) -> None:
    """Write each teaching notebook, executed and cleared, where the Teaching pages include it."""
    RENDERED.mkdir(parents=True, exist_ok=True)
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb, cached = executed(path)
        text = nbformat.writes(for_students(nb))
        target = RENDERED / path.name
        if not target.exists() or target.read_text() != text:  # unchanged: Sphinx keeps its page
            target.write_text(text)
        how = "from the cache" if cached else "executed" if EXECUTE else "not executed"
        LOG.info("teaching notebook %s: %s", path.name, how)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", render)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
