"""`--ranks N` / `nbcluster.ranks`: N ranks of one job on real workers, with real PyTorch (gloo).

The ranks run on a 2-worker cluster of this module's own: the failure tests end worker
processes on purpose, which the session's shared cluster must not see.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import _compat, _current
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.errors import BadArgument
from nbcluster.run import ranks as rank_jobs
from nbcluster.run.api import distribute, launch
from nbcluster.run.api import ranks as run_ranks
from tests.shell_helpers import cell
from tests.waiting import until


@pytest.fixture(scope="module")
def _own() -> Iterator[ClusterHandle]:
    handle = nbcluster.start(workers=2, threads=1, name="ranks-tests")
    yield handle
    _current.forget(handle.name)
    handle.stop()


@pytest.fixture
def two(_own: ClusterHandle) -> ClusterHandle:
    """The module's 2 x 1-thread cluster, current, with both workers back (a test may end them)."""
    handle = _current.use(_own)
    deadline = time.monotonic() + 120
    pause = threading.Event()
    # The workers a failed job ended are on their way back, under new addresses.
    while len(set(listed := _compat.workers(handle.client)) - rank_jobs.ended(handle.client, listed)) < 2:
        assert time.monotonic() < deadline, "the workers did not come back"
        pause.wait(0.2)
    return handle


def _ns(**names: Any) -> dict[str, Any]:
    return {"__name__": "__main__", **names}


ENV = """
import os, nbcluster
(nbcluster.rank(), nbcluster.world_size(), os.getpid(),
 {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")})
"""


def test_each_rank_has_torchruns_environment_and_results_come_in_rank_order(two: ClusterHandle) -> None:
    runs = launch(ENV, ranks=2, namespace=_ns())
    assert runs.ok, runs.errors
    (r0, w0, pid0, env0), (r1, w1, pid1, env1) = runs.values()
    assert (r0, w0, r1, w1) == (0, 2, 1, 2) and pid0 != pid1  # a worker process of its own each
    assert (env0["RANK"], env1["RANK"], env0["WORLD_SIZE"]) == ("0", "1", "2")
    assert {env0["LOCAL_RANK"], env1["LOCAL_RANK"]} == {"0", "1"} and env0["LOCAL_WORLD_SIZE"] == "2"
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == "127.0.0.1"
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"] and int(env0["MASTER_PORT"]) > 0
    assert runs.params == [{"rank": 0}, {"rank": 1}]
    # The workers' environment is put back once the ranks end.
    left = two.client.run(lambda: [os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")])
    assert all(v == [None, None, None] for v in left.values()), left


def test_rank_zeros_output_shows_in_the_cell_and_any_ranks_on_asking(
    shell: InteractiveShell, two: ClusterHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cell(
            shell,
            "%%distribute --ranks 2 --into said\nimport nbcluster\nprint('hello from rank', nbcluster.rank())",
        )
        is None
    )
    out = capsys.readouterr().out
    assert "hello from rank 0" in out and "hello from rank 1" not in out
    assert "said.output(rank=r)" in out
    said = shell.user_ns["said"]
    assert said.output(rank=1) == "hello from rank 1\n" and said.output(rank=0) == "hello from rank 0\n"


def _no_queues(client: Any) -> bool:
    """Whether the scheduler holds no Dask queue, once the closes in flight (a stream message) landed."""
    def names(dask_scheduler: Any) -> list[str]:
        return sorted(dask_scheduler.extensions["queues"].queues)

    return bool(until(lambda: not client.run_on_scheduler(names), 10))


def test_python_function_form(two: ClusterHandle) -> None:
    def where() -> tuple[int, int]:
        return nbcluster.rank(), nbcluster.world_size()

    assert nbcluster.ranks(where, n=2).values() == [(0, 2), (1, 2)]
    assert _no_queues(two.client)  # a job leaves nothing behind on the scheduler


def test_a_worker_at_the_address_of_an_ended_one_is_another(two: ClusterHandle) -> None:
    # The OS reuses ports: a worker of this cluster may have the address of one a job ended
    # in an earlier cluster (CI saw it), and one a job ended here has gone from the scheduler.
    client = two.client
    listed = _compat.workers(client)
    elsewhere = ("tls://127.0.0.1:1", sorted(listed)[0])
    gone = (client.scheduler.address, "tls://127.0.0.1:2")
    rank_jobs.ENDED.update([elsewhere, gone])
    try:
        assert rank_jobs.ended(client, listed) == set()
        assert nbcluster.ranks(nbcluster.rank, n=2).values() == [0, 1]
        assert gone not in rank_jobs.ENDED  # forgotten, not kept for ever
    finally:
        rank_jobs.ENDED.discard(elsewhere)


def test_bad_input_gets_one_line(two: ClusterHandle) -> None:
    with pytest.raises(BadArgument, match=r"--ranks 3 needs 3 workers, .* has 2: `%cluster scale 3` first"):
        launch("1", ranks=3, namespace=_ns())
    with pytest.raises(BadArgument, match="cannot be combined with --over, --retries; drop them"):
        launch("1", ranks=2, over="x in range(3)", retries=1, namespace=_ns())
    with pytest.raises(BadArgument, match="cannot be combined with --persist; drop it"):
        launch("1", ranks=2, persist=True, into="kept", namespace=_ns())
    with pytest.raises(BadArgument, match="--ranks needs a whole number of 1 or more, got 0"):
        launch("1", ranks=0, namespace=_ns())


def test_nccl_without_gpus_is_one_line(two: ClusterHandle) -> None:
    pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
    runs = launch(
        "import torch.distributed as dist\ndist.init_process_group('nccl')", ranks=2, namespace=_ns()
    )
    line = (
        "NCCL needs a GPU for each rank, and this rank's worker has none: run with `--ranks N --gpus 1` on GPU "
        "workers, or use init_process_group('gloo')"
    )
    assert runs.counts()["failed"] == 2
    # The rank whose error came first has the line; the other has it too, or was stopped because of it.
    said = [e.message for e in runs.errors]
    assert line in said and all(m in (line, f"stopped because rank {1 - i} failed (NcclWithoutGpu: {line})")
                                for i, m in enumerate(said)), said  # fmt: skip


DDP = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group()
r, w = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 4, generator=g)
y = X @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]]) + 0.25
for step in range(30):
    opt.zero_grad()
    loss = ((ddp(X[r::w]) - y[r::w]) ** 2).mean()
    loss.backward()
    opt.step()
