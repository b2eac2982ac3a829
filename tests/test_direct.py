"""Direct batches: a run's first seconds go to the workers without the scheduler, one a thread.

On real clusters: the suite's shared one, and one of this module's own whose worker dies on
purpose. What a user would notice: a small cell's items never become scheduler tasks, and
still show in the live view's task stream; a long run's later batches are Dask tasks again;
a worker that cannot serve direct batches, is paused, or dies under one, costs nothing but
time: every item comes back once, right; a kernel that dies mid-run leaves nothing queued
to start after it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.config
import pytest
from distributed import Event

import nbcluster
from nbcluster.cluster.handle import ClusterHandle, start
from nbcluster.run.api import distribute
from nbcluster.worker import AHEAD_S, GAP_S, VERSION, FirstAhead, Order
from tests.waiting import until

#: What an item reports: its value, whether it ran as a scheduler task, and on which worker.
WHERE = (
    "from distributed import get_worker\n"
    "from nbcluster._compat import running_task_key\n"
    "(x, running_task_key() is not None, get_worker().address)"
)


def _tasks_seen(client: Any, run_id: str) -> int:
    """How many of the run's batches the scheduler has had as tasks (its recent transitions)."""

    def count(dask_scheduler: Any) -> int:
        return len({t[0] for t in dask_scheduler.transition_log if str(t[0]).startswith(f"distribute-{run_id}-")})

    return int(client.run_on_scheduler(count))


def test_a_small_cell_never_becomes_a_scheduler_task_and_shows_in_the_task_stream(cluster: Any) -> None:
    client = cluster.client
    res = distribute(WHERE, over="x in range(8)", namespace={})
    assert res.ok and [v[0] for v in res] == list(range(8))
    assert not any(as_task for _, as_task, _ in res), "every item ran in a direct batch"
    workers = set(client.scheduler_info()["workers"])
    assert {address for _, _, address in res} <= workers
    assert _tasks_seen(client, res.run_id) == 0

    # The live view's task stream still has the run's batches, on the workers that ran them
    # (each batch's event leaves its worker with the answer).
    def mine() -> list[dict[str, Any]]:
        snapshot = client.sync(client.scheduler.nbcluster_metrics)
        return [t for t in snapshot["tasks"] if t["key"].startswith(f"distribute-{res.run_id}-")]

    assert until(mine, 10), "the run's batches never reached the task stream"
    drawn = mine()
    assert {t["worker"] for t in drawn} <= workers
    assert all(t["prefix"] == "distribute" and t["status"] == "ok" and t["stop"] >= t["start"] for t in drawn)


def test_after_the_direct_time_the_batches_are_dask_tasks(cluster: Any) -> None:
    client = cluster.client
    cell = "import time\ntime.sleep(0.02)\n" + WHERE
    with dask.config.set({"nbcluster.distribute.direct": "0.15s"}):
        res = distribute(cell, over="x in range(60)", namespace={})
    assert res.ok and [v[0] for v in res] == list(range(60))
    ran_as_task = [as_task for _, as_task, _ in res]
    assert not ran_as_task[0], "the run's first batch went direct"
    assert ran_as_task[-1], "its last, after 0.15 s, was a Dask task"
    assert _tasks_seen(client, res.run_id) > 0

    with dask.config.set({"nbcluster.distribute.direct": "0s"}):
        res = distribute(WHERE, over="x in range(8)", namespace={})
    assert all(as_task for _, as_task, _ in res), "0s: never direct"


