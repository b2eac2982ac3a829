"""What the docs tests share: the docs' notebook executor, the screenshots' names, the modules whose docstrings are checked."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
#: Where the browser test writes the screenshots the docs and the README show.
SHOTS = ROOT / "docs" / "_static" / "screenshots"
NAMES = ("live-cell-and-sidebar", "sidebar", "frozen-picture")


def teaching_notebooks() -> ModuleType:
    """docs/_ext/teaching_notebooks.py, the docs' notebook executor (not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "teaching_notebooks", ROOT / "docs" / "_ext" / "teaching_notebooks.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Where every public function, class and method is checked: these packages with all their
# modules (a new module is checked as soon as it exists), and these single modules.
PACKAGES = (
    "nbcluster.cluster",
    "nbcluster.journal",
    "nbcluster.persist",
    "nbcluster.run",
    "nbcluster.worker",
    "nbcluster.metrics",
    "nbcluster.server",
    "nbcluster.widgets",
)
MODULES = (
    "nbcluster.teaching",
    "nbcluster._aio",
    "nbcluster._current",
    "nbcluster._wire",
    "nbcluster.cli",
    "nbcluster.magics",
    "nbcluster.commands",
    "nbcluster.config",
    "nbcluster.config_schema",
    "nbcluster._compat",
    "nbcluster._lazy",
    "nbcluster.errors",
)


def checked_modules() -> list[str]:
    """`PACKAGES`, each with every module in it, then `MODULES`."""
    found = []
    for package in PACKAGES:
        found.append(package)
        found += [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}.")]
    return found + list(MODULES)