[p.detach().clone() for p in model.parameters()]
"""


def test_ddp_on_two_cpu_ranks_trains_as_one_process_on_the_global_batch(two: ClusterHandle) -> None:
    torch = pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
    runs = launch(DDP, ranks=2, namespace=_ns())
    assert runs.ok, runs.errors and runs.errors[0].traceback
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 4, generator=g)
    y = X @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]]) + 0.25
    for _ in range(30):  # the same 64 rows, as one batch (the ranks' halves are the even and odd rows)
        opt.zero_grad()
        ((model(X) - y) ** 2).mean().backward()
        opt.step()
    alone = [p.detach() for p in model.parameters()]
    for rank_weights in runs.values():
        for got, want in zip(rank_weights, alone, strict=True):
            assert torch.allclose(got, want, atol=1e-5), (got, want)
    assert not torch.allclose(alone[0], torch.nn.Linear(4, 1).weight)  # it did train


# A torchrun script's ending: destroy the group, then return. The function's locals then go,
# DDP's reducer last, with the group's last reference unless the rank keeps one
# (nbcluster/worker/process_groups.py); without it, a rank hung in about one job of six here.
ENDS_AS_TORCHRUN = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def train():
    dist.init_process_group()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()
    return dist.get_rank() if dist.is_initialized() else "destroyed"

train()
"""


def test_a_job_that_destroys_its_group_and_returns_ends_every_time(two: ClusterHandle) -> None:
    pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
    for job in range(12):
        runs = launch(ENDS_AS_TORCHRUN, ranks=2, namespace=_ns(), timeout=30)
        assert runs.ok, f"job {job}: {runs.errors and runs.errors[0].message}"
        assert runs.values() == ["destroyed", "destroyed"]


