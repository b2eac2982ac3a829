"""What runs on a worker (and, for `--local`, in the kernel): one batch of items.

A Dask task is `run_batch((context_key, inline_context), batch, token)`, with no Dask
dependencies at all, so the scheduler treats every batch as a root task and hands them
out from its queue to whichever thread is free. The kernel sends three functions of this
package, pickled by reference (`run_batch`; `stop_run` and `pin`, from `context.py`): keep
their names.
A run's first batches come as a request to the worker itself instead (`direct.py`), which
runs the same `run_blob` in the same thread pool, without the scheduler, and sends its first
item's result ahead when the batch goes on.

- `batch` is one opaque blob `(indices, items, budget)`: Dask never walks into it, so its
  cost does not grow with the items inside.
- The cell's *context* (code, small captured values, how an item binds names) is
  unpickled once per worker, and its *large values* are kept outside Dask's store:
  `context.py`. A key that no worker holds any more (every holder died) comes back as
  `{"lost": key}`; the kernel scatters it again and resubmits the batch.
- The items run in `items.py`, in chunks, their prints and `display()`s kept apart per
  item; an item's exception becomes a record in `records.py`. One batch's path:
  `run_batch` -> `run` -> `context.load`/`fetch` -> `items.run_items` -> `items.dump_result`.
- A `--persist` item's value stays on its worker under its own key (`held.py`).
- A trial item reports metrics, is asked to stop and may checkpoint (`trial.py`,
  `checkpoint.py`); a rank of a `--ranks` job runs with torchrun's environment (`rank.py`);
  `worker_local` keeps a value per worker process, on purpose (`local.py`).

A batch may carry a time *budget*: it returns, between chunks of items, once the budget is
spent, with the items it reached; the kernel sends the rest again. So a batch sized from a
misleading estimate still comes back on time (see `run/policy.py`).

The task returns one opaque blob: per-item values, error records, captured output, the
time spent in the items and how long the thread waited for the batch since its last one of
the run (`idle`, for the batch sizing in `run/policy.py`; measured with the thread's own
clock). A small blob is also pushed to the kernel as a Dask event just before the task ends
(`push`), which saves the kernel a gather. A batch never raises for an item. Only a
context that cannot even be loaded fails the whole batch, again as a returned record
(`{"fatal": record}`).

Stopping (`context.py`, `items.py`): a batch carries its run's *stop token*. `stop_run(token)`,
sent to every worker by the kernel on interrupt or `Results.cancel()`, makes a batch return
with the items it finished, `"stopped": True`, before its next chunk of items (a few ms,
or one item). So a cancel keeps finished work, and a worker thread is free again one item
later (Dask cannot stop a running thread, and cancelling the task on the scheduler would
throw the finished items away). A batch whose Dask task was cancelled outright also stops,
checked every 50 ms.

This package imports nothing from nbcluster but base modules (`errors`, `_compat`, `_wire`):
a worker needs cloudpickle and Dask, and loads no kernel-side module
(`tests/test_worker_imports.py`).
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from nbcluster._wire import PUSHED_TOPIC, Pushed
from nbcluster.errors import Lost
from nbcluster.worker.context import INLINE_CONTEXT, Context, fetch, load, pin, ran_on, stop_run, stopped_run
from nbcluster.worker.items import dump_result, install, run_items, without_first
from nbcluster.worker.records import ErrorRecord, error_record

if TYPE_CHECKING:
    from nbcluster.worker.direct import FirstAhead

__all__ = ["INLINE_CONTEXT", "Context", "ErrorRecord", "Slot", "error_record", "pin", "push", "run_batch", "run_blob",
           "run_items", "stop_run"]  # fmt: skip

#: Blobs larger than this (bytes) are not pushed, only gathered: the scheduler keeps a topic's
#: last events (`distributed.admin.low-level-log-length`), and these must stay small there.
LARGEST_PUSH = 8_192
_thread = threading.local()  # `ended`: (stop token, perf_counter) at the end of the thread's last batch


class Slot(NamedTuple):
    """Stands for the `k`-th dependency of a task (`held.py`), in a batch's items or captured names."""

    k: int


def run_batch(context: tuple[str, bytes | None], batch: bytes, token: str | None = None) -> bytes:
    """The Dask task: run a batch of items, return the opaque result blob.

    Parameters
    ----------
    context : tuple of (str, bytes or None)
        The cell's context: its key in the worker's context cache, and the pickled context
        itself when it travels inline (else the worker fetches it by key, once).
    batch : bytes
        The pickled ``(indices, items, budget)`` of this batch.
    token : str, optional
        The run's stop token: once `stop_run` was sent it, the batch returns before its next
        chunk of items.

    Returns
    -------
    bytes
        The cloudpickled result: per-item values, error records, output, the count and time of
        the items run, and ``"stopped"`` when stopped early; or ``{"lost": key, "worker": ...}``
        when a large value is held by no worker any more, or ``{"fatal": record}`` when the
        context cannot be loaded. It never raises for an item.
    """
    blob = run_blob(context, batch, token)
    push(blob)
    return blob


