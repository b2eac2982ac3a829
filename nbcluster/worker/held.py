"""Worker side of `--persist`: an item whose value stays on the worker, under its own Dask key.

A persisted item is one Dask task, `run_batch_held(context, batch, token, True, names,
*deps)` with a batch of that one item (the engine sends no more, `engine._policy`: a Dask
key holds one value, so a batch of several would need a second task per item to give each
value a key of its own, and the kernel would wait a round trip for those). The task's result,
kept in the worker's memory under its key, is the item's value itself: the kernel's handle
(`handles.Handle`) is the task's future, and nothing is copied. A task whose item raised, or
was not run (the run stopped, a value it reads was lost), raises `NotRecomputed` once its
report is out, so that its key never holds anything that looks like a result.

The kernel never gathers the value. What it needs, the item's *report* (its error or output,
its time, and a `HeldValue` description of the value, made here where the value is), is
pushed to it as a Dask event before the task ends (`worker.push`, `run/transport.py`), and
kept in this process as well (`KEPT`, a few MB at most, the oldest dropped first). Where
the event did not come the kernel reads the kept report in the worker's event loop
(`report_of`; a task would wait for the worker's thread, which is already running the next
item), and failing that runs the small task `report_for`, which describes the value again.
(A task that raised holds nothing to run there: the report of a failed item, too large to
push, is asked of every worker, `report_of`.)

Lineage: if a worker holding a value dies, Dask runs the item's task again elsewhere. The item
may then fail where it once worked (a file it read is gone): the task raises, and Dask hands
that error to whatever reads the key, a task depending on it or the kernel's `Handle.gather`,
never a `None` that looks like a result.

`deps` are the values of handles the batch reads (`--over "x in NAME"`, or a handle
captured by name): Dask resolves them on the worker that runs the batch, fetching from
another worker if needed, never through the kernel. In the batch's items (and in the
context's captured names) a `Slot(k)` stands for `deps[k]` (`worker.run` fills them in).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from nbcluster._compat import running_task_key
from nbcluster.errors import NotRecomputed
from nbcluster.worker import dump_result, push, run, run_batch
from nbcluster.worker.context import Kept

if TYPE_CHECKING:
    from nbcluster._wire import HeldValue


#: This process's reports for `report_of`: 16 MB of the newest.
KEPT = Kept[bytes](limit=16_000_000)


def run_batch_held(context: tuple[str, bytes | None], batch: bytes, token: str | None, keep: bool,
                   names: dict[str, int], *deps: Any) -> Any:  # fmt: skip
    """The Dask task of a `--persist` item, or (`keep` False) of a batch that reads handles.

    Without `keep` the values come back to the kernel as `run_batch`'s blob does.

    Parameters
    ----------
    context : tuple of (str, bytes or None)
        The cell's context key and, when it travels inline, the pickled context (as for
        `run_batch`).
    batch : bytes
        The pickled ``(indices, items, budget)``, one item with `keep`; items may hold `Slot`s.
    token : str or None
        The run's stop token.
    keep : bool
        True for a `--persist` item, whose value stays here as the task's result; False for a
        batch that only reads handles, whose values travel back.
    names : dict of str to int
        Handles captured by name: the cell's global name -> the index of its value in `deps`.
    *deps : Any
        The values of the handles the batch reads, which Dask resolves on this worker.

    Returns
    -------
    Any
        With `keep`, the item's value (its report is kept for `report_of`); else the result
        blob of `run_batch`.

    Raises
    ------
    nbcluster.errors.NotRecomputed
        With `keep`, when the item has no value (it raised, or was not run), after its report
        is kept: the first time the kernel reads the report, not this; when Dask computes a
        lost value again, this is the error that whatever reads the key gets.
    """
    if not keep:
        return run_batch(context, batch, token, deps, names)
    result = run(context, batch, token, deps, names)
    values = result.get("values", [])  # none when no item ran: stopped, a value lost, a context that cannot load
    if "values" in result:
        result["values"], result["held"] = [None] * len(values), [describe(v) for v in values]
    report = dump_result(result)
    KEPT.add(str(running_task_key()), report, len(report))  # a persisted item is always a Dask task
    push(report)
    if values and 0 not in result["errors"]:
        return values[0]
    error = result.get("fatal") or result.get("errors", {}).get(0)
    why = "a value it reads was lost" if "lost" in result else "the run was stopped"
    raise NotRecomputed(f"computing it again failed: {error['type']}: {error['message']}" if error else why)


def report_of(key: str) -> bytes:
    """The kept report of persisted item `key` (`client.run` on its holder, in its event loop).

    So the kernel need not wait for the worker's thread, busy with the next item. A report is
    handed out once.

    Parameters
    ----------
    key : str
        The Dask key of the persisted item.

    Returns
    -------
    bytes
        The item's pickled report.

    Raises
    ------
    KeyError
        When this process keeps no report of `key`.
    """
    return KEPT.get(key, take=True)


def report_for(value: Any) -> bytes:
    """The Dask task that describes a persisted value again, when its report was not kept.

    Its output and timing are gone by then; the value is not.

    Parameters
    ----------
    value : Any
        The persisted item's value, which Dask passes in on its worker.

    Returns
    -------
    bytes
        A pickled report of the one item.
    """
    report = {"values": [None], "errors": {}, "outputs": {}, "count": 1, "seconds": None, "held": [describe(value)]}
    return dump_result(report)


def describe(value: Any) -> HeldValue:
    """Type, shape or length, and size of a value, for its handle's repr.

    Parameters
    ----------
    value : Any
        One item's value, on its worker.

    Returns
    -------
    HeldValue
        ``type`` (the class name), ``shape`` (``"(3, 4) float64"``, ``"len 10"`` or None)
        and ``nbytes`` (Dask's `sizeof`).
    """
    from dask.sizeof import sizeof

    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    text = f"{shape}{'' if dtype is None else f' {dtype}'}" if isinstance(shape, tuple) else None
    if text is None:
        with contextlib.suppress(Exception):
            text = f"len {len(value)}"
    return {"type": type(value).__name__, "shape": text, "nbytes": int(sizeof(value))}


def holdings(dask_scheduler: Any = None) -> dict[str, dict[str, list[int]]]:
    """Per worker, per run id, the count and bytes of the `--persist` values it holds in memory.

    Run on the scheduler (`client.run_on_scheduler`), for `%cluster status`.

    Parameters
    ----------
    dask_scheduler : distributed.Scheduler
        The scheduler, which `run_on_scheduler` passes in.

    Returns
    -------
    dict
        Worker address -> run id -> ``[count, bytes]``.
    """
    out: dict[str, dict[str, list[int]]] = {}
    for key, ts in dask_scheduler.tasks.items():
        if str(key).startswith("persist-") and ts.state == "memory":
            for ws in ts.who_has or ():
                entry = out.setdefault(ws.address, {}).setdefault(str(key).split("-")[1], [0, 0])
                entry[0], entry[1] = entry[0] + 1, entry[1] + int(ts.nbytes or 0)
    return out
