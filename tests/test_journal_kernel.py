"""`kill -9` of a real kernel mid-cell, then `--resume` in a new one (issue 18).

The cluster is started by this test process, so it outlives the kernels (as a `--keep`
cluster, or one on a hub, would). Each item appends its index to a log file on the
workers' side, so the test counts exactly which items the new kernel ran again: those,
and only those, that had not reached the killed kernel (what its journal holds).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import nbcluster
from nbcluster.journal import store as journal
from tests.kernel_session import kernel

N = 120
CELL = (
    f'%%distribute --over "x in range({N})" --into res\n'
    "import time\ntime.sleep(0.05)\n"
    "with open(log, 'a') as f:\n    f.write(f'{x}\\n')\n"
    "x * x"
)


def executions(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def wait_for(condition, what: str, timeout: float = 120, why=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}{why()}")
        time.sleep(0.05)


def diagnosis(k, msg_id: str, client) -> str:
    """What a run that never got going shows: the cell's output, the scheduler's tasks, the workers' logs."""
    tasks = client.run_on_scheduler(lambda dask_scheduler: {str(t.key): t.state for t in dask_scheduler.tasks.values()})
    # Dask gives each worker's log newest first.
    logs = {w: [line for _, line in lines][:15] for w, lines in client.get_worker_logs().items()}
    return f"\ncell so far: {k.so_far(msg_id)!r}\nscheduler tasks: {tasks}\nworker logs: {logs}"


def test_kill_9_mid_cell_then_resume_in_a_new_kernel(runtime_dir, tmp_path):
    log, folder, copy = tmp_path / "log", tmp_path / "journals", tmp_path / "copy"
    env = {"DASK_NBCLUSTER__JOURNAL__PATH": str(folder)}
    handle = nbcluster.start(workers=2, threads=1, name="j18")
    try:
        setup = f"%load_ext nbcluster\n%cluster use j18\nlog = {str(log)!r}"
        with kernel(env=env) as k:
            k.run(setup).ok()
            cell = k.submit(CELL)
            wait_for(lambda: len(journal.load(journal.journals(where=folder)[0]).values) >= 30
                     if journal.journals(where=folder) else False, "30 items in the journal",
                     why=lambda: diagnosis(k, cell, handle.client))  # fmt: skip
            os.kill(k.km.provisioner.process.pid, signal.SIGKILL)
            k.km.provisioner.process.wait()
        # What reached the kernel before it died is what its journal holds.
        (found,) = journal.journals(where=folder)
        killed = journal.load(found)
        assert killed.state == "killed" and 30 <= len(killed.values) < N
        reached = set(killed.values)
        # The batches out when the kernel died still finish on the workers: let them.
        client = handle.client
        wait_for(lambda: client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0,
                 "the dead kernel's batches to end")  # fmt: skip
        # Its direct batches are no scheduler tasks: they run in the workers' one-thread pools,
        # so a task sent to each worker after them ends after them.
        client.gather([client.submit(int, 0, workers=[w], pure=False) for w in client.scheduler_info()["workers"]])
        before = len(executions(log))
        shutil.copytree(folder, copy)

        with kernel(env=env) as k:
            k.run(setup).ok()
            reply = k.run(CELL.replace("--into res", "--into res --resume")).ok()
            when = killed.when
            line = f"nbcluster: resumed {len(reached)}/{N} items from the run of {when} (killed); running {N - len(reached)}"
            assert line in reply.text.splitlines(), reply.text
            assert k.value("res.values()") == [x * x for x in range(N)]
            assert k.value("res.ok") is True
            assert k.value("res.params[5]") == {"x": 5}
            again = executions(log)[before:]
            assert sorted(again) == sorted(set(range(N)) - reached)  # each missing item once, no other
            # Without --resume, an unfinished journal of the cell gives the hint, and it runs fresh.
            k.run(f"import dask.config; dask.config.set({{'nbcluster.journal.path': {str(copy)!r}}})").ok()
            fresh = k.run(CELL).ok()
            hint = (
                f"nbcluster: the run of this cell at {when} was killed with {len(reached)}/{N} items done; "
                f"running it fresh (--resume would run only the {N - len(reached)} missing)"
            )
            assert hint in fresh.text.splitlines(), fresh.text
            assert len(executions(log)) == before + len(again) + N
        assert journal.load(found).state == "complete"
        for run in folder.iterdir():  # one folder per run identity, its journals named by it
            assert re.fullmatch(r"[0-9a-f]{32}", run.name), run
            assert all(re.fullmatch(rf"{run.name}-\d+-\d+\.journal", p.name) for p in run.iterdir()), run
    finally:
        handle.stop()


