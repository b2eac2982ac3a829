"""One rank of a ``--ranks N`` job, on its worker: torchrun's environment, a start gate, clean-up.

The kernel (`run/ranks.py`) submits one task per rank, each pinned to a worker process of
its own, running `run_rank`. A rank:

1. sets torchrun's variables in the process's environment (`RANK`, `WORLD_SIZE`,
   `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), so
   ``torch.distributed.init_process_group()`` works with no arguments;
2. says it has started (it puts its rank on the job's Dask `Queue`) and waits at the start
   gate, a Dask `Variable` the kernel sets to ``"go"`` once every rank has started, or to
   ``"abort"`` when one could not start in time. So no rank ever enters a collective whose
   peers will not come: a partial start ends cleanly instead of hanging in gloo or NCCL;
   With ``--gpus``, ``CUDA_VISIBLE_DEVICES`` lists the GPUs of the ranks on its host in
   local-rank order, so ``torch.cuda.set_device(LOCAL_RANK)`` picks its own GPU and NCCL
   sees its peers' (unless this process had already started CUDA, whose device list is
   fixed then: the rank keeps its worker's own GPU as ``cuda:0``);
3. runs the cell or function as an item (`worker.run`), its output and error recorded as for
   any item;
4. destroys torch's default process group, if the item left one, and puts the environment
   back as it was, so the next task on that worker starts clean. The rank keeps its own
   reference to each group the item made until then (`process_groups`): freed with the
   item's DDP model, a gloo group can deadlock its worker.

A rank blocked in a collective cannot be interrupted from Python; when another rank fails,
the kernel ends this rank's worker process (its nanny starts a fresh one): that is how the
others stop within seconds, never a hang.

`rank()` and `world_size()` read the running rank, for code that does not use torch.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Any, TypedDict

import cloudpickle

from nbcluster import _compat
from nbcluster.worker import ErrorRecord, dump_result, error_record, process_groups, push, run

GATE_S = 60.0  # how long a started rank waits for the others before it gives up by itself
GATE_LOOK_S = 1.0  # how often a waiting rank checks that its task was not cancelled meanwhile
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The interface gloo and NCCL talk over, unless the user chose one: the one holding the
# address the cluster knows this worker by (the hostname may resolve to another, or to none
# the peers can reach).
IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class RankSpec(TypedDict):
    """What one rank is told (it crosses from the kernel to the worker)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    host: str  # this rank's worker's address, as the cluster knows it
    gate: str  # the job's name: its start queue is ``<gate>-started``, its gate variable ``<gate>-go``
    gpus: bool  # each rank has a GPU (``--gpus``): NCCL is expected to work
    # ``--gpus``: CUDA_VISIBLE_DEVICES for this rank, the GPUs of its host's ranks in local-rank
    # order (so ``cuda:LOCAL_RANK`` is its own, as under torchrun); None without GPUs.
    devices: str | None


class NcclWithoutGpu(RuntimeError):
    """A rank asked for NCCL on a worker without a GPU."""


class NotStarted(RuntimeError):
    """The job's ranks did not all start: this rank ran nothing."""


_RUNNING = threading.local()  # the spec of the rank this thread runs


