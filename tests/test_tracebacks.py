"""What a failed item's traceback shows: the whole exception, as Python would print it.

Real items on the shared cluster (and in the kernel, `--local`) raise an `ExceptionGroup`
whose first member carries a note and a `raise ... from` cause; the cell's error text must
show every part, with the cell's own lines, and no frame of nbcluster's.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tests.shell_helpers import cell

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup and add_note are Python 3.11+")

# Line 1 of the notebook cell is its `%%distribute` line: "Cell line N" counts from there.
CELL = """\
def check(v):
    try:
        {}[v]
    except KeyError as e:
        raise ValueError("no such key") from e

try:
    check(x)
except ValueError as e:
    e.add_note(f"checked item x={x}")
    raise ExceptionGroup("item checks failed", [e, TypeError("bad type")])
"""


@pytest.mark.parametrize("where", ["", " --local"])
def test_a_failed_item_shows_group_members_notes_and_causes(
    shell: InteractiveShell, cluster: Any, capsys: Any, where: str
) -> None:
    capsys.readouterr()
    res = cell(shell, f'%%distribute --over "x in [7]"{where} --into group_res\n{CELL}')
    assert res is None and shell.user_ns["group_res"].counts()["failed"] == 1
    err = capsys.readouterr().err
    assert "1/1 items failed: ExceptionGroup at item 0 (x=7)" in err
    shown = [
        "  + Exception Group Traceback (most recent call last):",
        "  |   Cell line 12",
        "  | ExceptionGroup: item checks failed (2 sub-exceptions)",
        "    |   Cell line 4, in check",  # the cause, inside the first member
        "    | KeyError: 7",
        "    | The above exception was the direct cause of the following exception:",
        "    |   Cell line 6, in check",
        "    |     raise ValueError(\"no such key\") from e",
        "    | ValueError: no such key",
        "    | checked item x=7",  # the note
        "    | TypeError: bad type",
    ]
    lines = err.splitlines()
    found = [next((n for n, line in enumerate(lines) if line.startswith(want)), None) for want in shown]
    assert None not in found, [want for want, n in zip(shown, found, strict=True) if n is None]
    assert found == sorted(found)  # in Python's order
    assert "nbcluster" not in err.replace("nbcluster: ", "")  # no frame of nbcluster's own
    with pytest.raises(Exception) as raised:  # still the item's own exception, to re-raise
        shell.user_ns["group_res"].raise_first()
    assert type(raised.value).__name__ == "ExceptionGroup"  # a builtin from 3.11 (ruff targets 3.10)
    assert [type(e) for e in raised.value.exceptions] == [ValueError, TypeError]


def test_an_exception_class_the_kernel_cannot_import_is_shown_by_name(
    shell: InteractiveShell, cluster: Any, capsys: Any, tmp_path: Any
) -> None:
    # A module that exists on the workers' path only while the item runs: the kernel can
    # neither import its class nor unpickle the exception.
    shell.user_ns["folder"] = str(tmp_path)
    capsys.readouterr()
    source = (
        "import importlib, pathlib, sys\n"
        "path = pathlib.Path(folder) / f'onlyhere{x}.py'\n"
        "path.write_text('class Odd(Exception):\\n    pass\\n')\n"
        "sys.path.insert(0, folder)\n"
        "mod = importlib.import_module(f'onlyhere{x}')\n"
        "sys.path.remove(folder)\n"
        "path.unlink()\n"
        "raise mod.Odd('only on the worker')\n"
    )
    cell(shell, f'%%distribute --over "x in [1]" --into odd_res\n{source}')
    err = capsys.readouterr().err
    assert "onlyhere1.Odd: only on the worker" in err
    assert "  Cell line 9\n    raise mod.Odd('only on the worker')\n" in err