def run_blob(context: tuple[str, bytes | None], batch: bytes, token: str | None = None, ahead: FirstAhead | None = None,
             deps: tuple[Any, ...] = (), names: dict[str, int] | None = None) -> bytes:  # fmt: skip
    """`run_batch` without the push: what a batch sent to the worker directly runs
    (`direct.py`); `held.py` and `rank.py` push their own results.

    The result says how long this thread waited since it ended its last batch of the same
    run (``idle``, for the batch sizing in `batching.py`).

    Parameters
    ----------
    context : tuple of (str, bytes or None)
        The cell's context, as for `run_batch`.
    batch : bytes
        The pickled ``(indices, items, budget)`` of this batch.
    token : str, optional
        The run's stop token.
    ahead : FirstAhead, optional
        A run's first direct batch: told when its first item ended, it may send that item
        ahead of the rest, which the result then leaves out (`direct.py`).
    deps : tuple
        The values of the handles the batch reads, for its `Slot`s.
    names : dict of str to int, optional
        Handles captured by name: the cell's global name -> the index of its value in `deps`.

    Returns
    -------
    bytes
        The cloudpickled result, as `run_batch` returns it.
    """
    idle = since_last(token)
    first = None if ahead is None else (lambda part: ahead.ran({**part, "ran_on": ran_on()}))
    result = run(context, batch, token, deps, names, first)
    if ahead is not None and "values" in result and ahead.close():
        result = without_first(result, pickle.loads(batch)[0][0], ahead.seconds)
    if idle is not None and "values" in result:
        result["idle"] = idle  # what a task's round costs this thread
    blob = dump_result(result)
    ended(token)
    return blob


def since_last(token: str | None) -> float | None:
    """Seconds since this thread ended its last batch of the run with `token` (None for its first).

    Parameters
    ----------
    token : str or None
        The run's stop token, which names the run; None: not known.

    Returns
    -------
    float or None
        The thread's idle time before this batch.
    """
    last: tuple[str | None, float] = getattr(_thread, "ended", (None, 0.0))
    return time.perf_counter() - last[1] if token is not None and last[0] == token else None


def ended(token: str | None) -> None:
    """This thread has just ended a batch of the run with `token`.

    Parameters
    ----------
    token : str or None
        The run's stop token.
    """
    _thread.ended = (token, time.perf_counter())


def run(context: tuple[str, bytes | None], batch: bytes, token: str | None, deps: tuple[Any, ...] = (),
        names: dict[str, int] | None = None, first: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """A batch's result, not yet pickled; as `run_batch` describes it.

    Parameters
    ----------
    context, batch, token, deps, names
        As for `run_blob`.
    first : callable, optional
        Told the first item's result as soon as it ended (`run_items`).

    Returns
    -------
    dict
        What `run_items` returns, with ``ran_on``: which worker ran the batch, for the
        kernel's journal; or, where no item could run, ``stopped``, ``lost`` or ``fatal``.
    """
    if stopped_run(token):  # queued before the stop: nothing to load or run
        return {"values": [], "errors": {}, "outputs": {}, "count": 0, "seconds": 0.0, "stopped": True}
    try:
        loaded = load(*context)
        large_values = tuple(fetch(key, size) for _, key, size in loaded.sharing.large)
    except Lost as e:
        return {"lost": e.key, "worker": (ran_on() or (None,))[0]}
    except BaseException as e:
        return {"fatal": error_record(e)}
    indices, items, budget = pickle.loads(batch)
    if deps:  # a `Slot` (an item, or one level inside a tuple item) stands for a handle's value

        def fill(v: Any) -> Any:
            return deps[v.k] if isinstance(v, Slot) else v

        items = [tuple(map(fill, item)) if type(item) is tuple else fill(item) for item in items]
    if names:  # handles captured by name: bound as the cell's globals, for this batch only
        loaded = copy.copy(loaded)
        loaded.namespace = {**loaded.namespace, **{n: deps[k] for n, k in names.items()}}
    install()
    result = run_items(loaded, indices, items, large_values, capture=True, token=token, budget=budget, first=first)
    result["ran_on"] = ran_on()
    return result


def push(blob: bytes) -> None:
    """Send `blob` to the kernel as the current task's event, if it is small enough.

    On the same ordered stream as the task-finished message that follows, so the kernel has
    it when it sees the task done, and needs no gather (`run/transport.py`); where it does not
    come, the result is gathered, so a push never loses a result.

    Parameters
    ----------
    blob : bytes
        The task's result blob, or a persisted item's report.
    """
    if len(blob) <= LARGEST_PUSH and (task := current_task()) is not None:
        task[0].log_event(PUSHED_TOPIC, Pushed(key=task[1], report=blob))


def current_task() -> tuple[Any, str] | None:
    """The Dask worker running this thread's task, and the task's key; None outside a task.

    Returns
    -------
    tuple of (distributed.Worker, str) or None
        None also where a test calls a task's function directly.
    """
    try:
        from distributed import get_worker

        dask_worker = get_worker()
    except ValueError:
        return None
    key = dask_worker.get_current_task()
    return None if key is None else (dask_worker, str(key))
