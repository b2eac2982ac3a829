"""A lean worker: workers and the scheduler import only the nbcluster code they run.

Items are pickled by reference to `nbcluster.worker`, so a worker imports
`nbcluster` and `nbcluster.worker` on its first batch; both load their public names
lazily, and the worker-side modules import nothing from the kernel side. These tests run
real `%%distribute` cells (items, output, `display`, a failing item, a large captured value,
`--everywhere`, a cancelled `--no-wait` run) on a real cluster of their own, then read
`sys.modules` in the worker and scheduler processes.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from distributed import Client
from IPython.core.interactiveshell import InteractiveShell

from nbcluster import _current
from tests.shell_helpers import cell, magic

# What the kernel runs and a worker never does: none of it may be loaded on a worker.
KERNEL_SIDE = (
    "nbcluster.cluster.handle",
    "nbcluster.run.engine",
    "nbcluster.run.api",
    "nbcluster.run.results",
    "nbcluster.widgets",
    "nbcluster.server",
    "nbcluster.magics",
    "nbcluster.commands",
)


def kernel_side(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == k or m.startswith(k + ".") for k in KERNEL_SIDE)]


@pytest.fixture
def worked(shell: InteractiveShell) -> InteractiveShell:
    """A fresh 2-worker cluster that has run every kind of `%%distribute` cell."""
    magic(shell, "start --workers 2 --threads 1 --name lean")
    shell.user_ns["big"] = bytes(2_000_000)  # over 1 MB: scattered and pinned, not inline
    done = cell(shell, '%%distribute --over "x in range(30)"\nprint(x)\ndisplay(x)\nlen(big) + x')
    assert done[29] == 2_000_029
    failed = cell(shell, '%%distribute --over "x in range(3)"\n1 / (x - 1)')
    assert failed.counts()["failed"] == 1
    everywhere = cell(shell, "%%distribute --everywhere\nimport os\nos.getpid()")
    assert len(everywhere) == 2
    slow = cell(shell, '%%distribute --no-wait --over "x in range(40)"\nimport time\ntime.sleep(0.05)\nx')
    slow.cancel()
    return shell


def test_workers_that_ran_items_have_loaded_no_kernel_side_module(worked: InteractiveShell) -> None:
    client = _client(worked)
    per_worker = client.run(lambda: sorted(sys.modules))
    assert len(per_worker) == 2
    for address, modules in per_worker.items():
        assert "nbcluster.worker" in modules, address  # it did run items
        assert kernel_side(modules) == [], address


def test_the_scheduler_loads_the_metrics_plugin_and_no_kernel_side_module(worked: InteractiveShell) -> None:
    modules = _client(worked).run_on_scheduler(lambda: sorted(sys.modules))
    assert "nbcluster.metrics.plugin" in modules
    assert kernel_side(modules) == []


def test_import_nbcluster_loads_neither_dask_client_nor_ipython() -> None:
    probe = (
        "import sys, nbcluster\n"
        "heavy = ['distributed', 'IPython', 'ipywidgets', 'nbcluster.cluster.handle', 'nbcluster.run']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "assert set(nbcluster.__all__) <= set(dir(nbcluster))\n"
        "nbcluster.Results, nbcluster.start\n"  # a name's first use loads it
        "print('nbcluster.run.results' in sys.modules, 'nbcluster.cluster.handle' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "True True"]


# What only the supervisor runs: none of it may be loaded on a worker either.
SUPERVISOR_SIDE = ("nbcluster.cluster.supervisor", "nbcluster.cluster.deploy", "nbcluster.metrics.plugin")


def test_workers_import_nothing_of_the_supervisor(cluster) -> None:
    # Multiprocessing's spawn imports the main module again in every worker process: the
    # supervisor runs as `python -m nbcluster.cluster` (a package's __main__, which spawn
    # leaves alone), not as the supervisor module itself.
    per_worker = cluster.client.run(lambda: sorted(sys.modules))
    assert len(per_worker) == 2
    for address, modules in per_worker.items():
        assert [m for m in modules if m.startswith(SUPERVISOR_SIDE)] == [], address


def _client(shell: InteractiveShell) -> Client:
    return _current.client_for("lean")


def test_the_worker_package_imports_only_worker_side_modules() -> None:
    # What a worker unpickling `run_batch` loads, in a fresh process: the worker package
    # and the few cheap modules it names, nothing else of nbcluster's (and not even Dask's
    # Client: the worker process has it, but the package must not need it to load).
    probe = "import sys, nbcluster.worker\nprint(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    loaded = ast.literal_eval(out)
    allowed = {"nbcluster", "nbcluster._lazy", "nbcluster._start_up", "nbcluster._version", "nbcluster._wire", "nbcluster.config", "nbcluster.config_schema", "nbcluster.errors"}
    ours = [m for m in loaded if m.startswith("nbcluster")]
    assert [m for m in ours if m not in allowed and not m.startswith("nbcluster.worker")] == []
    assert "nbcluster.worker.context" in ours and "distributed" not in loaded


def test_nbcluster_distribute_stays_the_function_whichever_loads_first() -> None:
    # Loading the subpackage `nbcluster.distribute` (a worker, `%load_ext`) sets it as an
    # attribute of `nbcluster`; the function of that name must still be what users call.
    probe = (
        "import nbcluster.worker, nbcluster\n"
        "from nbcluster.run.api import distribute\n"
        "assert nbcluster.distribute is distribute, nbcluster.distribute\n"
        "print(nbcluster.distribute('x * 2', over='x in range(3)', local=True, namespace={}).values())\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[0, 2, 4]"