def test_a_worker_of_another_nbcluster_version_gets_tasks_and_the_cell_is_right(runtime_dir: Path, tmp_path: Path) -> None:
    # The cluster's one worker runs a copy of nbcluster whose direct requests are of another
    # version (as an older release's would be): it cannot serve this kernel's direct batches,
    # so every batch goes through the scheduler, and the results are the same.
    old = tmp_path / "old"
    shutil.copytree(Path(nbcluster.__file__).parent, old / "nbcluster", ignore=shutil.ignore_patterns("labextension"))
    module = old / "nbcluster" / "worker" / "__init__.py"
    module.write_text(module.read_text().replace(f"VERSION = {VERSION}\n", f"VERSION = {VERSION + 1000}\n"))
    handle = start(workers=0, name="old-direct")
    security = handle.security
    assert security is not None
    env = {**os.environ, "PYTHONPATH": str(old)}
    with (tmp_path / "worker.log").open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", handle.address, "--nthreads", "1", "--host",
             "127.0.0.1", "--no-dashboard", "--tls-ca-file", str(security.tls_ca_file),
             "--tls-cert", str(security.tls_client_cert), "--tls-key", str(security.tls_client_key)],
            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        handle.client.wait_for_workers(1, timeout=60)
        where = "import nbcluster\n" + WHERE + " + (nbcluster.__file__,)"
        for _ in range(2):  # and the next cell, once the kernel knows
            res = distribute(where, over="x in range(8)", namespace={}, on=handle.client)
            assert res.ok and [v[0] for v in res] == list(range(8))
            assert all(as_task for _, as_task, _, _ in res), "a batch went direct to a worker that cannot serve it"
            assert {path for *_, path in res} == {str(old / "nbcluster" / "__init__.py")}
    finally:
        worker.kill()
        worker.wait(timeout=30)
        handle.stop()


def test_a_paused_worker_refuses_and_its_batch_runs_elsewhere(cluster: Any) -> None:
    client = cluster.client
    first, *_ = sorted(client.scheduler_info()["workers"])

    def pause(paused: bool, fraction: Any, dask_worker: Any = None) -> Any:
        # As past its memory limit: with a pause fraction of almost nothing, the worker's own
        # memory monitor keeps it paused (it would undo a bare status change within 0.1 s).
        # The fraction it had comes back, to be set again.
        from distributed.core import Status

        manager = dask_worker.memory_manager
        before, manager.memory_pause_fraction = manager.memory_pause_fraction, fraction
        dask_worker.status = Status.paused if paused else Status.running
        return before

    before = client.run(pause, True, 1e-9, workers=[first])[first]
    try:
        res = distribute(WHERE, over="x in range(8)", namespace={})
    finally:
        client.run(pause, False, before, workers=[first])
    assert res.ok and [v[0] for v in res] == list(range(8))
    # No direct batch ran there, and the refused one went through the scheduler (where Dask
    # may still have placed a task on that worker before it heard of the pause: a race of
    # Dask's own, not asserted here).
    assert first not in {address for _, as_task, address in res if not as_task}
    assert any(as_task for _, as_task, _ in res)


#: Item 0 prints and ends at once; every later item waits for the test's go-ahead.
FIRST_THEN_BLOCKED = (
    "from distributed import Event\n"
    "from distributed.worker import thread_state\n"
    "if x:\n"
    "    Event(f'{tag}-go').wait()\n"
    "else:\n"
    "    print('item zero')\n"
    "(x, thread_state.key)"
)


def test_a_first_batch_that_goes_on_sends_its_first_item_ahead_and_never_twice(cluster: Any) -> None:
    # Item 1 blocks right behind item 0 in the same batch (no batch of one item first):
    # item 0's result and output still come at once, and nothing comes twice at the end.
    tag = uuid.uuid4().hex[:8]
    first = threading.Event()
    res = distribute(
        FIRST_THEN_BLOCKED, over="x in range(40)", namespace={"tag": tag}, wait=False,
        progress=lambda r: r.counts()["done"] and first.set(),
    )  # fmt: skip
    try:
        assert first.wait(30), res.counts()
        assert res.counts() == {"total": 40, "done": 1, "failed": 0, "cancelled": 0, "running": 39}
        assert res.output(0) == "item zero\n"
    finally:
        Event(f"{tag}-go", client=cluster.client).set()
    assert res.wait(60).ok
    assert [v[0] for v in res] == list(range(40))
    assert res[0][1] == res[1][1], "items 0 and 1 ran in one batch"
    assert res.output(0) == "item zero\n" and all(res.output(i) == "" for i in range(1, 40))


