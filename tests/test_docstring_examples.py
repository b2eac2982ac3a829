"""The ``>>>`` examples in nbcluster's docstrings run, for real, with `doctest`.

The API reference shows these examples, so they are held to what the docs' pages are held
to: each one runs, and its printed output is compared with what the docstring says. They
are collected from `nbcluster` itself and every module `test_docstrings` checks (so the
names of ``nbcluster.__all__``, `Results`, `ClusterHandle` and their members too).

Each docstring's examples run on their own, in a namespace holding its module's names and
`nbcluster` (imported, as a notebook would have done) and ``get_ipython`` (an in-process
IPython shell). Examples that use a cluster get a real one: this process's unnamed local
cluster (``local``, 2 workers x 1 thread, in a registry of this file's own), which
``nbcluster.start()`` in an example reuses instead of starting another. Examples that
stop it or change its size run after the others; the next one that needs it finds it
started again.

An example that cannot run here (it needs a GPU, a batch system, a gateway, a hub, a
machine elsewhere) is marked ``# doctest: +SKIP`` and says why, as the docs' pages do with
``% not executed: WHY``: ``# not executed: WHY`` in the example itself or on the line just
above it (for a run of skipped examples, above the first).
"""

from __future__ import annotations

import doctest
import importlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbcluster
from nbcluster import _current
from tests.docs_helpers import checked_modules

NOT_EXECUTED = re.compile(r"# not executed: .{15,}")
# What an example does to the shared cluster that later examples would notice: these run
# last, those that stop it after those that resize it (each stop costs the next one a start).
RESIZES, STOPS = re.compile(r"\.(scale|adapt)\("), re.compile(r"\.stop\(")
# What marks an example that needs a cluster: the package's calls, a handle's methods.
USES_A_CLUSTER = re.compile(r"\bnbcluster\.|\bcluster\.")


def docstring_tests() -> list[doctest.DocTest]:
    """Every docstring with ``>>>`` examples, in the order they run (see `RESIZES`)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found: dict[str, doctest.DocTest] = {}
    for module_name in ["nbcluster", *checked_modules()]:
        module = importlib.import_module(module_name)
        # `find` keeps the objects defined in `module`, so a name re-exported elsewhere is
        # collected once, from where it is defined; each test's globals are a copy of its
        # module's.
        for test in finder.find(module, module_name):
            if test.examples:
                found.setdefault(test.name, test)

    def does(test: doctest.DocTest, what: re.Pattern[str]) -> bool:
        return any(what.search(e.source) for e in test.examples)

    return sorted(found.values(), key=lambda t: (does(t, STOPS), does(t, RESIZES), t.name))


def unexplained_skips(test: doctest.DocTest) -> list[str]:
    """The skipped examples of `test` that do not say why they are not executed."""
    lines = (test.docstring or "").splitlines()
    out = []
    explained = False  # the run of skipped examples this one belongs to said why
    for example in test.examples:
        if not example.options.get(doctest.SKIP):
            explained = False
            continue
        above = lines[example.lineno - 1] if example.lineno > 0 else ""
        if NOT_EXECUTED.search(example.source) or NOT_EXECUTED.search(above):
            explained = True
        if not explained:
            out.append(example.source.strip())
    return out


@pytest.fixture(scope="module")
def _examples_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A registry of this module's own, with no cluster current; what is left in it is stopped."""
    from nbcluster.cluster.launcher import discard_spare

    directory = tmp_path_factory.mktemp("examples-runtime")
    before_dir, before = os.environ.get("NBCLUSTER_RUNTIME_DIR"), _current._current
    os.environ["NBCLUSTER_RUNTIME_DIR"] = str(directory)
    _current._current = None
    try:
        yield directory
    finally:
        for name, handle in list(_current._handles.items()):
            if handle.directory == directory:
                _current.forget(name)
        for handle in nbcluster.clusters(runtime_dir=directory):
            handle.stop()
        discard_spare()  # `load_ipython_extension`'s example keeps a spare supervisor warm
        if before_dir is None:
            os.environ.pop("NBCLUSTER_RUNTIME_DIR", None)
        else:
            os.environ["NBCLUSTER_RUNTIME_DIR"] = before_dir
        _current._current = None
        if before is not None and _current._alive(before):
            _current.use(before)  # and its client Dask's default again, as before this module


TESTS = docstring_tests()
ON_A_CLUSTER = [t for t in TESTS if any(USES_A_CLUSTER.search(e.source) for e in t.examples)]
ALONE = [t for t in TESTS if t not in ON_A_CLUSTER]


def run_examples(test: doctest.DocTest, journals: Path) -> None:
    """Run the examples of one docstring; fail with doctest's report of each that differs.

    Run journals go to `journals`, this docstring's own: two docstrings that run the same
    cell on the same items would otherwise see each other's journal (and print its hint).
    """
    import dask.config
    from IPython.core.interactiveshell import InteractiveShell

    unexplained = unexplained_skips(test)
    assert not unexplained, (
        f"{test.name}: a skipped example must say why, as `# not executed: WHY` in it or on the "
        f"line above: {unexplained}"
    )
    if all(e.options.get(doctest.SKIP) for e in test.examples):
        pytest.skip("every example of this docstring is marked not executed")
    test.globs.update(nbcluster=nbcluster, get_ipython=InteractiveShell.instance)
    if any("load_ext" in e.source for e in test.examples):
        # As in a fresh notebook: an earlier test in this process may have loaded the
        # extension into the shared shell, and `%load_ext` would then only say so.
        InteractiveShell.instance().extension_manager.loaded.discard("nbcluster")
    report = io.StringIO()
    with dask.config.set({"nbcluster.journal.path": str(journals)}):
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=report.write)
    assert result.failed == 0, f"{test.name}: {result.failed} example(s) failed\n{report.getvalue()}"


@pytest.mark.parametrize("test", ALONE, ids=[t.name for t in ALONE])
def test_docstring_example_runs(test: doctest.DocTest, _examples_registry: Path, tmp_path: Path) -> None:
    run_examples(test, tmp_path)


# In the slow lane (tests/lanes.py): these start, resize and stop clusters.
@pytest.mark.parametrize("test", ON_A_CLUSTER, ids=[t.name for t in ON_A_CLUSTER])
def test_docstring_example_runs_on_a_cluster(
    test: doctest.DocTest, _examples_registry: Path, tmp_path: Path
) -> None:
    nbcluster.start(workers=2, threads=1)  # this process's unnamed cluster: reused, or started again
    run_examples(test, tmp_path)


def test_the_skip_check_refuses_what_it_should() -> None:
    # A skip without a reason is refused; one with a reason, in the example or above it, is not.
    parser = doctest.DocTestParser()
    bare = parser.get_doctest(">>> f()  # doctest: +SKIP\n", {}, "bare", None, 0)
    explained = parser.get_doctest(
        ">>> # not executed: it needs a GPU, tests/test_gpu.py runs it\n>>> f()  # doctest: +SKIP\n"
        ">>> g()  # doctest: +SKIP\n>>> 1\n1\n>>> h()  # doctest: +SKIP\n"
        ">>> k()  # not executed: it needs SLURM, see tests/test_slurm.py  # doctest: +SKIP\n",
        {}, "explained", None, 0,
    )  # fmt: skip
    assert unexplained_skips(bare) == ["f()  # doctest: +SKIP"]
    assert unexplained_skips(explained) == ["h()  # doctest: +SKIP"]