KEEPS = """
import os, sys
from nbcluster.worker import process_groups
assert "torch" not in sys.modules
process_groups.keep()  # before torch.distributed is imported: it is wrapped as it loads
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
world = dist.group.WORLD
dist.destroy_process_group()
assert process_groups._kept == [world], process_groups._kept
process_groups.release()
assert process_groups._kept == []
dist.init_process_group("gloo")  # outside a rank: nothing kept
assert process_groups._kept == []
dist.destroy_process_group()
print("kept")
"""


def test_a_rank_keeps_the_groups_torch_makes_even_when_torch_loads_later() -> None:
    pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", KEEPS, str(port)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "kept", done.stderr[-2000:]


KILLED = """
import os, signal, time, torch, torch.distributed as dist
dist.init_process_group()
t = torch.zeros(1)
step = 0
while True:  # rank 0 would all-reduce forever without rank 1
    dist.all_reduce(t)
    step += 1
    if dist.get_rank() == 1 and step == 200:
        with open(MARK, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
"""

RAISES = """
import time, torch, torch.distributed as dist
dist.init_process_group()
if dist.get_rank() == 1:
    time.sleep(0.5)
    with open(MARK, "w") as f:
        f.write(repr(time.time()))
    raise ValueError("a bad shard")
dist.all_reduce(torch.zeros(1))  # rank 0 waits for rank 1 here: gloo's own timeout is 30 minutes
"""


def _ended_after(runs: Any, mark: Path) -> float:
    done = threading.Event()
    runs.subscribe(lambda r: r.done and done.set())
    assert done.wait(120) or runs.done, runs.counts()
    return time.time() - float(mark.read_text())


