"""What the docs tests share: the docs' notebook executor and the screenshots' names."""

from __future__ import annotations

import importlib.util
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
