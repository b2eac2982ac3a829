"""A `--ranks N` job with the trials machinery: its reports, its one checkpoint, its stops.

Real PyTorch (gloo) on real worker processes. The jobs run on a 2-worker cluster of this
module's own (the stop tests end worker processes, which the session's cluster must not
see); the resume test starts two kernels of its own, each with its own cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest

import nbcluster
from nbcluster import _compat, _current
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.run import ranks as rank_jobs
from nbcluster.run.api import ranks as run_ranks

torch = pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def _own() -> Iterator[ClusterHandle]:
    handle = nbcluster.start(workers=2, threads=1, name="rank-jobs-tests")
    yield handle
    _current.forget(handle.name)
    handle.stop()


@pytest.fixture
def two(_own: ClusterHandle) -> ClusterHandle:
    """The module's 2 x 1-thread cluster, current, with both workers back (a test may end them)."""
    handle = _current.use(_own)
    _both_back(handle)
    return handle


def _both_back(handle: ClusterHandle) -> None:
    deadline = time.monotonic() + 120
    pause = threading.Event()
    while len(set(listed := _compat.workers(handle.client)) - rank_jobs.ended(handle.client, listed)) < 2:
        assert time.monotonic() < deadline, "the workers did not come back"
        pause.wait(0.2)


def _ns(**names: Any) -> dict[str, Any]:
    return {"__name__": "__main__", **names}


def _until(what: str, ready: Any, seconds: float = 90) -> None:
    pause, deadline = threading.Event(), time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:.0f} s"
        pause.wait(0.05)


# DDP on this rank's half of one global batch; each rank reports its own loss, and waits for
# the test's word (a file) after step 3, so the test sees the curve while the job runs.
LIVE = """
import os, time, torch, torch.distributed as dist, nbcluster
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
X = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
y = X.sum(1, keepdim=True)
r, n = dist.get_rank(), dist.get_world_size()
for step in range(1, 7):
    loss = ((model(X[r::n]) - y[r::n]) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    nbcluster.report(step=step, loss=float(loss))
    if step == 3:
        while not os.path.exists(GO):
            time.sleep(0.02)
float(loss)
"""


def test_rank_zeros_reports_draw_the_curve_live_and_metrics_keep_every_rank(two: ClusterHandle, tmp_path: Path) -> None:
    go = tmp_path / "go"
    runs = run_ranks(LIVE, n=2, namespace=_ns(GO=str(go)), wait=False)
    try:
        trials = runs._trials
        assert trials is not None  # a trial job: it reports

        def drawn() -> list[Any]:  # what the cell's live view draws
            from nbcluster.widgets import ResultsProgress

            return list(ResultsProgress(runs)().get("curves", {}).get("series", []))

        # Both ranks have reported 3 steps; the job still runs, held at step 3.
        _until("rank 0's steps 1-3 on the curve", lambda: len(drawn()) == 1 and len(drawn()[0]["points"]) == 3)
        _until("rank 1's reports", lambda: 1 in trials.reports.last and trials.reports.last[1][0] == 3)
        assert not runs.done
        series = drawn()
        assert [s["label"] for s in series] == ["0: rank=0"]  # rank 0's curve only
        assert [p[0] for p in series[0]["points"]] == [1, 2, 3]
    finally:
        go.write_text("go")
    runs.wait(60)
    assert runs.ok, runs.errors
    frame = runs.metrics
    assert sorted(frame.columns) == ["item", "loss", "rank", "step", "time"]
    # Every rank's reports are kept, each with its rank; the curve's points are rank 0's.
    assert sorted(zip(frame["rank"], frame["step"], strict=True)) == [(r, s) for r in (0, 1) for s in range(1, 7)]
    rank0 = frame[frame["rank"] == 0].sort_values("step")
    assert [p[1] for p in drawn()[0]["points"]] == list(rank0["loss"])
    assert runs.values()[0] == pytest.approx(float(rank0["loss"].iloc[-1]))


TRAIN = """
import os, time, torch, torch.distributed as dist, nbcluster
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ck = nbcluster.checkpoint()
state = ck.load()
if state is not None:
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
begun = 0 if state is None else state["step"]
r = dist.get_rank()
with open(LOG, "a") as f:
    f.write(f"start {r} {begun}\\n")
X = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
y = X.sum(1, keepdim=True)
for step in range(begun + 1, 13):
    time.sleep(0.1)
    loss = ((model(X[r::2]) - y[r::2]) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    saved = ck.save({"step": step, "model": model.module.state_dict(), "opt": opt.state_dict()})
    with open(LOG, "a") as f:
        f.write(f"step {r} {step} {int(saved)}\\n")
    nbcluster.report(step=step, loss=float(loss))
[round(float(p), 6) for p in model.module.weight.detach().flatten()]
"""

