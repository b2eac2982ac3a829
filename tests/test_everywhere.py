"""`--everywhere` (its own strategy, `distribute/everywhere.py`) on a cluster of its own.

A task pinned to a worker waits for that worker alone; when the worker leaves before
running it, the item must fail with a line saying so, while the other workers' items
finish, rather than leave the cell waiting forever.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from IPython.core.interactiveshell import InteractiveShell

from nbcluster import _compat, _current
from nbcluster.run.results import Results
from tests.shell_helpers import cell, magic


def test_the_item_of_a_worker_that_left_fails_and_the_others_finish(shell: InteractiveShell) -> None:
    magic(shell, "start --workers 2 --threads 1 --name everywhere")
    client = _current.client_for("everywhere")
    client.wait_for_workers(2)
    busy, free = sorted(_compat.workers(client))
    polled = threading.Event()  # never set: a wait between looks at the scheduler
    blocker = client.submit(time.sleep, 60, key="blocker", workers=[busy], pure=False)
    while not client.processing([busy])[busy]:  # its only thread taken: the cell's task will wait
        polled.wait(0.05)
    assert cell(shell, "%%distribute --everywhere --no-wait --into everywhere_res\nimport os\nos.getpid()") is None
    res = shell.user_ns["everywhere_res"]
    assert isinstance(res, Results)
    one_done = threading.Event()
    res.subscribe(lambda r: r.counts()["done"] and one_done.set())
    assert one_done.wait(60), res.counts()  # the free worker ran its item
    os.kill(client.run(os.getpid, workers=[busy])[busy], signal.SIGKILL)
    res.wait(60)
    assert res.counts() == {"total": 2, "done": 1, "failed": 1, "cancelled": 0, "running": 0}
    assert isinstance(res[free], int)  # the pid of the worker that stayed
    [error] = res.errors
    assert error.message == f"worker {busy} left the cluster before running the cell"
    assert res.params[error.index] == {"worker": busy}
    client.cancel(blocker)



def test_a_worker_that_just_joined_gets_its_item(shell: InteractiveShell) -> None:
    # --everywhere asks the scheduler for its workers when it starts: the worker added a
    # moment ago, after an earlier cell's link asked, counts.
    magic(shell, "start --workers 1 --threads 1 --name joined")
    assert cell(shell, "%%distribute --over 'x in range(2)' --into warm\nx") is None
    magic(shell, "scale 2")
    assert cell(shell, "%%distribute --everywhere --into pids\nimport os\nos.getpid()") is None
    pids = shell.user_ns["pids"]
    assert pids.ok and len(pids) == 2 and len(set(pids.values())) == 2


def test_everywhere_reaches_each_of_six_workers(shell: InteractiveShell) -> None:
    # distributed 2025.4.0 to 2026.6.x list at most 5 workers in `scheduler_info()`; a sixth
    # worker left out of that list was left out of --everywhere without a word.
    magic(shell, "start --workers 6 --threads 1 --name six")
    client = _current.client_for("six")
    client.wait_for_workers(6)
    assert cell(shell, "%%distribute --everywhere --into six_pids\nimport os\nos.getpid()") is None
    pids = shell.user_ns["six_pids"]
    assert pids.ok, pids.errors
    assert len(pids) == 6 and len(set(pids.values())) == 6
