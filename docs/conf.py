"""Sphinx configuration of nbcluster's docs: `python -m sphinx -W --keep-going -b html docs docs/_build/html`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]  # this checkout's nbcluster, and our extension

import nbcluster  # noqa: E402

project = "nbcluster"
author = "the nbcluster developers"
copyright = "the nbcluster developers, BSD-3-Clause"
release = version = nbcluster.__version__

extensions = [
    "myst_nb",  # MyST Markdown (it includes myst-parser) and notebooks, executed from a cache
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_design",
    "sphinxcontrib.httpdomain",
    "sphinxcontrib.openapi",
    "nbcluster_docs",
    "teaching_notebooks",
]

# Markdown pages (MyST); a page whose front matter says `file_format: mystnb` is a notebook
# whose {code-cell}s are executed when the docs build. Execution goes through jupyter-cache:
# a page or notebook whose code did not change is not executed again. The teaching notebooks
# are executed (from the same cache) by _ext/teaching_notebooks.py, and rendered from there.
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# NBCLUSTER_DOCS_EXECUTE=0: a quick build that executes nothing (tests/test_docs.py's site).
nb_execution_mode = "off" if os.environ.get("NBCLUSTER_DOCS_EXECUTE", "1") == "0" else "cache"
nb_execution_cache_path = str(HERE / "_build" / ".jupyter_cache")
nb_execution_excludepatterns = ["teaching/notebooks/*"]
nb_execution_timeout = 240
nb_execution_raise_on_error = True
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

# Docstrings: numpydoc sections; `name` in them is a cross-reference where Sphinx knows the name.
default_role = "py:obj"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
numpydoc_show_class_members = False  # autodoc's :members: lists them, once
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()  # tests/test_docstrings.py checks the public names

# No intersphinx: the build must pass offline (CI may have no network).

html_theme = "pydata_sphinx_theme"
html_title = "nbcluster"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
}