def rank() -> int:
    """This process's rank in the ``--ranks`` job it runs: 0 to ``world_size() - 1``.

    Outside a rank it reads ``RANK`` (as torchrun sets it), else 0, so the same code runs
    in the kernel (``--local``) or under torchrun.

    Returns
    -------
    int
        The rank.

    Examples
    --------
    >>> import nbcluster
    >>> nbcluster.rank()  # in the kernel, outside a job
    0
    >>> nbcluster.ranks(nbcluster.rank, n=2).values()  # in each of two ranks
    [0, 1]
    """
    spec = getattr(_RUNNING, "spec", None)
    return spec["rank"] if spec is not None else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many ranks the running ``--ranks`` job has.

    Outside a rank it reads ``WORLD_SIZE`` (as torchrun sets it), else 1.

    Returns
    -------
    int
        The number of ranks.

    Examples
    --------
    >>> import nbcluster
    >>> nbcluster.world_size()  # in the kernel, outside a job
    1
    """
    spec = getattr(_RUNNING, "spec", None)
    return spec["world_size"] if spec is not None else int(os.environ.get("WORLD_SIZE", "1"))


def current() -> RankSpec | None:
    """The spec of the rank this thread runs; None outside a ``--ranks`` job.

    Returns
    -------
    RankSpec or None
        This rank's place in its job (``worker/checkpoint.py`` keys the job's one checkpoint by it).
    """
    spec: RankSpec | None = getattr(_RUNNING, "spec", None)
    return spec


def free_port() -> int:
    """A TCP port free on this host now: run on rank 0's worker to pick ``MASTER_PORT``.

    Returns
    -------
    int
        A port the system just handed out for binding to any address.
    """
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def end_process() -> None:
    """End this worker process at once (its nanny starts a fresh one): run by the kernel on
    the workers of ranks that must stop while they may be blocked in a collective."""
    os.kill(os.getpid(), 9)


def run_rank(
    spec: RankSpec, context: tuple[str, bytes | None], batch: bytes, token: str | None = None
) -> bytes:
    """The Dask task of one rank: environment, start gate, the item, clean-up.

    Parameters
    ----------
    spec : RankSpec
        This rank's place in the job.
    context : tuple of (str, bytes or None)
        The cell's context, as for `worker.run_batch`.
    batch : bytes
        The pickled ``(indices, items, budget)``: this rank's one item.
    token : str, optional
        The run's stop token.

    Returns
    -------
    bytes
        The result blob, as `worker.run_batch` returns it; when the job did not start, one
        failed item saying why.
    """
    saved = {name: os.environ.get(name) for name in (*ENV, *IFNAMES, "CUDA_VISIBLE_DEVICES")}
    interface = _interface(spec["host"])
    for name in IFNAMES:
        if interface and not os.environ.get(name):
            os.environ[name] = interface
    os.environ.update(
        RANK=str(spec["rank"]), WORLD_SIZE=str(spec["world_size"]), LOCAL_RANK=str(spec["local_rank"]),
        LOCAL_WORLD_SIZE=str(spec["local_world_size"]), MASTER_ADDR=spec["master_addr"],
        MASTER_PORT=str(spec["master_port"]),
    )  # fmt: skip
    if spec["devices"] and not _cuda_started():
        os.environ["CUDA_VISIBLE_DEVICES"] = spec["devices"]
    _RUNNING.spec = spec
    process_groups.keep()
    try:
        said = _gate(spec)
        if said != "go":
            blob = _failed(error_record(NotStarted(said), frames=False))
        else:
            blob = _nccl_line(dump_result(run(context, batch, token)), spec)
    finally:
        _RUNNING.spec = None
        _end_group()
        process_groups.release()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    push(blob)
    return blob


def _interface(host: str) -> str | None:
    """The network interface that holds `host`'s address on this machine; None if none does."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.address == host for a in addresses):
                return str(name)
    except Exception:  # no psutil (Dask brings it) or no permission: torch picks as it would
        pass
    return None


def _gate(spec: RankSpec) -> str:
    """Say this rank started, then wait for the kernel's word: ``"go"``, or why not.

    A rank whose task was cancelled (the kernel gave up on the job while this worker's
    thread was still taken, so the task ran late) returns at once: its gate is gone, and
    waiting there would hold the worker's thread from the next job's rank.
    """
    from distributed import Queue, Variable

    called_off = "the job was called off before this rank started: this rank ran nothing"
    if _called_off():
        return called_off
    deadline = time.monotonic() + GATE_S
    try:
        started = Queue(f"{spec['gate']}-started")
        started.put(spec["rank"])
        started.close()  # the kernel's handle keeps the queue until it has read every rank
        while True:
            try:
                return str(Variable(f"{spec['gate']}-go").get(timeout=GATE_LOOK_S))
            except TimeoutError:
                if _called_off():
                    return called_off
                if time.monotonic() > deadline:
                    return f"the other ranks did not start within {GATE_S:.0f} s: this rank ran nothing"
    except Exception as e:  # the scheduler unreachable: the job cannot start
        return f"the start gate could not be reached ({type(e).__name__}: {e}): this rank ran nothing"


def _called_off() -> bool:
    """Whether the kernel cancelled this rank's task (it then runs on only until it returns)."""
    key = _compat.running_task_key()
    task = _compat.worker_task(key) if key is not None else None
    return task is not None and task.state not in ("executing", "long-running")


def _failed(record: ErrorRecord) -> bytes:
    return cloudpickle.dumps(
        {"values": [None], "errors": {0: record}, "outputs": {}, "count": 1, "seconds": 0.0, "stopped": False}
    )


def _nccl_line(blob: bytes, spec: RankSpec) -> bytes:
    """A rank that failed asking for NCCL without a GPU gets one line naming the fix."""
    if spec["gpus"] or b"NCCL" not in blob:
        return blob
    result: dict[str, Any] = cloudpickle.loads(blob)
    for j, record in list(result.get("errors", {}).items()):
        if "NCCL" in record.get("message", "") and not _has_gpu():
            result["errors"][j] = error_record(
                NcclWithoutGpu(
                    "NCCL needs a GPU for each rank, and this rank's worker has none: run with "
                    "`--ranks N --gpus 1` on GPU workers, or use init_process_group('gloo')"
                ),
                frames=False,
            )
    return bytes(cloudpickle.dumps(result))


def own_device() -> str | None:
    """This worker's own GPU, the first of its ``CUDA_VISIBLE_DEVICES``; None without one.

    Returns
    -------
    str or None
        The device's index or UUID, as the worker was pinned to it.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[0].strip() or None if visible else None


def _cuda_started() -> bool:
    """Whether this process has started CUDA (its device list can no longer change)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def _has_gpu() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


def _end_group() -> None:
    """Destroy torch's default process group if the item left one (it holds the port and peers)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group (a peer gone): the next init makes a new one anyway
        pass
