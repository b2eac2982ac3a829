"""Worker side of `--persist`: a batch whose values stay on the worker, in Dask's store.

A persisted batch is the Dask task `run_batch_held(context, batch, token, *deps)`. It runs
the items as `run_batch` does, but returns a `Held`: the report blob (errors, output,
timings, and a `HeldValue` description of each value, made here, where the value is) and
the values themselves. The kernel never gathers a `Held`. It reads only its report, in the
worker's event loop (`report_of`; a task would wait for the worker's thread, which is
already running the next batch), or failing that with the small task `report`, and submits one `pick(held, j)` task per finished item,
pinned (loosely) to that worker: each is one Dask key holding one value, the same Python
object, so nothing is copied. Once the picks exist the kernel drops the batch's future and
Dask frees the `Held` (the values live on in the picks). Dask keeps the batch's task as
lineage: if a worker holding picks dies, Dask runs the batch again and picks again.

`deps` are the values of handles the batch reads (`--over "x in NAME"`, or a handle
captured by name): Dask resolves them on the worker that runs the batch, fetching from
another worker if needed, never through the kernel. In the batch's items (and in the
context's captured names) a `Slot(k)` stands for `deps[k]`.
"""

from __future__ import annotations

import copy
import pickle
from typing import TYPE_CHECKING, Any, NamedTuple

import cloudpickle

from nbcluster.distribute.worker import output, stopping
from nbcluster.distribute.worker.context import load
from nbcluster.distribute.worker.items import dump_result, run_items
from nbcluster.distribute.worker.objects import address, fetch, ran_on
from nbcluster.distribute.worker.records import error_record
from nbcluster.errors import Lost, NotRecomputed

if TYPE_CHECKING:
    from nbcluster._wire import HeldValue


#: The Dask event topic a persisted batch's report is pushed on (`distribute/reports.py`).
TOPIC = "nbcluster-held-report"
#: Reports larger than this (bytes) are not pushed, only read from the worker: the scheduler
#: keeps a topic's last events, and these must stay small there.
LARGEST = 8_192


class Slot(NamedTuple):
    """Stands for the `k`-th dependency of the task, in a batch's items or captured names."""

    k: int


class Held(NamedTuple):
    """A persisted batch's result, kept on its worker: the report blob and the values.

    `failed`: why an item has no value (its error, or why the batch ran no item). The first
    time, the kernel makes no pick for those; when Dask runs the batch again to recompute a
    lost pick (lineage), the item may fail where it once worked (a file it read is gone),
    and its pick must then fail too, not hold a `None` that looks like a result.
    """

    report: bytes
    values: list[Any]
    failed: dict[int, str]
    why: str = ""


def run_batch_held(
    context: tuple[str, bytes | None], batch: bytes, token: str | None, keep: bool, names: dict[str, int], *deps: Any
) -> Held | bytes:
    """The Dask task of a `--persist` batch, or (`keep` False) of one that reads handles.

    Without `keep` the values come back to the kernel as `run_batch`'s blob does.

    Parameters
    ----------
    context : tuple of (str, bytes or None)
        The cell's context key and, when it travels inline, the pickled context (as for
        `run_batch`).
    batch : bytes
        The pickled ``(indices, items, budget)``; items may hold `Slot`s.
    token : str or None
        The run's stop token.
    keep : bool
        True for a `--persist` batch, whose values stay here in a `Held`; False for a batch
        that only reads handles, whose values travel back.
    names : dict of str to int
        Handles captured by name: the cell's global name -> the index of its value in `deps`.
    *deps : Any
        The values of the handles the batch reads, which Dask resolves on this worker.

    Returns
    -------
    Held or bytes
        With `keep`, the `Held` (report and values); else the result blob of `run_batch`.
    """
    if stopping.stopped(token):
        return _early(keep, {"values": [], "errors": {}, "outputs": {}, "count": 0, "seconds": 0.0, "stopped": True})
    try:
        loaded = load(*context)
        large_values = tuple(fetch(key, size) for _, key, size in loaded.large)
    except Lost as e:
        return _early(keep, {"lost": e.key, "worker": address()})
    except BaseException as e:
        return _early(keep, {"fatal": error_record(e)})
    indices, items, budget = pickle.loads(batch)
    items = [fill(item, deps) for item in items]
    if names:  # handles captured by name: bound as the cell's globals, for this batch only
        loaded = copy.copy(loaded)
        loaded.namespace = {**loaded.namespace, **{n: deps[k] for n, k in names.items()}}
    output.install()
    result = run_items(loaded, indices, items, large_values, capture=True, token=token, budget=budget)
    result["ran_on"] = ran_on()  # for the kernel's journal: which worker ran the batch
    if not keep:
        return dump_result(result)
    values = result["values"]
    result["values"] = [None] * len(values)
    result["held"] = [describe(v) for v in values]
    failed = {j: f"{r['type']}: {r['message']}" for j, r in result["errors"].items()}
    why = "" if not result["stopped"] else "the batch stopped before it (the run was stopped, or out of time)"
    report = _dumps(result)
    _push(report)
    return Held(report, values, failed, why)


