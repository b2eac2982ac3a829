"""What a kernel's first ``%%distribute`` cell would wait for is loaded before it.

`%load_ext nbcluster` loads the kernel side of a run (the engine, the widgets) in the
background (`nbcluster.KERNEL_SIDE`): a fresh kernel's first cell paid 0.17 s of imports.
"""

from __future__ import annotations

import subprocess
import sys

import nbcluster


def test_load_ext_loads_the_kernel_side_of_a_run_in_the_background() -> None:
    # A fresh process: this one imported the engine long ago. Nothing in it asks for a run.
    probe = (
        "import sys, threading, time\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'nbcluster')\n"
        f"wanted = {nbcluster.KERNEL_SIDE!r}\n"
        "deadline = time.monotonic() + 60\n"
        "while not all(m in sys.modules for m in wanted) and time.monotonic() < deadline:\n"
        "    threading.Event().wait(0.05)\n"
        "print(sorted(m for m in wanted if m not in sys.modules))\n"
        "from nbcluster.cluster.launcher import discard_spare\n"
        "discard_spare()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]", done.stdout
