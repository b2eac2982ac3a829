"""`%%distribute` and `%distribute wait` through a real IPython shell, on the shared cluster."""

from __future__ import annotations

import re
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from nbcluster.run.results import Results
from tests.shell_helpers import cell


@pytest.fixture(autouse=True)
def _on_the_shared_cluster(shell: InteractiveShell, cluster: Any) -> None:
    """Every cell here runs on the shared cluster (made current after `shell`'s fresh start)."""



def test_cell_runs_per_item_with_notebook_names_and_is_the_output(shell: InteractiveShell) -> None:
    cell(shell, "factor = 3\ndef scale(v):\n    return v * factor")
    shell.user_ns.pop("res", None)  # the shell is IPython's one instance: an earlier test's name
    out = cell(shell, '%%distribute --over "x in range(4)"\nscale(x) + 1')
    assert isinstance(out, Results) and list(out) == [1, 4, 7, 10]
    assert shell.user_ns["_"] is out  # the cell's Out, like any cell value
    assert "res" not in shell.user_ns


def test_into_names_the_variable_and_shows_no_out(shell: InteractiveShell) -> None:
    assert cell(shell, '%%distribute --grid "a=[1, 2], b=[10, 20]" --into grid_res\na * b') is None
    assert list(shell.user_ns["grid_res"]) == [10, 20, 20, 40]


def test_errors_show_cell_lines_and_notebook_functions(shell: InteractiveShell, capsys: Any) -> None:
    cell(shell, "def inverse(v):\n    return 1 / v")
    capsys.readouterr()
    cell(shell, '%%distribute --over "x in [2, 0]" --into inv\ny = x\ninverse(y)')
    err = capsys.readouterr().err
    assert "1/2 items failed: ZeroDivisionError at item 1 (x=0)" in err
    assert "  Cell line 3\n    inverse(y)\n" in err
    assert ", line 2, in inverse\n    return 1 / v\n" in err
    assert "Cell In[" in err  # the notebook cell that defined `inverse`
    assert "(inv.errors lists the failures" in err  # the hint names the variable that holds them
    # Re-raised in a later cell: IPython shows the remote frames, not nbcluster's.
    shell.run_cell("inv.raise_first()")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert (
        "ZeroDivisionError" in shown and "----> 3 inverse(y)" in shown and "----> 2     return 1 / v" in shown
    )
    assert "nbcluster/distribute" not in shown


def test_without_into_the_hint_names_no_variable_that_does_not_exist(shell: InteractiveShell, capsys: Any) -> None:
    capsys.readouterr()
    cell(shell, '%%distribute --over "x in [1, 0]"\n1 / x')
    err = capsys.readouterr().err
    assert "1/2 items failed" in err and "`_` right after the cell" in err
    assert "results.errors" not in err
    assert cell(shell, "_.errors[0].index") == 1


def test_a_nested_over_target_unpacks_on_the_workers(shell: InteractiveShell) -> None:
    out = cell(shell, '%%distribute --over "(a, b), c in [((1, 2), 3), ((4, 5), 6)]"\na + b + c')
    assert list(out) == [6, 15]


def test_bad_input_is_a_usage_error(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="--over: evaluating 'nope' failed: NameError"):
        cell(shell, '%%distribute --over "x in nope"\nx')
    with pytest.raises(UsageError, match=r"unknown option --ovr; did you mean --over\?"):
        cell(shell, "%%distribute --ovr x in y\nx")
    with pytest.raises(UsageError, match=r"^--gpus needs a number above 0, got 0$"):  # checked once, by `launch`
        cell(shell, "%%distribute --gpus 0\nx")
    with pytest.raises(UsageError, match=r"`missing` \(cell line 2\) is not defined"):
        cell(shell, "%%distribute\nmissing + 1")
    with pytest.raises(UsageError, match="only takes `wait NAME`"):
        cell(shell, "%distribute --over x")
    assert cell(shell, "1 + 1") == 2  # the kernel is fine


def test_no_wait_then_wait(shell: InteractiveShell, capsys: Any) -> None:
    cell(shell, '%%distribute --over "x in range(3)" --into later --no-wait\nprint("item", x)\nx * 2')
    assert isinstance(shell.user_ns["later"], Results)
    waited = cell(shell, "%distribute wait later")
    assert waited is shell.user_ns["later"] and list(waited) == [0, 2, 4]
    assert "item 2\n" in capsys.readouterr().out
    with pytest.raises(UsageError, match="`nothing` is not defined"):
        cell(shell, "%distribute wait nothing")


def test_local_runs_in_the_kernel(shell: InteractiveShell) -> None:
    out = cell(shell, '%%distribute --over "x in range(3)" --local\nimport os\nos.getpid()')
    import os

    assert list(out) == [os.getpid()] * 3


def test_display_in_an_item_shows_in_the_cell(shell: InteractiveShell) -> None:
    cell(
        shell,
        "class Card:\n    def _repr_html_(self):\n        return '<b>card</b>'\n    def __repr__(self):\n        return 'Card()'",
    )
    with capture_output() as shown:
        cell(shell, '%%distribute --over "x in range(2)" --into cards\ndisplay({"x": x})\ndisplay(Card())\nx')
    rich = [o.data for o in shown.outputs]
    assert {"text/plain": "{'x': 0}"} in rich and {"text/plain": "{'x': 1}"} in rich
    assert {"text/plain": "Card()", "text/html": "<b>card</b>"} in rich  # rendered as HTML in a notebook
    assert shell.user_ns["cards"].output(0) == "{'x': 0}\nCard()\n"