def test_a_first_batch_that_ends_at_once_answers_once(cluster: Any) -> None:
    # The common case, every small cell: the first batch is the first item and more, and
    # its answer is the only message (nothing went ahead: the worker says so).
    res = distribute(
        "from distributed.worker import thread_state\n(x, thread_state.key)", over="x in range(8)", namespace={}
    )
    assert res.ok and [v[0] for v in res] == list(range(8))
    assert res[0][1] == res[1][1], "the first batch held more than the first item"


@pytest.fixture(scope="module")
def mortal() -> Iterator[ClusterHandle]:
    handle = start(workers=2, threads=1, name="direct-crash")
    try:
        handle.client.wait_for_workers(2, timeout=60)
        yield handle
    finally:
        handle.stop()


def test_a_worker_that_dies_under_a_direct_batch_costs_its_items_one_run_more(
    mortal: ClusterHandle, tmp_path: Path
) -> None:
    # Item 5 kills its worker the first time it runs; every item notes each run in a file.
    cell = (
        "import os\n"
        "from nbcluster._compat import running_task_key\n"
        "with open(f'{folder}/{x}', 'a') as f:\n"
        "    f.write('task\\n' if running_task_key() else 'direct\\n')\n"
        "if x == 5 and not os.path.exists(f'{folder}/died'):\n"
        "    open(f'{folder}/died', 'w').close()\n"
        "    os._exit(1)\n"
        "x * 10"
    )
    res = distribute(cell, over="x in range(8)", namespace={"folder": str(tmp_path)}, on=mortal.client)
    assert res.ok and list(res) == [x * 10 for x in range(8)]
    runs = {x: (tmp_path / str(x)).read_text().split() for x in range(8)}
    assert runs[5] == ["direct", "task"], "it died in a direct batch, and ran once more as a task"
    assert all(len(r) <= 2 for r in runs.values()), runs
    mortal.client.wait_for_workers(2, timeout=60)
    assert list(distribute("x + 1", over="x in range(8)", namespace={}, on=mortal.client)) == list(range(1, 9))


DYING_KERNEL = """
import os, signal, time
import nbcluster
nbcluster.use({name!r})
LOG = {log!r}
def item(i):
    import time
    with open(LOG, "a") as f:
        f.write(f"start {{i}}\\n")
    time.sleep(0.3)
    with open(LOG, "a") as f:
        f.write(f"end {{i}}\\n")
    return i
runs = nbcluster.distribute(item, over=range(20), batch=1, wait=False)
while not os.path.exists(LOG) or open(LOG).read().count("start") < 2:
    time.sleep(0.01)
with open(LOG, "a") as f:
    f.write("killed\\n")
os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a kernel
"""


def test_a_kernel_that_dies_mid_run_leaves_no_batch_to_start_after_it(mortal: ClusterHandle, tmp_path: Path) -> None:
    # As with Dask tasks, whose scheduler drops a dead client's queued ones: what was running
    # ends, and nothing of the run starts after the kernel died (a direct batch queued on a
    # worker would still run, and its items again under --resume).
    def idle(dask_worker: Any) -> bool:  # nothing runs in its thread pool, nothing waits there
        return not dask_worker.active_threads and dask_worker.executors["default"]._work_queue.empty()

    log = tmp_path / "items.log"
    script = tmp_path / "kernel.py"
    script.write_text(DYING_KERNEL.format(name=mortal.name, log=str(log)))
    kernel = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert kernel.returncode == -9, kernel.stdout + kernel.stderr[-2000:]
    assert until(lambda: all(mortal.client.run(idle).values()), 30), "the workers never went idle"
    lines = log.read_text().split("\n")
    after = lines[lines.index("killed") + 1 :]
    assert not [line for line in after if line.startswith("start")], lines
    assert sorted(line.split()[1] for line in lines if line.startswith("start")) == sorted(
        line.split()[1] for line in lines if line.startswith("end")
    ), "what was running when the kernel died ran to its end"


