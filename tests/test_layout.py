"""The test suite's own rules: shared code in helper modules, one `shell`, lanes that hold.

Read from the test files' syntax trees, except the last test, which runs a root-only test
module as an unprivileged user and reads what pytest says about it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from tests.lanes import LANES, lanes, root_skip

TESTS = Path(__file__).resolve().parent
TEST_FILES = sorted(TESTS.glob("test_*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_no_test_file_imports_another() -> None:
    # Shared code lives in helper modules (tests/*_helpers.py, *_service.py), so that running
    # or changing one test file never depends on another's names.
    found = []
    for path in TEST_FILES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert found == []


@pytest.mark.parametrize("fixture", ["shell", "slurm"])
def test_a_shared_fixture_is_defined_once_in_conftest(fixture: str) -> None:
    # `slurm`: a machine runs one slurmctld at a time, so two modules with their own would clash.
    where = [
        path.name
        for path in [TESTS / "conftest.py", *TEST_FILES]
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == fixture
    ]
    assert where == ["conftest.py"]


def test_every_lane_entry_names_what_exists() -> None:
    # A renamed test module or function would silently fall out of its lane.
    missing = []
    for pattern in LANES:
        module, _, test = pattern.partition("::")
        files = list(TESTS.glob(f"{module}.py"))
        if not files and "*" not in module:  # a pattern may wait for modules (test_hub*)
            missing.append(pattern)
        if test and not any(_functions(path, test) for path in files):
            missing.append(pattern)
    assert missing == []


def _functions(path: Path, pattern: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    functions = (n for n in ast.walk(_tree(path)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return [f for f in functions if fnmatchcase(f.name, pattern)]


def test_lanes_by_module_and_by_test() -> None:
    assert set(lanes("test_slurm", "test_anything")) == {"services", "root", "slow"}
    assert set(lanes("test_hub", "test_anything")) == {"services", "root", "slow"}
    assert lanes("test_magics", "test_kernel_killed_leaves_no_processes") == ("slow",)
    assert lanes("test_magics", "test_bad_input_raises_one_usage_error") == ()
    assert root_skip(0) is None
    skip = root_skip(1000)
    assert skip is not None and "needs root" in skip.kwargs["reason"]


def test_root_tests_skip_with_the_reason_when_not_root(tmp_path: Path) -> None:
    # Run as nobody (root drops to it with setpriv), on a root-only module; the skip comes
    # before any fixture, so no daemon is started.
    drop: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux's setpriv to become another user")
        drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    tmp_path.chmod(0o777)
    done = subprocess.run(
        [*drop, sys.executable, "-m", "pytest", "tests/test_netns.py", "-rs", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'base'}"],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "needs root" in out and " skipped" in out and "passed" not in out, out
