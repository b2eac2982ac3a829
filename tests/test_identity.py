"""`--resume` never mixes results of different inputs (issue 37, defect 2), on real clusters.

A run's identity covers what its notebook functions read (`journal/store.py`): change a
global one of them reads, and `--resume` finds no journal and runs every item. Each item
appends its index to a log file on the workers' side, so a test counts what ran again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.config
import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster.journal import store as journal
from nbcluster.journal.store import fingerprint
from nbcluster.run.capture import capture
from nbcluster.run.cell import Cell, plan
from tests.kernel_session import kernel
from tests.shell_helpers import cell

F = """
import os
def f(x):
    with open(LOG, "a") as out:
        out.write(f"{x}\\n")
    if x >= 10 and not os.path.exists(FLAG):
        raise RuntimeError("not yet")
    return x * SCALE
"""
NO_JOURNAL = "nbcluster: --resume: no journal of this run (the same code, items and captured values) was found: running all 20 items"


@pytest.fixture
def journals(tmp_path: Path) -> Iterator[Path]:
    """A journal folder of the test's own."""
    where = tmp_path / "journals"
    with dask.config.set({"nbcluster.journal.path": str(where)}):
        yield where


def executions(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.fixture
def notebook(shell: InteractiveShell, cluster: Any, journals: Path, tmp_path: Path) -> InteractiveShell:
    """The shell on the shared cluster, with the issue's `f` (reading SCALE, FLAG and LOG)."""
    cell(shell, f"LOG = {str(tmp_path / 'log')!r}\nFLAG = {str(tmp_path / 'flag')!r}\nSCALE = 1\n{F}")
    return shell


def test_a_changed_global_is_another_run_and_resume_says_so(notebook: InteractiveShell, tmp_path: Path,
                                                            capsys: Any) -> None:  # fmt: skip
    cell(notebook, '%%distribute --over "x in range(20)" --into first\nf(x)')
    assert len(notebook.user_ns["first"].errors) == 10  # items 10-19 failed
    cell(notebook, f"SCALE = 10\nopen({str(tmp_path / 'flag')!r}, 'w').close()")
    capsys.readouterr()
    cell(notebook, '%%distribute --over "x in range(20)" --resume --into second\nf(x)')
    assert list(notebook.user_ns["second"]) == [x * 10 for x in range(20)]
    out = capsys.readouterr().out
    assert out.splitlines().count(NO_JOURNAL) == 1 and "resumed" not in out, out
    assert sorted(executions(tmp_path / "log")[20:]) == list(range(20))  # every item ran again


def test_the_same_run_unchanged_resumes(notebook: InteractiveShell, tmp_path: Path, capsys: Any) -> None:
    cell(notebook, '%%distribute --over "x in range(20)" --into first\nf(x)')
    (tmp_path / "flag").touch()  # a file the code checks: not an input of the run
    capsys.readouterr()
    cell(notebook, '%%distribute --over "x in range(20)" --resume --into second\nf(x)')
    assert list(notebook.user_ns["second"]) == list(range(20))
    assert "nbcluster: resumed 10/20 items from the run of" in capsys.readouterr().out
    assert sorted(executions(tmp_path / "log")[20:]) == list(range(10, 20))  # only the failed ones


def test_distribute_a_function_that_reads_a_global(cluster: Any, journals: Path, tmp_path: Path,
                                                   capsys: Any) -> None:  # fmt: skip
    log = tmp_path / "log"
    ns: dict[str, Any] = {"__name__": "__main__", "LOG": str(log), "FLAG": str(tmp_path / "flag"), "SCALE": 1}
    exec(compile(F, "<notebook>", "exec"), ns)
    first = nbcluster.distribute(ns["f"], over=range(20))
    assert len(first.errors) == 10
    (tmp_path / "flag").touch()
    ns["SCALE"] = 10
    capsys.readouterr()
    second = nbcluster.distribute(ns["f"], over=range(20), resume=True)
    assert second.values() == [x * 10 for x in range(20)]
    assert capsys.readouterr().out.splitlines().count(NO_JOURNAL) == 1
    assert sorted(executions(log)[20:]) == list(range(20))
    third = nbcluster.distribute(ns["f"], over=range(20), resume=True)  # unchanged: nothing runs
    assert third.values() == [x * 10 for x in range(20)]
    assert "nbcluster: resumed 20/20 items" in capsys.readouterr().out
    assert len(executions(log)) == 40


def test_resume_without_any_journal_says_so_once(notebook: InteractiveShell, capsys: Any) -> None:
    capsys.readouterr()
    cell(notebook, '%%distribute --over "x in range(20)" --resume --into res\nx')
    assert capsys.readouterr().out.splitlines() == [NO_JOURNAL]


SETUP = """%load_ext nbcluster
%cluster use ident
import numpy as np
class Table:  # a notebook class: cloudpickle tags it with an id of this kernel's own
    def __init__(self, data):
        self.data = data
    def at(self, x):
        return int(self.data[x])
TABLE = Table(np.arange(200_000))  # 1.6 MB: the function's pickle is over 1 MB, shipped apart
LOG, FLAG = {log!r}, {flag!r}
def g(x):
    import os
    with open(LOG, "a") as out:
        out.write(f"{{x}}\\n")
    if x >= 5 and not os.path.exists(FLAG):
        raise RuntimeError("not yet")
    return TABLE.at(x) * 2
"""


def test_a_function_over_1_mb_resumes_in_a_new_kernel(runtime_dir: Path, tmp_path: Path) -> None:
    log, flag, folder = tmp_path / "log", tmp_path / "flag", tmp_path / "journals"
    env = {"DASK_NBCLUSTER__JOURNAL__PATH": str(folder)}
    run = '%%distribute --over "x in range(10)" --into res --resume\ng(x)'
    handle = nbcluster.start(workers=1, threads=1, name="ident")
    try:
        with kernel(env=env) as k:
            k.run(SETUP.format(log=str(log), flag=str(flag))).ok()
            assert "sent g (1.6 MB) once to each of 1 workers" in k.run(run).ok().text
            assert k.value("len(res.errors)") == 5
        flag.touch()
        with kernel(env=env) as k:  # another process: another ipykernel file name for each cell
            k.run(SETUP.format(log=str(log), flag=str(flag))).ok()
            reply = k.run(run).ok()
            assert "nbcluster: resumed 5/10 items from the run of" in reply.text, reply.text
            assert k.value("res.values()") == [x * 2 for x in range(10)]
        assert sorted(executions(log)[10:]) == [5, 6, 7, 8, 9]
        assert journal.load(journal.journals(where=folder)[0]).state == "complete"
    finally:
        handle.stop()


def test_the_identity_covers_what_notebook_functions_read() -> None:
    source = "def g(x):\n    return x * SCALE\ndef f(x, k=K):\n    return g(x) + k + len(BIG)\n"
    run_cell = Cell.parse("f(x)", filename="<c>", first_line=2)
    items = plan(over="x in range(3)", grid=None, zip=None, evaluate=lambda text, _: eval(text))

    def ident(**values: Any) -> str | None:
        ns: dict[str, Any] = {"__name__": "__main__", "SCALE": 1, "K": 0, "BIG": np.zeros(200_000)}
        ns.update(values)
        exec(compile(source, "/tmp/ipykernel_1/cell.py", "exec"), ns)
        return fingerprint(items, run_cell, None, None, capture(run_cell.free_names(["x"]), ns))

    same = ident()
    assert same is not None and ident() == same
    assert ident(SCALE=2) != same  # a global of a function the captured one calls
    assert ident(K=1) != same  # read when the function is defined: its default
    assert ident(BIG=np.ones(200_000)) != same  # a large array, by its bytes


def test_a_function_hashes_the_same_whatever_else_its_kernel_has_imported() -> None:
    # The same function in a kernel with `os` (and globals named like its attributes) and in
    # one without (notebook 07's resume lesson): only the globals it loads count, by value.
    from nbcluster.journal.store import value_hash

    src = "def f(i):\n    import os\n    return os.path.join(LOG, str(i))\n"
    bare: dict[str, Any] = {"__name__": "__main__", "LOG": "/tmp"}
    busy: dict[str, Any] = {"__name__": "__main__", "LOG": "/tmp", "os": os, "path": 1, "join": 2}
    other: dict[str, Any] = {"__name__": "__main__", "LOG": "/var"}
    for namespace in (bare, busy, other):
        exec(src, namespace)
    assert value_hash(bare["f"]) == value_hash(busy["f"])
    assert value_hash(bare["f"]) != value_hash(other["f"])


def test_a_large_captured_array_is_hashed_by_the_digest_of_its_content() -> None:
    # A large plain array the cell reads by name is hashed by the digest it is shipped by (computed
    # once), in the same walk as the rest: the same content gives the same identity, other bytes another.
    run_cell = Cell.parse("x + float(BIG[0])", filename="<c>", first_line=2)
    items = plan(over="x in range(3)", grid=None, zip=None, evaluate=lambda text, _: eval(text))

    def ident(big: np.ndarray) -> str | None:
        captured = capture(run_cell.free_names(["x"]), {"__name__": "__main__", "BIG": big})
        assert "BIG" in captured.large  # shipped by its digest, not pickled with the context
        return fingerprint(items, run_cell, None, None, captured)

    same = ident(np.zeros(200_000))
    assert same is not None and ident(np.zeros(200_000)) == same
    assert ident(np.ones(200_000)) != same
    assert ident(np.zeros(200_001)) != same