def test_a_first_item_sent_ahead_is_not_run_again_when_its_worker_dies(
    mortal: ClusterHandle, tmp_path: Path
) -> None:
    # Item 0 went ahead; item 1, in the same batch, then kills the worker (once). The rest
    # runs again; item 0, delivered already, does not.
    tag = uuid.uuid4().hex[:8]
    arrived = Event(f"{tag}-first-in", client=mortal.client)
    cell = (
        "import os\n"
        "from distributed import Event\n"
        "with open(f'{folder}/{x}', 'a') as f:\n"
        "    f.write('ran\\n')\n"
        "if x == 1 and not os.path.exists(f'{folder}/died'):\n"
        "    Event(f'{tag}-first-in').wait()\n"
        "    open(f'{folder}/died', 'w').close()\n"
        "    os._exit(1)\n"
        "x * 10"
    )
    res = distribute(
        cell, over="x in range(8)", namespace={"folder": str(tmp_path), "tag": tag}, on=mortal.client,
        progress=lambda r: r.counts()["done"] and arrived.set(),
    )  # fmt: skip
    assert res.ok and list(res) == [x * 10 for x in range(8)]
    assert (tmp_path / "died").exists()
    assert (tmp_path / "0").read_text().split() == ["ran"], "item 0 ran once"
    assert (tmp_path / "1").read_text().split() == ["ran", "ran"]
    mortal.client.wait_for_workers(2, timeout=60)


def test_whether_a_first_item_goes_ahead_is_decided_once() -> None:
    # The batch's end (its thread) and the deadline (the worker's loop) race: whichever
    # comes first decides, and the answer leaves the first item out exactly when it went.
    async def scenario(order: str) -> tuple[list[Any], bool]:
        loop = asyncio.get_running_loop()
        sent: list[Any] = []

        async def write(message: Any) -> None:
            sent.append(message)

        ahead = FirstAhead(write, loop)
        if order == "ends first":
            ahead.ran("first")
            left_out = ahead.close()
            ahead.due()
        elif order == "due, then the first item":
            ahead.due()
            await loop.run_in_executor(None, ahead.ran, "first")
            await asyncio.sleep(0)  # the thread's call_soon_threadsafe
            left_out = ahead.close()
        elif order == "stopped before the first item":
            ahead.due()
            left_out = ahead.close()
        else:  # the first item, then due
            ahead.ran("first")
            ahead.due()
            left_out = ahead.close()
        if ahead.written is not None:
            await ahead.written
        await asyncio.sleep(2 * AHEAD_S)  # its own deadline comes too, and changes nothing
        return sent, left_out

    assert asyncio.run(scenario("ends first")) == ([], False)
    assert asyncio.run(scenario("stopped before the first item")) == ([], False)
    assert asyncio.run(scenario("due, then the first item")) == (["first"], True)
    assert asyncio.run(scenario("first item, then due")) == (["first"], True)


def test_a_workers_direct_batches_start_in_the_order_they_were_sent() -> None:
    # Two requests over two connections can reach the worker in either order; the worker
    # starts them as numbered, and never waits long for one that does not come.
    async def arrive(order: Order, started: list[int], sender: str, number: int) -> None:
        await order.turn(sender, number)
        started.append(number)
        order.started(sender, number)

    async def scenario() -> tuple[list[int], list[int], float]:
        order, started = Order(), []
        later = asyncio.ensure_future(arrive(order, started, "run", 1))  # number 1 comes first
        for _ in range(5):  # let it run as far as it can
            await asyncio.sleep(0)
        assert started == []  # it waits for number 0
        await arrive(order, started, "run", 0)
        for _ in range(5):  # number 0's start wakes number 1 at once, long before GAP_S
            await asyncio.sleep(0)
        assert started == [0, 1]
        await later
        # Another sender's line is its own; a lost predecessor costs at most GAP_S.
        lone: list[int] = []
        t0 = asyncio.get_running_loop().time()
        await arrive(order, lone, "other", 3)
        return started, lone, asyncio.get_running_loop().time() - t0

    started, lone, waited = asyncio.run(scenario())
    assert started == [0, 1]
    assert lone == [3] and GAP_S * 0.9 <= waited < 5