def test_two_kernels_resuming_one_journal_one_wins_the_other_runs_fresh(runtime_dir, tmp_path):
    log, folder = tmp_path / "log", tmp_path / "journals"
    env = {"DASK_NBCLUSTER__JOURNAL__PATH": str(folder)}
    cell = CELL.replace("time.sleep(0.05)", "time.sleep(0.1)")
    handle = nbcluster.start(workers=2, threads=1, name="j18two")
    try:
        setup = f"%load_ext nbcluster\n%cluster use j18two\nlog = {str(log)!r}"
        with kernel(env=env) as k:  # a first run, stopped after a few items (as Ctrl-C would)
            k.run(setup).ok()
            k.run(cell.replace("--into res", "--into res --no-wait")).ok()
            k.run("import time\nwhile res.counts()['done'] < 10: time.sleep(0.05)\nres.cancel(); res.wait()").ok()
            done = k.value("res.counts()['done']")
        (found,) = journal.journals(where=folder)
        assert oct(found.stat().st_mode & 0o777) == "0o600"
        when = journal.load(found).when
        with kernel(env=env) as a, kernel(env=env) as b:
            a.run(setup).ok()
            b.run(setup).ok()
            resume = cell.replace("--into res", "--into res --resume")
            ids = a.submit(resume), b.submit(resume)  # at once: the other one's run is still going
            replies = [a.collect(ids[0]).ok(), b.collect(ids[1]).ok()]
            for k in (a, b):
                assert k.value("res.values()") == [x * x for x in range(N)]
        lines = sorted(line for r in replies for line in r.text.splitlines() if "resum" in line)
        assert lines == [
            f"nbcluster: --resume: another run is using this cell's journal right now: running all {N} items fresh",
            f"nbcluster: resumed {done}/{N} items from the run of {when} (interrupted); running {N - done}",
        ], lines
        # The one that lost wrote a journal of its own; the later of the two to complete deleted
        # the other's, which could only ever resume to less.
        (left,) = journal.journals(where=folder)
        assert journal.load(left).state == "complete" and len(journal.load(left).values) == N
    finally:
        handle.stop()


def journaled(folder: Path) -> int:
    """Items in the newest journal so far; 0 before its header is written (it was just made)."""
    try:
        return len(journal.load(journal.journals(where=folder)[0]).values)
    except (IndexError, journal.Refused, OSError):
        return 0


PERSISTED = (
    '%%distribute --over "x in range(8)" --batch 1 --persist --into shards\n'
    "import os, time\nimport numpy as np\n"
    "while x >= 6 and not os.path.exists(gate):\n    time.sleep(0.02)\n"
    "with open(log, 'a') as f:\n    f.write(f'{x}\\n')\n"
    "np.full(125_000, x)"  # 1 MB each
)


def test_kill_9_after_persisted_items_then_resume_adopts_them_in_a_new_kernel(runtime_dir, tmp_path):
    log, gate, folder = tmp_path / "log", tmp_path / "gate", tmp_path / "journals"
    env = {"DASK_NBCLUSTER__JOURNAL__PATH": str(folder)}
    handle = nbcluster.start(workers=2, threads=1, name="j18p")
    client = handle.client

    def held() -> int:
        def count(dask_worker) -> int:
            return sum(1 for k in dask_worker.data if str(k).startswith("persist-"))

        return sum(client.run(count).values())

    def sent() -> int:
        return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())

    def busy() -> int:
        """Tasks the scheduler has out, and tasks the workers' threads still run (a released one too)."""
        out = client.run_on_scheduler(
            lambda dask_scheduler: sum(len(w.processing) for w in dask_scheduler.workers.values())
        )
        return out + sum(client.run(lambda dask_worker: len(dask_worker.state.executing)).values())

    try:
        client.wait_for_workers(2)
        setup = f"%load_ext nbcluster\n%cluster use j18p\nlog = {str(log)!r}\ngate = {str(gate)!r}"
        with kernel(env=env) as k:
            k.run(setup).ok()
            k.submit(PERSISTED)  # items 6 and 7 wait at the gate: the kernel dies with 6 done
            wait_for(lambda: journaled(folder) >= 6, "6 items in the journal")
            # Their datasets are published from the kernel's client loop, a moment after: a kill
            # before that would leave those items to run again, which is not what this checks.
            wait_for(lambda: len(client.list_datasets()) == 6, "the 6 values published")
            os.kill(k.km.provisioner.process.pid, signal.SIGKILL)
            k.km.provisioner.process.wait()
        (found,) = journal.journals(where=folder)
        killed = journal.load(found)
        assert killed.state == "killed" and sorted(killed.values) == [0, 1, 2, 3, 4, 5]
        # The dead kernel's two batches end, if they had started (their results go with its client).
        gate.touch()
        wait_for(lambda: busy() == 0, "the dead kernel's batches to end")
        wait_for(lambda: held() == 6, "the 6 published values, alone on the workers")
        before, moved = len(executions(log)), sent()

        with kernel(env=env) as k:
            k.run(setup).ok()
            reply = k.run(PERSISTED.replace("--into shards", "--into shards --resume")).ok()
            line = f"nbcluster: resumed 6/8 items from the run of {killed.when} (killed); running 2"
            assert line in reply.text.splitlines(), reply.text
            assert sorted(executions(log)[before:]) == [6, 7]  # the 6 the cluster kept did not run again
            assert sent() - moved < 100_000  # no value crossed to the kernel
            assert k.value("[s.nbytes for s in shards]") == [1_000_000] * 8
            assert k.value("[float(v[0]) for v in shards.gather()]") == [float(x) for x in range(8)]
            k.run("del shards").ok()
            wait_for(lambda: held() == 0, "del to free the workers", timeout=5)
            assert not client.list_datasets()
        assert journal.load(found).state == "complete"
    finally:
        handle.stop()
