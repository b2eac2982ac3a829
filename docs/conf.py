"""Sphinx configuration of nbcluster's docs: `python -m sphinx -W --keep-going -b html docs docs/_build/html`."""

from __future__ import annotations

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
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "numpydoc",
    "sphinx_design",
    "sphinxcontrib.httpdomain",
    "sphinxcontrib.openapi",
    "nbcluster_docs",
]

# Markdown pages (MyST); the teaching notebooks are not part of the site yet (they are
# rendered with outputs once myst-nb executes them from a cache).
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
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