KERNEL = """
import os, signal, sys, time
import nbcluster
nbcluster.start(workers=2, threads=1)
source = open({train!r}).read()
ns = {{"__name__": "__main__", "LOG": {log!r}}}
if sys.argv[1] == "first":
    runs = nbcluster.ranks(source, n=2, namespace=ns, wait=False)
    # Killed once rank 0 has saved step 4: the kernel dies mid-job, as kill -9 does it.
    while "step 0 4 1" not in (open({log!r}).read() if os.path.exists({log!r}) else ""):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
runs = nbcluster.ranks(source, n=2, namespace=ns, resume=True)
print("STATES", runs.states, runs.errors)
print("SAME", runs.values()[0] == runs.values()[1])
"""


def test_a_killed_kernel_then_resume_continues_the_job_from_rank_zeros_checkpoint(
    runtime_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    log = tmp_path / "steps.log"
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL.format(train=str(tmp_path / "train.py"), log=str(log)))
    env = {**os.environ, "DASK_NBCLUSTER__JOURNAL__PATH": str(tmp_path / "journal"),
           "DASK_NBCLUSTER__CHECKPOINT__PATH": str(tmp_path / "checkpoints")}  # fmt: skip
    first = subprocess.run([sys.executable, str(script), "first"], env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr[-2000:]
    saved = list((tmp_path / "checkpoints").glob("*/*.ckpt"))
    assert [p.name for p in saved] == ["job.ckpt"]  # one for the job, whatever its ranks
    assert oct(saved[0].stat().st_mode & 0o777) == "0o600"
    second = subprocess.run([sys.executable, str(script), "second"], env=env, capture_output=True, text=True, timeout=180)
    out = second.stdout + second.stderr[-3000:]
    assert "STATES ['done', 'done'] []" in second.stdout and "SAME True" in second.stdout, out
    lines = [line.split() for line in log.read_text().splitlines()]
    starts = [i for i, line in enumerate(lines) if line[0] == "start"]
    assert len(starts) == 4, lines  # both ranks started twice: the first kernel's job, then the resumed one
    resumed = starts[2:]
    begun = {int(lines[i][1]): int(lines[i][2]) for i in resumed}
    assert begun[0] == begun[1] >= 4, lines  # every rank loaded the job's one checkpoint, not zero
    for r in (0, 1):
        after = min(resumed)
        ran = [int(line[2]) for line in lines[after:] if line[0] == "step" and line[1] == str(r)]
        assert ran == list(range(begun[r] + 1, 13)), (r, ran)  # the steps the workers ran after resuming
    # Only rank 0's saves were kept.
    assert {line[3] for line in lines if line[0] == "step" and line[1] == "1"} == {"0"}
    assert {line[3] for line in lines if line[0] == "step" and line[1] == "0"} == {"1"}


AGAIN = "; --resume runs it again from its last checkpoint"  # what a stopped job's line says to do


# Rank 1 never reaches the all-reduce; rank 0 waits in it for ever: only ending the
# processes stops this job.
STUCK = """
import os
with open(PIDS + os.environ["RANK"], "w") as f:  # first: on a loaded machine torch's import may outlast the timeout
    f.write(str(os.getpid()))
import time, torch, torch.distributed as dist, nbcluster
dist.init_process_group()
if dist.get_rank() == 1:
    while True:
        time.sleep(0.05)
dist.all_reduce(torch.ones(1))
"""


def test_a_timeout_ends_every_rank_of_a_stuck_job_and_frees_their_workers(
    two: ClusterHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        began = time.monotonic()
        runs = run_ranks(STUCK, n=2, timeout="3s", namespace=_ns(PIDS=str(tmp_path / "pid-")))
        took = time.monotonic() - began
    assert runs.done and runs.states == ["timed out", "timed out"], (runs.states, runs.errors)
    err = capsys.readouterr().err
    line = "the job timed out after 3 s: stopped ranks 0, 1" + AGAIN + " (with a longer --timeout)"
    assert rank_jobs.summary(runs.run_id) == line
    assert err.strip() == f"nbcluster: {line}", err  # one line, no failure summary of the ranks it ended
    assert took < 3 + 1 + 20, took  # the timeout, the grace, the ranks' start (torch's import)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("pid-*"))]
    assert len(pids) == 2
    _until("every rank's process ended", lambda: not any(_running(pid) for pid in pids), seconds=10)
    # Every rank's worker is free again: a new job starts on both.
    _both_back(two)
    again = run_ranks("import os\nos.getpid()", n=2, namespace=_ns())
    assert again.ok and set(again.values()).isdisjoint(pids), again.errors


LOOP = """
import time, nbcluster
step = 0
while True:
    step += 1
    nbcluster.report(step=step, loss=1 / step)
    time.sleep(0.05)
"""


def test_runs_stop_stops_the_whole_job(two: ClusterHandle, capsys: pytest.CaptureFixture[str]) -> None:
    runs = run_ranks(LOOP, n=2, namespace=_ns(), wait=False)
    trials = runs._trials
    assert trials is not None
    _until("both ranks report", lambda: {0, 1} <= set(trials.reports.last))
    runs.stop(1)  # one rank named: the job is one, so every rank stops
    runs.wait(30)
    assert runs.done and runs.states == ["stopped", "stopped"], (runs.states, runs.errors)
    assert all(v.reason == "stopped from the notebook" for v in runs.values())  # each rank ended by itself
    assert rank_jobs.summary(runs.run_id) == "the job was stopped from the notebook" + AGAIN


def _running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, or one gone between two looks, does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def test_resume_of_a_finished_job_takes_every_rank_from_the_journal(
    two: ClusterHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = "import nbcluster\nopen(LOG, 'a').write(f'ran {nbcluster.rank()}\\n')\nnbcluster.rank()"
    ns = _ns(LOG=str(tmp_path / "ran.log"))
    with dask.config.set({"nbcluster.journal.path": str(tmp_path / "journal")}):
        assert run_ranks(source, n=2, namespace=ns).values() == [0, 1]
        again = run_ranks(source, n=2, namespace=ns, resume=True)
    assert again.values() == [0, 1] and again.ok
    assert (tmp_path / "ran.log").read_text().split("\n").count("ran 0") == 1  # not run again
    assert "resumed 2/2" in capsys.readouterr().out


PART = """
import os, time, nbcluster
open(LOG, "a").write(f"ran {nbcluster.rank()}\\n")
if nbcluster.rank() == 0 and not os.path.exists(FIXED):
    while open(LOG).read().count("ran 1") < 1:  # rank 1 has finished first
        time.sleep(0.02)
    time.sleep(0.5)
    raise ValueError("a bad shard")
nbcluster.rank()
"""


def test_resume_of_a_job_that_ended_in_part_runs_every_rank_again(
    two: ClusterHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, fixed = tmp_path / "ran.log", tmp_path / "fixed"
    ns = _ns(LOG=str(log), FIXED=str(fixed))
    with dask.config.set({"nbcluster.journal.path": str(tmp_path / "journal")}):
        first = run_ranks(PART, n=2, namespace=ns)
        assert first.counts()["done"] == 1 and first.counts()["failed"] == 1, first.counts()
        fixed.write_text("")
        _both_back(two)
        capsys.readouterr()
        again = run_ranks(PART, n=2, namespace=ns, resume=True)
    assert again.ok and again.values() == [0, 1], again.errors
    assert log.read_text().split("\n").count("ran 1") == 2  # rank 1 ran again, with rank 0
    assert "--resume runs the job's 2 ranks again together" in capsys.readouterr().out


def test_a_cancel_of_a_trial_job_stops_every_rank_with_one_line(two: ClusterHandle, tmp_path: Path) -> None:
    source = "import os, nbcluster\nopen(PIDS + str(nbcluster.rank()), 'w').write(str(os.getpid()))\n" + LOOP
    runs = run_ranks(source, n=2, namespace=_ns(PIDS=str(tmp_path / "pid-")), wait=False)
    _until("both ranks run", lambda: len(list(tmp_path.glob("pid-*"))) == 2)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("pid-*"))]
    runs.cancel()  # what Ctrl-C in the waiting cell does
    assert runs.done and runs.states == ["stopped", "stopped"], (runs.states, runs.errors)
    assert rank_jobs.summary(runs.run_id) == "the job was stopped from the notebook: stopped ranks 0, 1" + AGAIN
    _until("every rank's process ended", lambda: not any(_running(pid) for pid in pids), seconds=5)


def test_the_magics_timeout_ends_the_job_with_one_line(
    shell: Any, two: ClusterHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.shell_helpers import cell

    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        cell(shell, "%%distribute --ranks 2 --timeout 2s --into stuck\nimport time\nwhile True:\n    time.sleep(0.05)")
    said = capsys.readouterr()
    line = "nbcluster: the job timed out after 2 s: stopped ranks 0, 1" + AGAIN + " (with a longer --timeout)"
    assert shell.user_ns["stuck"].states == ["timed out", "timed out"]
    # The ranks ended by force count as failed, but the cell says it in the job's one line
    # (beside the terminal's progress bar, which ends before or after it): no failure
    # summary, no RankStopped traceback.
    said_lines = said.err.strip().splitlines()
    others = [text for text in said_lines if text != line]
    assert said_lines.count(line) == 1 and all(text.startswith("stuck [") for text in others), said
    assert not said.out.strip(), said
    assert "items failed" not in said.err and "RankStopped" not in said.err, said
    stuck = shell.user_ns["stuck"]
    assert [e.type_name.rsplit(".", 1)[-1] for e in stuck.errors] == ["RankStopped", "RankStopped"]


FLAKY = """
import os, nbcluster
nbcluster.report(step=1, loss=1.0)
if nbcluster.rank() == 0 and not os.path.exists(FIXED):
    raise ValueError("a bad shard")
nbcluster.rank()
"""


def test_a_stop_after_the_job_ended_does_not_stop_its_retry(two: ClusterHandle, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed"
    runs = run_ranks(FLAKY, n=2, namespace=_ns(FIXED=str(fixed)))
    assert runs.done and runs.states[0] == "failed", runs.states
    runs.stop(1)  # too late: the job has ended, and nothing is to stop
    fixed.write_text("")
    _both_back(two)  # the failed job ended its ranks' processes
    runs.retry()
    assert runs.ok and runs.values() == [0, 1], (runs.states, runs.errors)
    assert rank_jobs.summary(runs.run_id) is not None  # the first start's line stays (a stop would replace it)
    assert rank_jobs.STOPS == {}


def test_a_retry_of_a_timed_out_job_times_out_again(two: ClusterHandle) -> None:
    forever = "import time, nbcluster\nnbcluster.report(step=1, loss=1.0)\nwhile True:\n    time.sleep(0.05)"
    with dask.config.set({"nbcluster.stop.grace": "1s"}):
        runs = run_ranks(forever, n=2, timeout="2s", namespace=_ns())
        assert runs.states == ["timed out", "timed out"] and len(runs.errors) == 2, runs.errors  # ended by force
        _both_back(two)
        runs.retry(wait=False)
        try:  # the retry's ranks are timed from their own start, and stopped as the first start's were
            _until("the retry's timeout", lambda: runs.done, seconds=2 + 1 + 20)
        finally:
            if not runs.done:
                runs.cancel()
    assert runs.states == ["timed out", "timed out"], (runs.states, runs.errors)


STEPS = """
import time, nbcluster
ck = nbcluster.checkpoint()
begun = (ck.load() or {"step": 0})["step"]
open(LOG, "a").write(f"start {nbcluster.rank()} {begun}\\n")
while open(LOG).read().count("start") % 2:  # both ranks loaded (as init_process_group waits for all)
    time.sleep(0.01)
for step in range(begun + 1, 1000):
    time.sleep(0.05)
    ck.save({"step": step})
    nbcluster.report(step=step, loss=1 / step)
"""


def test_resume_after_a_timeout_continues_the_job_from_its_checkpoint(two: ClusterHandle, tmp_path: Path) -> None:
    log = tmp_path / "steps.log"
    ns = _ns(LOG=str(log))
    with dask.config.set({"nbcluster.journal.path": str(tmp_path / "journal"),
                          "nbcluster.checkpoint.path": str(tmp_path / "checkpoints"), "nbcluster.stop.grace": "1s"}):  # fmt: skip
        first = run_ranks(STEPS, n=2, timeout="2s", namespace=ns)
        # Both ranks stopped at their next report: a stopped value each, not a failure.
        assert first.states == ["timed out", "timed out"] and first.counts()["done"] == 2, first.errors
        _both_back(two)
        again = run_ranks(STEPS, n=2, timeout="2s", namespace=ns, resume=True)
    assert again.states == ["timed out", "timed out"]
    starts = [line.split() for line in log.read_text().splitlines()]
    assert len(starts) == 4 and sorted(s[1] for s in starts[:2]) == sorted(s[1] for s in starts[2:]) == ["0", "1"]
    assert starts[0][2] == starts[1][2] == "0"
    assert starts[2][2] == starts[3][2] and int(starts[2][2]) > 10, starts  # both from rank 0's last save