def test_a_rank_killed_mid_training_stops_the_other_within_5_s(two: ClusterHandle, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
    mark = tmp_path / "killed"
    runs = launch(KILLED, ranks=2, namespace=_ns(MARK=str(mark)), wait=False)
    assert _ended_after(runs, mark) < 5.0
    assert runs.counts()["failed"] == 2
    line = rank_jobs.cause(runs.run_id)
    assert line is not None and line.startswith("rank 1's worker left while it ran"), line
    assert runs.errors[1].message == "rank 1's worker left while it ran"


def test_a_rank_that_raises_stops_the_other_within_5_s(
    two: ClusterHandle, tmp_path: Path, capsys: Any
) -> None:
    pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")
    mark = tmp_path / "raised"
    runs = launch(RAISES, ranks=2, namespace=_ns(MARK=str(mark)), wait=False)
    assert _ended_after(runs, mark) < 5.0
    first, second = runs.errors
    assert (second.index, second.type_name, second.message) == (
        1,
        "ValueError",
        "a bad shard",
    )  # its own error
    # Rank 0 was stopped, or saw rank 1's process group go first (gloo's own error, shown as it is).
    assert first.message == "stopped because rank 1 failed (ValueError: a bad shard)" or (
        "Connection closed by peer" in first.message
    ), first.message
    assert (rank_jobs.cause(runs.run_id) or "").startswith("rank 1 failed (ValueError: a bad shard)")


def test_no_rank_starts_until_every_rank_can(two: ClusterHandle, capsys: pytest.CaptureFixture[str]) -> None:
    client = two.client
    busy = sorted(client.run(os.getpid))[0]
    release = f"release-{time.monotonic_ns()}"
    from distributed import Event

    blocker = client.submit(
        lambda name: (Event(name).wait(120), time.time())[1], release, workers=[busy], pure=False
    )
    while not client.processing([busy])[busy]:  # its only thread is taken
        threading.Event().wait(0.05)
    runs = launch("import time\ntime.time()", ranks=2, namespace=_ns(), wait=False)
    said = threading.Event()
    deadline = time.monotonic() + 30
    while "waiting for 2 workers with a free thread" not in capsys.readouterr().out:
        assert time.monotonic() < deadline, "no line said what the job waits for"
        said.wait(0.1)
    assert runs.counts()["running"] == 2 and not runs.done  # neither rank started alone
    Event(release, client=client).set()
    freed_at = blocker.result(60)
    runs.wait(60)
    assert runs.ok, runs.errors
    assert min(runs.values()) >= freed_at  # both ranks started only once both workers were free


STUCK = """
import os, time, nbcluster
if nbcluster.rank() == 0:
    with open(PIDFILE, "w") as f:
        f.write(str(os.getpid()))
    while True:  # stuck, as a rank waiting in a collective for a peer that will never come
        time.sleep(0.05)
time.sleep(1.0)
with open(MARK, "w") as f:
    f.write(repr(time.time()))
raise ValueError("rank 1 gave up")
"""


def test_a_stuck_rank_is_ended_when_another_fails(two: ClusterHandle, tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    mark, pidfile = tmp_path / "failed", tmp_path / "pid"
    runs = launch(STUCK, ranks=2, namespace=_ns(MARK=str(mark), PIDFILE=str(pidfile)), wait=False)
    assert _ended_after(runs, mark) < 5.0
    assert runs.errors[0].message == "stopped because rank 1 failed (ValueError: rank 1 gave up)"
    pid = int(pidfile.read_text())
    deadline = float(mark.read_text()) + 5.0
    pause = threading.Event()
    while _running(psutil, pid):
        assert time.time() < deadline, "rank 0's worker process still runs 5 s after rank 1 failed"
        pause.wait(0.1)


def test_a_partial_start_runs_nothing_and_fails_the_job(two: ClusterHandle, tmp_path: Path) -> None:
    # The race the wait for free workers cannot close: a worker's thread taken between the look
    # and the submit. Made here for good: rank 1's worker (ranks go by address) has its one
    # thread taken by a call handed straight to its thread pool, which the scheduler never sees.
    client = two.client
    rank_ones = sorted(set(listed := _compat.workers(client)) - rank_jobs.ended(client, listed))[1]

    def take_the_thread(dask_worker: Any) -> None:
        dask_worker.nbc_test_gate = threading.Event()
        dask_worker.executor.submit(dask_worker.nbc_test_gate.wait, 120)

    def free_the_thread(dask_worker: Any) -> None:
        dask_worker.nbc_test_gate.set()

    client.run(take_the_thread, workers=[rank_ones])
    ran = tmp_path / "ran"
    try:
        with dask.config.set({"nbcluster.ranks.start": "3s"}):
            runs = run_ranks("import nbcluster\nopen(RAN + str(nbcluster.rank()), 'w').close()", n=2,
                             namespace=_ns(RAN=str(ran)))  # fmt: skip
    finally:
        client.run(free_the_thread, workers=[rank_ones], on_error="return")
    assert runs.counts()["failed"] == 2
    assert not list(tmp_path.glob("ran*"))  # rank 0 started, and ran nothing
    line = "rank 1 did not start within 3 s (their workers were busy): no rank ran; run the cell again"
    assert rank_jobs.cause(runs.run_id) == line
    assert {e.message for e in runs.errors} == {line}
    # Rank 1's task, cancelled while the thread was taken, ran once it came back: it returns at
    # once, not waiting at the gone gate with the thread the next job's rank 1 needs.
    assert run_ranks("1", n=2, namespace=_ns()).values() == [1, 1]
    assert _no_queues(client)


SPAN = """%%distribute --ranks 2 --into job
import os, torch, torch.distributed as dist
from distributed import get_worker
dist.init_process_group()
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
[dist.get_rank(), float(t[0]), os.environ["MASTER_ADDR"], get_worker().address]
"""


@pytest.mark.timeout(300)
def test_ranks_span_two_namespace_hosts(tmp_path: Path) -> None:
    # Four hosts (tests/netns_service.py): the kernel on host 0, the scheduler on host 1, one
    # worker on each of hosts 2 and 3. The ranks' gloo traffic crosses the bridge between them.
    pytest.importorskip("torch", reason="the `train` extra: pip install 'nbcluster[train]'")

    import yaml

    from tests.netns_kernel import Kernel, profile
    from tests.netns_service import Hosts, leftover_namespaces

    with Hosts(tmp_path / "hosts", 4) as hosts:
        config = tmp_path / "dask"
        config.mkdir()
        (config / "hosts.yaml").write_text(
            yaml.safe_dump({"nbcluster": {"profiles": {"hosts": profile(hosts)}}})
        )
        env = {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")},
            "DASK_CONFIG": str(config),
            "NBCLUSTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        }
        _, _, *worker_hosts = hosts.addresses
        with Kernel(hosts, 0, tmp_path / "kernel", env) as kernel:
            kernel.run("%load_ext nbcluster\n%cluster start --profile hosts --name hosts\nimport json")
            kernel.run(SPAN, timeout=180)
            got = kernel.run(
                "", values="json.dumps(job.values())", errors="json.dumps([e.message for e in job.errors])"
            )
            assert got["errors"] == [], got
            (r0, sum0, master0, on0), (r1, sum1, master1, on1) = got["values"]
            assert (r0, r1, sum0, sum1) == (0, 1, 3.0, 3.0)  # the all-reduce crossed the hosts
            hosts_of = [a.split("://")[-1].rsplit(":", 1)[0] for a in (on0, on1)]
            assert sorted(hosts_of) == sorted(worker_hosts)  # one rank on each host
            assert master0 == master1 == hosts_of[0]  # rank 0's host, by its address on the bridge
            kernel.run("%cluster stop hosts")
    assert leftover_namespaces() == []


def test_ranks_with_gpus_get_a_gpu_worker_each_simulated(
    runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A simulation: workers that advertise a GPU with no device behind them (tests/test_gpu.py).
    # The placement and environment are real; NCCL itself needs the device (bench/gpu_check.sh).
    from nbcluster.cluster import gpu

    monkeypatch.setenv(gpu.SIMULATE_ENV, "2")
    handle = nbcluster.start(workers=1, gpu_workers="auto", name="ranks-gpus")
    try:
        source = (
            "import os\nfrom distributed import get_worker\n"
            "(get_worker().name, os.environ['CUDA_VISIBLE_DEVICES'], int(os.environ['LOCAL_RANK']), os.getpid())"
        )
        runs = launch(source, ranks=2, gpus=1, namespace=_ns(), client=handle.client)
        assert runs.ok, runs.errors
        assert sorted(v[0] for v in runs.values()) == ["gpu-0", "gpu-1"]  # one GPU worker each
        for name, visible, local_rank, _ in runs.values():
            # As under torchrun: the host's ranks' GPUs in local-rank order, so that
            # cuda:LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK)) is this rank's own GPU.
            assert visible.split(",")[local_rank] == name.removeprefix("gpu-"), runs.values()
            assert sorted(visible.split(",")) == ["0", "1"]
        # The ranks' processes end with the job: the next task there sees only its own GPU.
        pids = [v[3] for v in runs.values()]
        deadline, pause = time.monotonic() + 60, threading.Event()
        while True:
            seen = handle.client.run(lambda: (os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")), on_error="return")
            gpu_seen = [v for v in seen.values() if isinstance(v, tuple) and v[1] is not None and v[0] not in pids]
            if len(gpu_seen) == 2:
                break
            assert time.monotonic() < deadline, f"the GPU workers did not come back: {seen}"
            pause.wait(0.2)
        assert sorted(v[1] for v in gpu_seen) == ["0", "1"]
        with pytest.raises(
            BadArgument, match=r"--ranks 3 needs 3 GPU workers, .* `%cluster scale 3 --kind gpu` first"
        ):
            launch("1", ranks=3, gpus=1, namespace=_ns(), client=handle.client)
    finally:
        handle.stop()


def test_a_gpu_worker_busy_with_a_gpu_item_is_no_room_for_a_gpu_rank_simulated(
    runtime_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A simulation, as above. A GPU worker has several threads (fractional --gpus items share
    # its GPU); one running a --gpus 1 item has threads free but no GPU: the job waits for it,
    # all or nothing, rather than starting one rank while the other waits in Dask's scheduler.
    from nbcluster.cluster import gpu

    monkeypatch.setenv(gpu.SIMULATE_ENV, "2")
    handle = nbcluster.start(workers=1, gpu_workers="auto", name="ranks-gpu-busy")
    go, began = tmp_path / "go", tmp_path / "began"
    try:
        hold = "import os, time\nopen(BEGAN, 'w').close()\nwhile not os.path.exists(GO):\n    time.sleep(0.02)\n1"
        item = distribute(hold, over=[0], needs=nbcluster.Needs(gpus=1), namespace=_ns(GO=str(go), BEGAN=str(began)),
                          on=handle, wait=False)  # fmt: skip
        _until("the --gpus 1 item runs", began.exists)
        assert all(w["nthreads"] > 1 for w in _compat.workers(handle.client).values() if "GPU" in w["resources"])
        capsys.readouterr()
        job = run_ranks("import os\nos.environ['CUDA_VISIBLE_DEVICES']", n=2, needs=nbcluster.Needs(gpus=1),
                        namespace=_ns(), on=handle, wait=False)  # fmt: skip
        waiting = "nbcluster: waiting for 2 workers with a free GPU to start the 2 ranks together (1 free now)"
        said: list[str] = []
        _until("the job's waiting line", lambda: said.append(capsys.readouterr().out) or waiting in "".join(said))
        assert not job.done
        go.write_text("")  # the GPU is free: the job starts, on both GPU workers
        item.wait(30)
        job.wait(60)
        assert item.ok and job.ok, (item.errors, job.errors)
    finally:
        go.write_text("")
        handle.stop()


def _until(what: str, ready: Any, seconds: float = 30) -> None:
    pause, deadline = threading.Event(), time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:.0f} s"
        pause.wait(0.05)


BOTH_STUCK = """
import os, time, nbcluster
with open(PIDS + str(nbcluster.rank()), "w") as f:
    f.write(str(os.getpid()))
while True:  # both ranks stuck, as in a collective that never completes
    time.sleep(0.05)
"""


def test_a_cancel_or_ctrl_c_ends_every_rank(two: ClusterHandle, tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    runs = launch(BOTH_STUCK, ranks=2, namespace=_ns(PIDS=str(tmp_path / "pid-")), wait=False)
    pause = threading.Event()
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid-*"))) < 2:  # both ranks are running the cell
        assert time.monotonic() < deadline, "the ranks did not start"
        pause.wait(0.05)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("pid-*"))]
    began = time.monotonic()
    runs.cancel()  # what Ctrl-C in the waiting cell does
    assert runs.done and runs.counts()["cancelled"] + runs.counts()["failed"] == 2
    line = "the job was stopped from the notebook: stopped ranks 0, 1; --resume runs it again from its last checkpoint"
    assert rank_jobs.summary(runs.run_id) == line
    for pid in pids:
        while _running(psutil, pid):
            assert time.monotonic() - began < 5.0, f"rank process {pid} still runs 5 s after the cancel"
            pause.wait(0.1)


def test_an_adaptive_cluster_grows_for_the_ranks(runtime_dir: Path) -> None:
    handle = nbcluster.start(workers=1, threads=1, name="ranks-adapt")
    try:
        handle.adapt(1, 2)
        with pytest.raises(
            BadArgument, match=r"--ranks 3 needs 3 workers, .* adapts up to 2: `%cluster adapt --max 3`"
        ):
            launch("1", ranks=3, namespace=_ns(), cluster="ranks-adapt")
        # One worker now: the missing rank is reported to the scheduler as work held back,
        # and the cluster grows to two; then both ranks start together.
        runs = launch(
            "import os\nos.getpid()", ranks=2, namespace=_ns(), cluster="ranks-adapt", wait=False
        )
        runs.wait(90)
        if not runs.done:
            runs.cancel()
        assert runs.done and runs.ok, (
            f"the cluster did not grow for the ranks: {runs.counts()}, {handle.info()}"
        )
        assert len(set(runs.values())) == 2
    finally:
        handle.stop()


def _running(psutil: Any, pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, or one gone between two looks, does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