def _push(report: bytes) -> None:
    """Send this batch's report to the kernel as a Dask event, before the task ends (`reports.py`)."""
    if len(report) > LARGEST:
        return
    try:
        from distributed import get_worker

        dask_worker = get_worker()
        key = dask_worker.get_current_task()
    except ValueError:  # not in a Dask worker's task (a test calling the task directly)
        return
    if key is not None:
        dask_worker.log_event(TOPIC, {"key": str(key), "report": report})


def fill(item: Any, deps: tuple[Any, ...]) -> Any:
    """`item` with each `Slot` replaced by its dependency's value (one tuple level deep).

    Parameters
    ----------
    item : Any
        One item of a batch: a `Slot`, a tuple that may hold `Slot`s, or a plain value.
    deps : tuple
        The batch task's dependency values.

    Returns
    -------
    Any
        The item with its slots filled in.
    """
    if isinstance(item, Slot):
        return deps[item.k]
    if type(item) is tuple:
        return tuple(deps[v.k] if isinstance(v, Slot) else v for v in item)
    return item


def report(held: Held) -> bytes:
    """The Dask task that brings a persisted batch's report (not its values) to the kernel.

    Parameters
    ----------
    held : Held
        The persisted batch's result, which Dask passes in on its worker.

    Returns
    -------
    bytes
        Its pickled report.
    """
    return held.report


def report_of(key: str, dask_worker: Any = None) -> bytes:
    """`report` read straight from this worker's store (`client.run`, in its event loop).

    So the kernel need not wait for the worker's thread, busy with the next batch.

    Parameters
    ----------
    key : str
        The Dask key of the persisted batch.
    dask_worker : distributed.Worker
        The worker, which `client.run` passes in.

    Returns
    -------
    bytes
        The batch's pickled report.

    Raises
    ------
    KeyError
        When this worker does not hold the batch (the kernel then asks with `report`).
    """
    result: Held = dask_worker.data[key]
    return result.report


def pick(held: Held, j: int) -> Any:
    """The Dask task whose key holds value `j` of a persisted batch (the same object).

    Parameters
    ----------
    held : Held
        The persisted batch's result.
    j : int
        The item's position in the batch.

    Returns
    -------
    Any
        The item's value.

    Raises
    ------
    nbcluster.errors.NotRecomputed
        When the item has no value: it failed, or its batch ran no item. Only reached when
        Dask computes a lost pick again, since the kernel picks only finished items.
    """
    if j < len(held.values) and j not in held.failed:
        return held.values[j]
    raise NotRecomputed(f"computing it again failed: {held.failed.get(j) or held.why or 'the batch ran no item'}")


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

    shape = getattr(value, "shape", None)
    text: str | None = None
    if isinstance(shape, tuple):
        dtype = getattr(value, "dtype", None)
        text = f"{shape}{f' {dtype}' if dtype is not None else ''}"
    else:
        try:
            text = f"len {len(value)}"
        except Exception:
            text = None
    return {"type": type(value).__name__, "shape": text, "nbytes": int(sizeof(value))}


def _early(keep: bool, result: dict[str, Any]) -> Held | bytes:
    """A batch that ran no item: its report alone."""
    if not keep:
        return _dumps(result)
    why = "the run was stopped" if result.get("stopped") else "a value it reads was lost"
    if "fatal" in result:
        why = f"{result['fatal']['type']}: {result['fatal']['message']}"
    return Held(_dumps(result), [], {}, why)


def _dumps(result: dict[str, Any]) -> bytes:
    try:
        return cloudpickle.dumps(result)
    except Exception as e:  # an error record or output that cannot travel: say so for every item
        return cloudpickle.dumps({"fatal": error_record(TypeError(f"the batch's report cannot travel: {e}"))})


def holdings(dask_scheduler: Any = None) -> dict[str, dict[str, list[int]]]:
    """Per worker, per run id, the count and bytes of the `--persist` keys it holds in memory.

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
        if not str(key).startswith("persist-") or ts.state != "memory":
            continue
        run_id = str(key).split("-")[1]
        for ws in ts.who_has or ():
            entry = out.setdefault(ws.address, {}).setdefault(run_id, [0, 0])
            entry[0] += 1
            entry[1] += int(ts.nbytes or 0)
    return out
