"""What a kernel's first ``%%distribute`` cell would wait for is loaded before it.

`%load_ext nbcluster` loads the kernel side of a run (the engine, the widgets:
`nbcluster.KERNEL_SIDE`): a fresh kernel's first cell paid 0.17 s of imports. It loads them
before it returns, not in a thread: a `multiprocessing.Pool` forked while a thread held an
import lock deadlocked in its first import (seen in `bench/real_work.py --first-cell`).
"""

from __future__ import annotations

import subprocess
import sys

import nbcluster


def test_load_ext_loads_the_kernel_side_of_a_run() -> None:
    # A fresh process: this one imported the engine long ago. Nothing in it asks for a run.
    probe = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'nbcluster')\n"
        f"print(sorted(m for m in {nbcluster.KERNEL_SIDE!r} if m not in sys.modules))\n"
        "from nbcluster.cluster.launcher import discard_spare\n"
        "discard_spare()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]", done.stdout


def test_a_pool_forked_right_after_load_ext_can_import() -> None:
    # The peer every course times against: `Pool(2)` forked from the kernel just after
    # `%load_ext`; its processes import what the kernel had not (numpy.random here).
    probe = (
        "import multiprocessing\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "def draw(i):\n"
        "    import numpy.random\n"
        "    import sklearn.utils\n"
        "    return i\n"
        "shell = InteractiveShell.instance()\n"
        "shell.user_ns['draw'] = draw\n"  # the shell's module is __main__ now: pickled by name
        "shell.run_line_magic('load_ext', 'nbcluster')\n"
        "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
        "    print(pool.map(draw, range(4)))\n"
        "from nbcluster.cluster.launcher import discard_spare\n"
        "discard_spare()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[0, 1, 2, 3]", done.stdout
