"""What a finished batch says: its values and errors, or why it has none (`unpack`).

The driver (`engine.py`) reads each finished batch through `unpack`, which sorts a batch
that did not finish into the cases the policy acts on: its workers kept dying (*killed*),
nbcluster could not be imported where it ran (*halt*), a captured value was lost with its
holders (*lost*), the context could not load (*fatal*), or any other failure, which fails
each of its items with one record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import cloudpickle

from nbcluster import worker
from nbcluster._compat import nanny_logs
from nbcluster.errors import WorkerKilled


def _not_rescheduling(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Couldn't gather")


def quiet_rescheduling() -> None:
    """Keep the client's "Couldn't gather 1 keys, rescheduling" warning out of the cell.

    A worker that dies holding a finished batch's result makes Dask compute that batch
    again, and the run takes the result from the second computation; nothing is lost, so
    nothing belongs in the cell (where the kernel's log handler would print it).
    """
    log = logging.getLogger("distributed.client")
    if _not_rescheduling not in log.filters:
        log.addFilter(_not_rescheduling)


def internal_error(e: Exception) -> worker.ErrorRecord:
    """The record that fails a run's items when the driver itself raised (an nbcluster bug).

    Parameters
    ----------
    e : Exception
        What the driver raised; its frames go in the record, for the bug report.

    Returns
    -------
    ErrorRecord
        One line naming it as an internal error.
    """
    error = RuntimeError(f"nbcluster internal error while running the items: {type(e).__name__}: {e}")
    error.__cause__ = e
    return worker.error_record(error)


class Outcome(NamedTuple):
    """One finished batch, unpacked: its values, errors and output, or why it has none."""

    values: Sequence[Any]  # of the first len(values) items of the batch (fewer if it stopped early)
    errors: dict[int, worker.ErrorRecord]  # by position in the batch
    outputs: dict[int, Any]  # by item index
    seconds: float | None = None  # time the items took on the worker
    fatal: worker.ErrorRecord | None = None  # the context could not load: every batch would fail
    lost: tuple[str, str | None] | None = None  # (key no worker holds any more, who asked)
    killed: Any = None  # Dask's KilledWorker: every worker that ran the batch died
    halt: str | None = None  # nbcluster could not be imported to unpickle the batch: why
    held: list[Any] | None = None  # --persist: the workers' description of each value (HeldValue)
    ran_on: tuple[str, str] | None = None  # the worker that ran the batch: (address, name)
    idle: float | None = None  # how long its thread waited for it after its last batch of the run


def unpack(future: Any, result: Any, n: int) -> Outcome:
    """What the finished batch `future` of `n` items says, from its `result`.

    Parameters
    ----------
    future : distributed.Future or direct.Call
        The batch.
    result : Any
        Its result blob, or the exception it ended with.
    n : int
        Items in the batch.

    Returns
    -------
    Outcome
        Its values and errors, or the case it falls in (killed, halt, lost, fatal).
    """
    from distributed import KilledWorker

    # A result blob is a result even if the future reads "lost" by now: the worker that
    # held it died after it was gathered.
    if future.status != "finished" and not isinstance(result, bytes):
        exc = result[1] if isinstance(result, tuple) else result
        if (missing := _nbcluster_missing(exc)) is not None:
            return Outcome([], {}, {}, halt=missing)
        if isinstance(exc, KilledWorker) and len(exc.args) == 3:
            return Outcome([], {}, {}, killed=exc)
        if type(exc).__name__ == "CancelledError":
            exc = type(exc)("the batch was cancelled on the cluster")
        elif not isinstance(exc, BaseException):
            exc = RuntimeError(f"the batch failed: {exc!r}")
        return Outcome([None] * n, dict.fromkeys(range(n), worker.error_record(exc, frames=False)), {})
    try:
        data = cloudpickle.loads(result)
    except Exception as e:
        failed = TypeError(f"the results could not be loaded in the kernel: {type(e).__name__}: {e}")
        return Outcome([None] * n, dict.fromkeys(range(n), worker.error_record(failed)), {})
    if "lost" in data:
        return Outcome([], {}, {}, lost=(data["lost"], data.get("worker")))
    if "fatal" in data:
        return Outcome([None] * n, dict.fromkeys(range(n), data["fatal"]), {}, fatal=data["fatal"])
    return Outcome(
        data["values"], data["errors"], data["outputs"], data["seconds"], held=data.get("held"),
        ran_on=data.get("ran_on"), idle=data.get("idle"),
    )  # fmt: skip


def _nbcluster_missing(exc: Any) -> str | None:
    """The import error in `exc`'s chain that names nbcluster, as one line, else None.

    Dask wraps the scheduler's failure to unpickle a graph in its own multi-line
    RuntimeError; the cause it keeps says which module was missing.
    """
    for _ in range(8):  # a chain is short; a cycle must not hang the driver
        if not isinstance(exc, BaseException):
            return None
        if isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] == "nbcluster":
            return f"{type(exc).__name__}: {exc}"
        exc = exc.__cause__ or exc.__context__
    return None


def killed_record(client: Any, described: str, index: int, killed: Any) -> worker.ErrorRecord:
    """The failure record of item `index`, whose worker died each time it ran it.

    The nanny outlives its worker (and restarts it); its log says how the worker ended
    ("Worker process 4242 exited with status 1", or that it passed its memory budget).
    Dask keeps no stderr of the dead process itself.

    Parameters
    ----------
    client : distributed.Client or None
        The run's client, to ask the dead worker's nanny what it logged.
    described : str
        The item's parameters, as the plan describes them ("" for none).
    index : int
        The item.
    killed : distributed.KilledWorker
        What Dask said.

    Returns
    -------
    ErrorRecord
        One line with the count and the last thing the worker's nanny logged.
    """
    message = (
        f"item {index}{f' ({described})' if described else ''} killed its worker "
        f"{killed.allowed_failures + 1} times (a crash or out of memory)"
    )
    last, lines = killed.last_worker, []
    with contextlib.suppress(Exception):  # no nanny (`dask worker --no-nanny`), or it is gone too
        if last.nanny:
            lines = [str(msg).split(" - ", 3)[-1].strip() for _, msg in nanny_logs(client, last.nanny)]
    # Newest first. Nannies that share a process share its log: keep this worker's lines.
    pid = getattr(last, "pid", None)
    lines = [line for line in lines if pid is None or f"pid={pid})" in line or f"process {pid} " in line]
    for said in (line for wanted in ("memory budget", "Worker process") for line in lines if wanted in line):
        message += f"; the worker's nanny logged: {said}"
        break
    return worker.error_record(WorkerKilled(message), frames=False)
