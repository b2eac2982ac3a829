"""The run journal and `--resume` (issue 18), in this process on real clusters.

Executions are counted on the workers' side: each item appends its index to a log file,
so a test can say exactly which items a resumed run ran again. The real-kernel tests
(`kill -9` mid-cell) are in `test_journal_kernel.py`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import dask.config
import pytest

import nbcluster
from nbcluster.journal import store as journal
from tests.waiting import until

CELL = "with open(log, 'a') as f:\n    f.write(f'{x}\\n')\nx * 10"


@pytest.fixture
def journals(tmp_path: Path) -> Iterator[Path]:
    """A journal folder of the test's own."""
    where = tmp_path / "journals"
    with dask.config.set({"nbcluster.journal.path": str(where)}):
        yield where


def executions(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def run(log: Path, n: int, **kwargs):
    return nbcluster.distribute(CELL, over=f"x in range({n})", namespace={"log": str(log)}, **kwargs)


def record_starts(data: bytes) -> list[int]:
    """Where each record of a journal's bytes starts (after the magic line and the header)."""
    offset = data.index(b"\n", data.index(b"\n") + 1) + 1
    starts = []
    while offset < len(data):
        starts.append(offset)
        offset += 4 + int.from_bytes(data[offset : offset + 4], "little")
    return starts


def stop_after(results, done: int) -> None:
    """Cancel a --no-wait run once `done` items have finished (as Ctrl-C would)."""
    reached = threading.Event()
    results.subscribe(lambda r: reached.set() if r.counts()["done"] >= done or r.done else None)
    assert reached.wait(120), results.counts()
    results.cancel()
    results.wait()


def test_journal_files_are_0600_in_a_0700_folder(cluster, journals, tmp_path):
    run(tmp_path / "log", 20)
    (found,) = journal.journals(where=journals)
    # One folder per run identity, named by it, as the journal is.
    assert found.parent.parent == journals and found.name.startswith(f"{found.parent.name}-")
    assert stat.S_IMODE(journals.stat().st_mode) == stat.S_IMODE(found.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(found.stat().st_mode) == 0o600
    loaded = journal.load(found)
    assert loaded.state == "complete" and loaded.values == {i: i * 10 for i in range(20)}


def test_a_journal_of_batches_a_worker_packed_resumes_their_values(cluster, journals):
    # Builtin values are journaled as one pickled list per batch (`journal/store.py`).
    res = nbcluster.distribute("x + 1", over="x in range(5_000)", namespace={})
    assert res.ok
    (found,) = journal.journals(where=journals)
    loaded = journal.load(found)
    assert loaded.state == "complete" and loaded.values == {i: i + 1 for i in range(5_000)}
    again = nbcluster.distribute("x + 1", over="x in range(5_000)", namespace={}, resume=True)
    assert again.values() == list(range(1, 5_001))


def test_resume_runs_only_what_the_interrupted_run_did_not_finish(cluster, journals, tmp_path, capsys):
    log = tmp_path / "log"
    ns = {"log": str(log), "time": __import__("time")}
    slow = "time.sleep(0.05)\n" + CELL + "\nprint('item', x)\nx * 10"
    first = nbcluster.distribute(slow, over="x in range(200)", namespace=ns, wait=False)
    stop_after(first, 30)
    done_before = {i for i, v in enumerate(first.values()) if v is not None}
    assert 30 <= len(done_before) < 200
    ran_before = executions(log)
    capsys.readouterr()

    again = nbcluster.distribute(slow, over="x in range(200)", namespace=ns, resume=True, into="res")
    out = capsys.readouterr().out
    when = journal.load(journal.journals(where=journals)[0]).when
    line = f"nbcluster: resumed {len(done_before)}/200 items from the run of {when} (interrupted); running {200 - len(done_before)}"
    assert line in out.splitlines(), out
    assert again.values() == [i * 10 for i in range(200)] and again.ok
    assert ns["res"] is again
    assert again.params[7] == {"x": 7}
    assert again.output(0) == "item 0\n"  # a resumed item's output came back with it
    # Only the items that had not finished ran again, each once.
    ran_now = executions(log)[len(ran_before) :]
    assert sorted(ran_now) == sorted(set(range(200)) - done_before)
    # The same journal goes on, now complete.
    (found,) = journal.journals(where=journals)
    assert journal.load(found).state == "complete"


def test_failed_items_run_again_on_resume(shell, cluster, journals, tmp_path, capsys):
    log, flag = tmp_path / "log", tmp_path / "fixed"
    cell = CELL.replace("x * 10", "if x == 3 and not os.path.exists(flag):\n    raise ValueError('not yet')\nx * 10")
    ns = {"log": str(log), "flag": str(flag), "os": os}
    first = nbcluster.distribute(cell, over="x in range(6)", namespace=ns)
    assert [e.index for e in first.errors] == [3]
    # The journal names the failed item's error (one line, no traceback) and the worker that ran it.
    (found,) = journal.journals(where=journals)
    loaded = journal.load(found)
    workers = {str(w["name"]) for w in cluster.client.scheduler_info()["workers"].values()}
    assert set(loaded.failed) == {3}
    failed = loaded.failed[3]
    assert failed["error"] == "ValueError: not yet" and failed["params"] == "x=3" and failed["worker"] in workers
    assert sum(loaded.workers.values()) == 5 and set(loaded.workers) <= workers
    capsys.readouterr()
    shell.run_line_magic("cluster", "runs")
    head, row = capsys.readouterr().out.splitlines()[:2]
    assert head.split() == ["ID", "WHEN", "CELL", "DONE", "FAILED", "SIZE", "HELD", "STATE"]
    assert row.split()[-5:-2] == ["5/6", "1", row.split()[-3]] and row.split()[-1] == "failed", row
    shell.run_line_magic("cluster", f"runs {found.name[:8]}")
    shown = capsys.readouterr().out.splitlines()
    assert shown[1] == "  5/6 done, 1 failed, 0 not run", shown
    assert f"    item 3 (x=3) on worker {failed['worker']} at " in shown[-1] and shown[-1].endswith(": ValueError: not yet")
    assert shown[-2] == "  failed (--resume runs them again):"
    assert "Traceback" not in "\n".join(shown)
    flag.touch()  # what the user fixed meanwhile is not part of the run's identity
    again = nbcluster.distribute(cell, over="x in range(6)", namespace=ns, resume=True)
    assert again.ok and again.values() == [0, 10, 20, 30, 40, 50]
    assert executions(log)[6:] == [3]
    # A fresh run of a cell whose last run failed says so, not that it was interrupted.
    flag.unlink()
    nbcluster.distribute(cell.replace("x * 10", "x * 100"), over="x in range(6)", namespace=ns)
    capsys.readouterr()
    nbcluster.distribute(cell.replace("x * 10", "x * 100"), over="x in range(6)", namespace=ns)
    assert "had 1 failed with 5/6 items done; running it fresh (--resume would run only the 1 missing)" in capsys.readouterr().out


def test_no_journal_means_resume_runs_everything_and_says_so(cluster, journals, tmp_path, capsys):
    res = run(tmp_path / "log", 10, resume=True)
    # The usual line (its size is the test's own path's, which pytest numbers per session), and one more.
    assert res.ok and re.fullmatch(
        r"nbcluster: --resume: no journal of this run \(the same code, items and captured values\) was found: "
        r"running all 10 items\nnbcluster: sent log \(\d+ B\) with the cell\n",
        capsys.readouterr().out,
    )
    assert sorted(executions(tmp_path / "log")) == list(range(10))


def test_another_run_is_another_identity(cluster, journals, tmp_path, capsys):
    run(tmp_path / "log", 10)
    capsys.readouterr()
    res = nbcluster.distribute(CELL, over="x in range(10)", namespace={"log": str(tmp_path / "other")}, resume=True)
    assert res.ok and "resumed" not in capsys.readouterr().out  # a captured input changed
    assert len(journal.journals(where=journals)) == 2


def test_hint_line_without_resume(cluster, journals, tmp_path, capsys):
    log = tmp_path / "log"
    first = run(log, 40, wait=False, batch=1)
    stop_after(first, 3)
    done = first.counts()["done"]
    capsys.readouterr()
    fresh = run(log, 40)
    out = capsys.readouterr().out
    assert f"items done; running it fresh (--resume would run only the {40 - done} missing)" in out, out
    assert f"was interrupted with {done}/40" in out
    assert fresh.ok


def test_a_journal_cut_mid_record_loads_up_to_its_last_whole_record(journals, tmp_path, capsys):
    log = tmp_path / "log"
    run(log, 30, local=True, batch=1)  # in the kernel: one record per item
    (found,) = journal.journals(where=journals)
    data = found.read_bytes()
    starts = record_starts(data)  # the last one is the End
    found.write_bytes(data[: starts[-2] + 10])  # cut 10 bytes into the last batch's record
    loaded = journal.load(found)
    assert loaded.state == "killed" and sorted(loaded.values) == list(range(29))
    capsys.readouterr()
    again = run(log, 30, local=True, resume=True)
    assert "resumed 29/30 items" in capsys.readouterr().out
    assert again.values() == [i * 10 for i in range(30)]
    assert executions(log)[30:] == [29]


def test_a_journal_of_another_format_is_refused_in_one_line_and_the_cell_runs_fresh(journals, tmp_path, capsys):
    log = tmp_path / "log"
    run(log, 5, local=True)
    (found,) = journal.journals(where=journals)
    magic, header, rest = found.read_bytes().split(b"\n", 2)
    old = json.loads(header)
    old.update(format=99, nbcluster="9.0.0")
    found.write_bytes(magic + b"\n" + json.dumps(old).encode() + b"\n" + rest)
    capsys.readouterr()
    again = run(log, 5, local=True, resume=True)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"nbcluster: --resume: the journal of {journal.when(journal.started(found))} was written by "
        "nbcluster 9.0.0 (journal format 99), which this nbcluster 0.1.0 cannot read: running all 5 items fresh"
    ], out
    assert again.ok and executions(log)[5:] == [0, 1, 2, 3, 4]


GONE = """
class Gone:
    def __init__(self, x):
        self.x = x
"""


def test_a_value_that_cannot_be_loaded_now_runs_that_item_again(journals, tmp_path, capsys, monkeypatch):
    module = tmp_path / "mods" / "j18gone.py"
    module.parent.mkdir()
    module.write_text(GONE)
    monkeypatch.syspath_prepend(str(module.parent))
    import j18gone

    log = tmp_path / "log"
    cell = CELL.replace("x * 10", "j18gone.Gone(x) if x == 2 else x * 10")
    ns = {"log": str(log), "j18gone": j18gone}
    first = nbcluster.distribute(cell, over="x in range(4)", namespace=ns, local=True)
    assert first[2].x == 2
    # The class's module is gone now (uninstalled, renamed): its pickle cannot be loaded.
    module.unlink()
    del sys.modules["j18gone"]
    loaded = journal.load(journal.journals(where=journals)[0])
    assert sorted(loaded.values) == [0, 1, 3] and loaded.unloadable == 1
    capsys.readouterr()
    again = nbcluster.distribute(cell, over="x in range(4)", namespace=ns, local=True, resume=True)
    out = capsys.readouterr().out
    assert "resumed 3/4 items" in out and "running 1 (1 whose value cannot be loaded now" in out, out
    assert again[2].x == 2 and executions(log)[4:] == [2]


def test_a_value_over_max_item_size_is_not_journaled_and_runs_again(journals, tmp_path, capsys):
    log = tmp_path / "log"
    cell = CELL.replace("x * 10", "b'x' * (5000 if x == 1 else 10)")
    with dask.config.set({"nbcluster.journal.max-item-size": "1kB"}):
        nbcluster.distribute(cell, over="x in range(3)", namespace={"log": str(log)}, local=True)
        capsys.readouterr()
        again = nbcluster.distribute(cell, over="x in range(3)", namespace={"log": str(log)}, local=True, resume=True)
    out = capsys.readouterr().out
    assert "resumed 2/3 items" in out and "(1 finished but over nbcluster.journal.max-item-size)" in out, out
    assert len(again[1]) == 5000 and executions(log)[3:] == [1]


def test_an_unwritable_journal_folder_is_one_warning_and_the_run_goes_on(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with dask.config.set({"nbcluster.journal.path": str(blocker / "journals")}):
        res = run(tmp_path / "log", 5, local=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert res.values() == [0, 10, 20, 30, 40]
    assert err == [
        f"nbcluster: cannot write the run's journal in {blocker / 'journals'} (Not a directory): "
        "the run goes on without a journal (--resume cannot pick it up)"
    ], err


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tiny tmpfs to fill it: needs root")
def test_a_full_disk_is_one_warning_and_the_run_goes_on(tmp_path, capsys):
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        cell = CELL.replace("x * 10", "b'y' * 20000")
        with dask.config.set({"nbcluster.journal.path": str(mount / "j")}):
            res = nbcluster.distribute(cell, over="x in range(8)", namespace={"log": str(tmp_path / "log")},
                                       local=True)  # fmt: skip
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert res.ok and [len(v) for v in res.values()] == [20000] * 8
    assert err == [
        f"nbcluster: cannot write the run's journal in {mount / 'j'} (No space left on device): "
        "the run goes on without a journal (--resume cannot pick it up)"
    ], err


def test_two_runs_resuming_one_journal_one_wins_the_other_runs_fresh(journals, tmp_path, capsys):
    log = tmp_path / "log"
    run(log, 6, local=True)
    (found,) = journal.journals(where=journals)
    # Another kernel has taken the journal to resume it: it holds the journal's flock, as a run does.
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, sys
            fd = os.open({str(found)!r}, os.O_WRONLY | os.O_APPEND)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("held", flush=True)
            sys.stdin.readline()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        again = run(log, 6, local=True, resume=True)
    finally:
        holder.communicate("\n", timeout=30)
    out = capsys.readouterr().out.splitlines()
    assert out == ["nbcluster: --resume: another run is using this cell's journal right now: running all 6 items fresh"]
    assert again.ok and executions(log)[6:] == list(range(6))
    assert len(journal.journals(where=journals)) == 2  # it wrote its own


def test_the_size_bound_prunes_the_oldest_journals_first(journals, tmp_path):
    for n in range(5):
        nbcluster.distribute(CELL.replace("x * 10", "b'z' * 4000"), over=f"x in range({n + 3})",
                             namespace={"log": str(tmp_path / "log")}, local=True)  # fmt: skip
    made = journal.journals(where=journals)  # newest first
    sizes = [p.stat().st_size for p in made]
    assert len(made) == 5
    # Room for the newest two: a new run's journal is made after the three oldest go.
    with dask.config.set({"nbcluster.journal.max-size": sizes[0] + sizes[1] + 100}):
        run(tmp_path / "log", 1, local=True)
    newest, *rest = journal.journals(where=journals)
    assert rest == made[:2] and journal.load(newest).header["total"] == 1
    # A pruned journal's run folder goes with it.
    assert sorted(journals.iterdir()) == sorted(p.parent for p in [newest, *rest])


def test_the_size_bound_never_prunes_a_persist_runs_journal(journals, tmp_path):
    # Its values may be kept on its cluster for --resume: only forget lets them go.
    kept = journal.create("a" * 32, 8, "np.full(...)", cluster="pc")
    assert kept is not None
    kept.release()
    for n in range(3):
        nbcluster.distribute(CELL.replace("x * 10", "b'z' * 4000"), over=f"x in range({n + 3})",
                             namespace={"log": str(tmp_path / "log")}, local=True)  # fmt: skip
    deleted = journal.prune(1, journals)  # no room at all
    assert len(deleted) == 3 and journal.journals(where=journals) == [kept.path]


def test_journal_enabled_false_writes_nothing(journals, tmp_path):
    with dask.config.set({"nbcluster.journal.enabled": False}):
        run(tmp_path / "log", 3, local=True)
    assert not journals.exists()


def test_distribute_runs_lists_and_forget_deletes(journals, tmp_path, shell, capsys):
    log = tmp_path / "log"
    run(log, 4, local=True)
    first = run(log, 9, local=True)
    assert first.ok
    (newest, oldest) = journal.journals(where=journals)
    capsys.readouterr()
    shell.run_line_magic("cluster", "runs")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "WHEN", "CELL", "DONE", "FAILED", "SIZE", "HELD", "STATE"]
    assert lines[1].split()[0] == newest.name[:8] and lines[1].split()[-1] == "complete"
    assert " 9/9 " in lines[1] and " 4/4 " in lines[2] and "with open(log, 'a') as f:" in lines[1]
    shell.run_line_magic("cluster", f"runs {oldest.name[:8]} --forget")
    assert capsys.readouterr().out == "Forgot 1 journaled run.\n"
    assert journal.journals(where=journals) == [newest]
    with pytest.raises(Exception, match="no journaled run 'abcdef12': `runs` lists their IDs"):
        shell.run_line_magic("cluster", "runs abcdef12 --forget")
    shell.run_line_magic("cluster", "runs --forget --all")
    assert capsys.readouterr().out == "Forgot 1 journaled run.\n"
    assert not list(journals.iterdir())  # each run's folder went with its last journal
    shell.run_line_magic("cluster", "runs")
    assert capsys.readouterr().out == f"No journaled runs (in {journals}).\n"


def test_a_journal_in_the_one_folder_of_an_earlier_nbcluster_is_listed_and_forgotten(journals, tmp_path, shell,
                                                                                      capsys):  # fmt: skip
    # An nbcluster before the folder per run kept every journal in the journals' folder itself:
    # `runs` still lists those (and pruning counts them), and forgetting deletes them.
    run(tmp_path / "log", 4, local=True)
    (found,) = journal.journals(where=journals)
    old = found.rename(journals / found.name)
    assert journal.journals(where=journals) == [old] and journal.load(old).state == "complete"
    capsys.readouterr()
    shell.run_line_magic("cluster", "runs")
    assert " 4/4 " in capsys.readouterr().out.splitlines()[1]
    shell.run_line_magic("cluster", f"runs {old.name[:8]} --forget")
    assert capsys.readouterr().out == "Forgot 1 journaled run.\n" and not old.exists()


LISTINGS = """
import json, os, sys
from pathlib import Path
import dask.config
import nbcluster

listed, recording = [], []
sys.addaudithook(lambda event, args: listed.append(Path(os.fsdecode(args[0]))) if recording and event in (
    "os.listdir", "os.scandir") else None)
dask.config.set({"nbcluster.journal.path": sys.argv[1]})
for n in range(12):  # other runs: twelve folders of journals
    nbcluster.distribute("x", over=f"x in range({n + 2})", namespace={}, local=True)
nbcluster.distribute("x + 1", over="x in range(3)", namespace={}, local=True)
recording.append(True)
again = nbcluster.distribute("x + 1", over="x in range(3)", namespace={}, local=True)
print(json.dumps({"listed": [str(p) for p in listed], "values": again.values()}))
"""


def test_a_cell_lists_the_folder_of_its_own_runs_not_every_journal(journals):
    # Its start looks for its earlier runs (--resume, the hint), its end for those it supersedes:
    # in its identity's folder each time, whatever else the journals' folder holds. (The first
    # start in a process prunes every run's folder; this is the second.)
    out = subprocess.run([sys.executable, "-c", LISTINGS, str(journals)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    (folder,) = {p.parent for p in journal.journals(where=journals) if journal.load(p).header["first_line"] == "x + 1"}
    assert seen["values"] == [1, 2, 3] and len(list(journals.iterdir())) == 13
    assert seen["listed"] == [str(folder), str(folder)], seen  # at its start and its end, its own folder only


def test_nbcluster_runs_on_the_command_line(journals, tmp_path, cli):
    run(tmp_path / "log", 3, local=True)
    (found,) = journal.journals(where=journals)
    env = {"DASK_NBCLUSTER__JOURNAL__PATH": str(journals)}
    listed = cli("runs", env=env)
    assert listed.returncode == 0 and f"{found.name[:8]}" in listed.stdout and "3/3" in listed.stdout, listed
    shown = cli("runs", found.name[:8], env=env)
    assert shown.returncode == 0, shown
    assert shown.stdout.splitlines()[1:] == ["  3/3 done, 0 failed, 0 not run", "  done where: the kernel 3"], shown
    unknown = cli("runs", "abcdef12", env=env)
    assert (unknown.returncode, unknown.stderr) == (2, "nbcluster: error: no journaled run 'abcdef12': `runs` lists their IDs\n")
    bad = cli("runs", "--forget", env=env)
    assert bad.returncode == 2
    assert bad.stderr == "nbcluster: error: say which runs to forget: their IDs (from `runs`), or --all\n"
    gone = cli("runs", found.name[:8], "--forget", env=env)
    assert gone.returncode == 0 and gone.stdout == "Forgot 1 journaled run.\n", gone
    assert not found.exists()


PERSISTED = "with open(log, 'a') as f:\n    f.write(f'{x}\\n')\nimport numpy as np\nnp.full(125_000, x)"  # 1 MB


def held_bytes(client) -> int:
    """What the workers hold in their own stores for --persist values (every run's)."""

    def held(dask_worker) -> int:
        from dask.sizeof import sizeof

        return sum(sizeof(v) for k, v in dask_worker.data.items() if str(k).startswith("persist-"))

    return sum(client.run(held).values())


def sent_bytes(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def dead_kernel_run(cluster, log, n: int = 8, keep: int | None = None, cell: str = PERSISTED, ns=None):
    """A --persist run by a client that then goes away, as a killed kernel's does; the journal
    cut to its first `keep` batches (what had reached the kernel). Returns the journal."""
    from distributed import Client

    dead = Client(cluster.client.scheduler.address, security=cluster.client.security, set_as_default=False)
    try:
        ns = {"log": str(log)} if ns is None else dict(ns)
        first = nbcluster.distribute(cell, over=f"x in range({n})", namespace=ns, persist=True, into="held",
                                     on=dead, batch=1)  # fmt: skip
        assert first.ok and len(first) == n
        # Published from the client's loop, not waited for by the run: a kernel killed before
        # that would leave those items to run again (`handles.publish`).
        assert until(lambda: len(dead.list_datasets()) == n, 30)
    finally:
        dead.close()
    (found,) = journal.journals()  # the test's own folder (`journals`)
    if keep is not None:
        data = found.read_bytes()
        found.write_bytes(data[: record_starts(data)[keep]])
    return found


def test_a_killed_persist_run_resumes_from_the_values_its_cluster_kept(cluster, journals, tmp_path, capsys):
    log = tmp_path / "log"
    found = dead_kernel_run(cluster, log, keep=6)
    killed = journal.load(found)
    assert killed.state == "killed" and len(killed.values) == 6
    assert all(set(r) == {"key", "dataset", "held", "params"} for r in killed.values.values())  # recipes, not values
    assert {r["params"] for r in killed.values.values()} <= {f"x={x}" for x in range(8)}
    assert held_bytes(cluster.client) == 8 * 1_000_000  # the dead client's values stayed on the workers
    before, sent = len(executions(log)), sent_bytes(cluster.client)
    capsys.readouterr()
    ns: dict = {"log": str(log)}
    again = nbcluster.distribute(PERSISTED, over="x in range(8)", namespace=ns, persist=True, into="again", resume=True)
    out = capsys.readouterr().out
    line = f"nbcluster: resumed 6/8 items from the run of {killed.when} (killed); running 2"
    assert line in out.splitlines(), out
    assert sorted(executions(log)[before:]) == sorted(set(range(8)) - set(killed.values))  # the kept 6 did not run
    assert sent_bytes(cluster.client) - sent < 100_000  # no value crossed to the kernel (nor moved)
    assert all(again[i].nbytes == 1_000_000 and "on worker" in repr(again[i]) for i in range(8))
    assert [float(v[0]) for v in again.gather()] == [float(x) for x in range(8)]
    chained = nbcluster.distribute("float(v.sum())", over="v in again", namespace=ns)
    assert chained.values() == [125_000.0 * x for x in range(8)]
    assert journal.load(found).state == "complete"
    # The new kernel's handles own the values now: del frees the workers' memory.
    del again, chained
    ns.clear()
    assert until(lambda: held_bytes(cluster.client) == 0), held_bytes(cluster.client)
    assert not cluster.client.list_datasets()


def test_forget_drops_what_a_killed_persist_run_kept(shell, cluster, journals, tmp_path, capsys):
    found = dead_kernel_run(cluster, tmp_path / "log")
    capsys.readouterr()
    shell.run_line_magic("cluster", "runs")
    head, row = capsys.readouterr().out.splitlines()[:2]
    assert head.split()[-2:] == ["HELD", "STATE"]
    where = cluster.client.scheduler.address
    assert f" 8 (8.0 MB) on {where} " in row, row
    shell.run_line_magic("cluster", f"runs {found.name[:8]} --forget")
    assert capsys.readouterr().out == "Forgot 1 journaled run. Dropped 8 values kept on the cluster for --resume.\n"
    assert until(lambda: held_bytes(cluster.client) == 0), held_bytes(cluster.client)
    assert not found.exists() and not cluster.client.list_datasets()


def test_a_kept_value_lost_with_its_worker_runs_again(journals, tmp_path, capsys):
    import signal

    log, flag = tmp_path / "log", tmp_path / "flag"
    flag.write_text("yes")
    cell = PERSISTED.replace("import numpy", "if open(flag).read() == 'no':\n    raise RuntimeError('not now')\nimport numpy")
    ns: dict = {"log": str(log), "flag": str(flag)}
    handle = nbcluster.start(workers=2, threads=1, name="j18lost")
    try:
        client = handle.client
        client.wait_for_workers(2)
        found = dead_kernel_run(handle, log, cell=cell, ns=ns)
        recipes = journal.load(found).values
        keys = [r["key"] for r in recipes.values()]

        def states(dask_scheduler, keys):
            return {k: (dask_scheduler.tasks[k].state, [w.address for w in dask_scheduler.tasks[k].who_has or ()])
                    for k in keys if k in dask_scheduler.tasks}  # fmt: skip

        holders = client.run_on_scheduler(states, keys=keys)
        victim = holders[recipes[0]["key"]][1][0]
        lost = {i for i, r in recipes.items() if victim in holders[r["key"]][1]}
        assert 0 < len(lost) < 8  # both workers hold some
        flag.write_text("no")  # Dask's lineage cannot make them again: the cell's input is gone, as a dead kernel's are
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        assert until(lambda: all(client.run_on_scheduler(states, keys=[recipes[i]["key"] for i in lost]).get(
            recipes[i]["key"], ("forgotten",))[0] in ("erred", "forgotten") for i in lost), 60)  # fmt: skip
        flag.write_text("yes")
        before = len(executions(log))
        capsys.readouterr()
        again = nbcluster.distribute(cell, over="x in range(8)", namespace=ns, persist=True, into="again",
                                     resume=True, on=client)  # fmt: skip
        out = capsys.readouterr().out
        line = (f"nbcluster: resumed {8 - len(lost)}/8 items from the run of {journal.load(found).when} "
                f"(complete); running {len(lost)} ({len(lost)} finished whose value the cluster no longer holds)")  # fmt: skip
        assert line in out.splitlines(), out
        assert [float(v[0]) for v in again.gather()] == [float(x) for x in range(8)]
        assert sorted(executions(log)[before:]) == sorted(lost)  # the lost ran again, what the living worker kept did not
        again.release()
    finally:
        handle.stop()


def test_with_journaling_off_a_persist_run_publishes_nothing(cluster, journals, tmp_path):
    with dask.config.set({"nbcluster.journal.enabled": False}):
        ns: dict = {"log": str(tmp_path / "log")}
        held = nbcluster.distribute(PERSISTED, over="x in range(3)", namespace=ns, persist=True, into="held")
        assert held.ok and not cluster.client.list_datasets() and not journals.exists()
        held.release()
        del held
        ns.clear()
        assert until(lambda: held_bytes(cluster.client) == 0)


def datasets(client) -> set[str]:
    return {str(name) for name in client.list_datasets()}


@pytest.mark.parametrize("first_still_held", [True, False])
def test_a_complete_persist_run_drops_the_datasets_of_the_run_it_supersedes(cluster, journals, tmp_path, first_still_held):
    # Held: its datasets are still there, and are asked for and dropped. Let go: this process
    # published them alone and queued their deletes, so nothing is asked; neither leaks.
    ns: dict = {"log": str(tmp_path / "log")}
    first = nbcluster.distribute(PERSISTED, over="x in range(3)", namespace=ns, persist=True, into="first")
    (old,) = journal.journals(where=journals)
    assert until(lambda: len(datasets(cluster.client)) == 3)
    if not first_still_held:
        del first, ns["first"]
    again = nbcluster.distribute(PERSISTED, over="x in range(3)", namespace=ns, persist=True, into="again")
    (new,) = journal.journals(where=journals)
    assert new != old and not old.exists()
    mine = {f"nbcluster-{new.stem}-{i}" for i in range(3)}
    assert until(lambda: datasets(cluster.client) == mine), datasets(cluster.client)
    assert [float(v[0]) for v in again.gather()] == [0.0, 1.0, 2.0]
    if first_still_held:  # the values themselves live on while their handles do
        assert [float(v[0]) for v in first.gather()] == [0.0, 1.0, 2.0]
        first.release()
    again.release()
    ns.clear()
    assert until(lambda: not datasets(cluster.client) and held_bytes(cluster.client) == 0)


def test_a_retry_goes_on_in_the_same_journal(journals, tmp_path):
    log, flag = tmp_path / "log", tmp_path / "fixed"
    cell = CELL.replace("x * 10", "if x == 1 and not os.path.exists(flag):\n    raise ValueError('not yet')\nx * 10")
    ns = {"log": str(log), "flag": str(flag), "os": os}
    res = nbcluster.distribute(cell, over="x in range(3)", namespace=ns, local=True)
    (found,) = journal.journals(where=journals)
    assert journal.load(found).state == "interrupted"  # --local stops at the failed item: item 2 never ran
    flag.touch()
    res.retry()
    assert res.ok
    loaded = journal.load(found)
    assert loaded.state == "complete" and loaded.values == {0: 0, 1: 10, 2: 20}


def test_a_run_that_completes_deletes_the_older_journals_of_the_same_run(cluster, journals, tmp_path, capsys):
    log = tmp_path / "log"
    ns = {"log": str(log), "time": __import__("time")}
    slow = "time.sleep(0.05)\n" + CELL
    stop_after(nbcluster.distribute(slow, over="x in range(100)", namespace=ns, wait=False), 10)
    other = run(log, 5)  # another run (other items): its journal stays
    assert other.ok and len(journal.journals(where=journals)) == 2
    nbcluster.distribute(slow, over="x in range(100)", namespace=ns)  # the first run, fresh and complete
    newest, kept = journal.journals(where=journals)
    assert journal.load(newest).state == "complete" and len(journal.load(newest).values) == 100
    assert journal.load(kept).header["total"] == 5


def test_ended_complete_reads_only_the_last_record(cluster, journals, tmp_path):
    run(tmp_path / "log", 30, batch=7)
    (complete,) = journal.journals(where=journals)
    assert journal.ended_complete(complete)
    data = complete.read_bytes()
    starts = record_starts(data)
    cut = tmp_path / f"{complete.name[:32]}-1-1.journal"
    cut.write_bytes(data[: starts[-1] + 3])  # the End record cut short: the run was killed
    assert not journal.ended_complete(cut) and journal.load(cut).state == "killed"
    cut.write_bytes(data[: starts[-1]])  # whole records, none of them an End
    assert not journal.ended_complete(cut)
    assert not journal.ended_complete(tmp_path / "missing.journal")


def test_an_incomplete_run_is_journaled(cluster, journals, tmp_path, capsys):
    log = tmp_path / "log"
    cell = CELL.replace("x * 10", "if x == 3:\n    raise ValueError('not yet')\nx * 10")
    first = nbcluster.distribute(cell, over="x in range(6)", namespace={"log": str(log)})
    assert [e.index for e in first.errors] == [3]
    (found,) = journal.journals(where=journals)  # what --resume is for
    loaded = journal.load(found)
    assert loaded.state == "failed" and loaded.values == {i: i * 10 for i in (0, 1, 2, 4, 5)}


def test_a_run_still_going_is_on_disk_with_what_arrived(cluster, journals, tmp_path):
    # Item 0 arrives at once; the others wait for `go`: the journal holds item 0 meanwhile.
    log, go = tmp_path / "log", tmp_path / "go"
    cell = "import os, time\nwhile x and not os.path.exists(go):\n    time.sleep(0.01)\n" + CELL
    res = nbcluster.distribute(cell, over="x in range(4)", namespace={"log": str(log), "go": str(go)}, wait=False)
    try:
        assert until(lambda: len(journal.journals(where=journals)) == 1), "no journal while the run goes on"
        (found,) = journal.journals(where=journals)
        assert until(lambda: journal.load(found).values.get(0) == 0), "item 0 not journaled as it arrived"
        assert res.counts()["done"] < 4 and journal.in_use(found)
    finally:
        go.touch()
    assert res.wait().ok
    loaded = journal.load(found)
    assert loaded.state == "complete" and loaded.values == {i: i * 10 for i in range(4)}


def test_a_damaged_record_keeps_every_record_before_it(journals, tmp_path, capsys):
    log = tmp_path / "log"
    run(log, 30, local=True, batch=1)  # in the kernel: one record per item
    (found,) = journal.journals(where=journals)
    data = bytearray(found.read_bytes())
    start = record_starts(bytes(data))[12]
    data[start + 4 : start + 24] = b"\xff" * 20  # item 12's record damaged, its length intact
    found.write_bytes(bytes(data))
    assert sorted(journal.load(found).values) == list(range(12))  # nothing after it is trusted
    capsys.readouterr()
    again = run(log, 30, local=True, resume=True)
    assert "resumed 12/30 items" in capsys.readouterr().out
    assert again.values() == [i * 10 for i in range(30)] and executions(log)[30:] == list(range(12, 30))


def test_a_damaged_header_is_one_line_and_the_cell_runs_fresh(shell, journals, tmp_path, capsys):
    log = tmp_path / "log"
    run(log, 5, local=True)
    (found,) = journal.journals(where=journals)
    found.write_bytes(journal.MAGIC + b"{not json\n" + found.read_bytes()[len(journal.MAGIC) :])
    capsys.readouterr()
    again = run(log, 5, local=True, resume=True)
    when = journal.when(journal.started(found))
    assert capsys.readouterr().out.splitlines() == [
        f"nbcluster: --resume: the journal of {when} has a damaged header: running all 5 items fresh"
    ]
    assert again.ok and again.values() == [0, 10, 20, 30, 40] and executions(log)[5:] == [0, 1, 2, 3, 4]
    # The fresh run holds every item: the damaged journal, which could give back none, is gone.
    (newest,) = journal.journals(where=journals)
    assert newest != found and journal.load(newest).state == "complete"


def test_a_folder_made_by_hand_is_made_private(journals, tmp_path):
    journals.mkdir(mode=0o755)
    os.chmod(journals, 0o755)  # whatever the umask
    run(tmp_path / "log", 3, local=True)
    (found,) = journal.journals(where=journals)
    assert stat.S_IMODE(journals.stat().st_mode) == 0o700 and stat.S_IMODE(found.stat().st_mode) == 0o600


SAVES = (
    "import nbcluster\nck = nbcluster.checkpoint()\nbefore = ck.load()\nck.save({'x': x})\n"
    "if before is None and x == 2:\n    raise RuntimeError('first time')\nbefore"
)


def test_checkpoints_are_the_runs_and_only_resume_loads_them(cluster, journals, tmp_path):
    ck = tmp_path / "ck"
    with dask.config.set({"nbcluster.checkpoint.path": str(ck)}):
        first = nbcluster.distribute(SAVES, over="x in [1, 2]", namespace={})
        assert [e.index for e in first.errors] == [1]
        (found,) = journal.journals(where=journals)
        ident = found.name[:32]
        assert sorted(p.name for p in ck.iterdir()) == [ident]  # keyed by the run's identity, one file an item
        assert len(list((ck / ident).iterdir())) == 2
        again = nbcluster.distribute(SAVES, over="x in [1, 2]", namespace={}, resume=True)
        assert again.ok and again.values() == [None, {"x": 2}]  # item 2 went on from its checkpoint
        fresh = nbcluster.distribute(SAVES, over="x in [1, 2]", namespace={})
        assert fresh.values()[0] is None and [e.index for e in fresh.errors] == [1]  # a fresh run loads none
        other = nbcluster.distribute(SAVES, over="x in [1, 3]", namespace={})  # another run: its own
        assert other.values() == [None, None] and len(list(ck.iterdir())) == 2
        # A run's checkpoints go with its journal: the next start deletes those of a forgotten run.
        for path in journal.journals(ident, where=journals):
            path.unlink()
        nbcluster.distribute(SAVES, over="x in [1, 3]", namespace={})
        assert [p.name for p in ck.iterdir()] == [journal.journals(where=journals)[0].name[:32]]


def test_a_persist_batch_journals_its_recipes_and_an_unpublished_item_runs_again(journals):
    # One pickle of the batch's recipes (builtin data), never the values (handles); an item
    # without a recipe (not published) is left out, so --resume runs it again. A listing
    # (values=False) reads the recipes too: `runs` shows what the cluster still holds from them.
    writer = journal.create("c" * 32, 3, "np.full(...)", cluster="pc")
    assert writer is not None
    recipes = [{"key": f"k{i}", "dataset": f"d-{i}", "held": {"nbytes": 8}, "params": f"x={i}"} for i in range(3)]
    writer.write(range(3), ["h0", "h1", "h2"], {}, {}, "the cluster", ("tcp://w:1", "w1"), [recipes[0], None, recipes[2]])
    writer.end(3, 3)
    for values in (True, False):
        loaded = journal.load(writer.path, values=values)
        assert loaded.values == {0: recipes[0], 2: recipes[2]} and loaded.left_out == 1, loaded
        assert loaded.header["cluster"] == "pc" and loaded.workers == {"w1": 2} and loaded.state == "complete"
