"""An in-process IPython shell with nbcluster loaded, and the two ways tests drive it."""

from __future__ import annotations

from typing import Any

from IPython.core.interactiveshell import InteractiveShell


def load_shell() -> InteractiveShell:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbcluster")
    return ip


def magic(ip: InteractiveShell, line: str) -> Any:
    """`%cluster LINE`; a UsageError raises as it would end the cell."""
    return ip.run_line_magic("cluster", line)


def cell(ip: InteractiveShell, source: str) -> Any:
    """Run a cell and return its value; raise its error, as a notebook would show it."""
    result = ip.run_cell(source)
    if result.error_before_exec or result.error_in_exec:
        raise result.error_before_exec or result.error_in_exec
    return result.result
