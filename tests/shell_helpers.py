"""An in-process IPython shell with nbcluster loaded, the two ways tests drive it, and the rule
its errors keep."""

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


def one_clear_line(message: str) -> bool:
    """Whether an error a user caused reads as the project promises: one line, nothing of a traceback."""
    return "\n" not in message.strip() and "Traceback" not in message and 'File "' not in message


def cell(ip: InteractiveShell, source: str) -> Any:
    """Run a cell and return its value; raise its error, as a notebook would show it."""
    result = ip.run_cell(source)
    if result.error_before_exec or result.error_in_exec:
        raise result.error_before_exec or result.error_in_exec
    return result.result
