"""What runs on a worker (and, for `--local`, in the kernel): one batch of items.

A Dask task is `run_batch((context_key, inline_context), batch, token)`, with no Dask
dependencies at all, so the scheduler treats every batch as a root task and hands them
out from its queue to whichever thread is free. Items are pickled by reference to the
three tasks here (`run_batch`, `stop_run`, `pin`): keep their names.
A run's first batches come as a request to the worker itself instead (`direct.py`), which
runs the same `run_blob` in the same thread pool, without the scheduler.

- `batch` is one opaque blob `(indices, items, budget)`: Dask never walks into it, so its
  cost does not grow with the items inside.
- The cell's *context* (code, small captured values, how an item binds names) is
  unpickled once per worker: `context.py`.
- *Large values* are kept outside Dask's store, in an LRU: `objects.py`. A key that no
  worker holds any more (every holder died) comes back as `{"lost": key}`; the kernel
  scatters it again and resubmits the batch.
- The items run in `items.py`; their prints and `display()`s are kept apart per item in
  `output.py`; an item's exception becomes a record in `records.py`; a batch's values that
  are all builtin data travel as one pickled list (`plain.py`). A cell that is one
  expression and a function runs in a loop kept per worker (`loop.py`).
- A `--persist` item's value stays on its worker under its own key (`held.py`).
- A trial item reports metrics, is asked to stop and may checkpoint (`trial.py`,
  `checkpoint.py`); a rank of a `--ranks` job runs with torchrun's environment (`rank.py`);
  `worker_local` keeps a value per worker process, on purpose (`local.py`).

A batch may carry a time *budget*: it returns, between items, once the budget is spent,
with the items it reached; the kernel sends the rest again. So a batch sized from a
misleading estimate still comes back on time (see `batching.py`).

The task returns one opaque blob: per-item values, error records, captured output, the
time spent in the items and how long the thread waited for the batch (for the batch
sizing in `batching.py`, `idle.py`). A small one is also pushed to the kernel ahead of the
task's end, which saves it a gather (`push.py`); a run's first direct batch sends its
first item's result ahead when the batch goes on (`ahead.py`). A batch never raises for an
item. Only a context that cannot even be loaded fails the whole batch, again as a returned
record (`{"fatal": record}`).

Stopping (`stopping.py`): a batch carries its run's *stop token*. `stop_run(token)`, sent
to every worker by the kernel on interrupt or `Results.cancel()`, makes a batch return
with the items it finished, `"stopped": True`: before its next item, or for a cell that is
one expression and a function, before its next chunk of a few ms (`loop.py`). So a cancel
keeps finished work, and a worker thread is free again one item later (Dask cannot stop a
running thread, and cancelling the task on the scheduler would throw the finished items
away). A batch whose Dask task was cancelled outright also stops, checked every 50 ms.

This package imports nothing from nbcluster but base modules (`errors`, `_compat`, `_wire`): a worker needs
cloudpickle and Dask, and loads no kernel-side module (`tests/test_worker_imports.py`).
"""

from __future__ import annotations

import pickle

import cloudpickle

from nbcluster.errors import Lost
from nbcluster.worker import output, stopping
from nbcluster.worker.ahead import FirstAhead, without_first
from nbcluster.worker.context import INLINE_CONTEXT, Context, load
from nbcluster.worker.idle import ended, since_last
from nbcluster.worker.items import dump_result, run_items
from nbcluster.worker.objects import address, fetch, pin, ran_on
from nbcluster.worker.push import push
from nbcluster.worker.records import ErrorRecord, error_record

__all__ = [
    "INLINE_CONTEXT",
    "Context",
    "ErrorRecord",
    "error_record",
    "pin",
    "run_batch",
    "run_blob",
    "run_items",
    "stop_run",
]


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
        item.

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


def run_blob(
    context: tuple[str, bytes | None], batch: bytes, token: str | None = None, ahead: FirstAhead | None = None
) -> bytes:
    """`run_batch` without the push: what a batch sent to the worker directly runs (`direct.py`).

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
        ahead of the rest, which the result then leaves out (`ahead.py`).

    Returns
    -------
    bytes
        The cloudpickled result, as `run_batch` returns it.
    """
    idle = since_last(token)
    if stopping.stopped(token):  # queued before the stop: nothing to load or run
        return cloudpickle.dumps(
            {"values": [], "errors": {}, "outputs": {}, "count": 0, "seconds": 0.0, "stopped": True}
        )
    try:
        loaded = load(*context)
        large_values = tuple(fetch(key, size) for _, key, size in loaded.large)
    except Lost as e:
        return cloudpickle.dumps({"lost": e.key, "worker": address()})
    except BaseException as e:
        return cloudpickle.dumps({"fatal": error_record(e)})
    indices, items, budget = pickle.loads(batch)
    output.install()
    first = None if ahead is None else (lambda part: ahead.ran({**part, "ran_on": ran_on()}))
    result = run_items(loaded, indices, items, large_values, capture=True, token=token, budget=budget, first=first)
    if ahead is not None and ahead.close():
        result = without_first(result, indices[0], ahead.seconds)
    result["ran_on"] = ran_on()  # for the kernel's journal: which worker ran the batch
    if idle is not None:
        result["idle"] = idle  # for the batch sizing: what a task's round costs this thread
    blob = dump_result(result)
    ended(token)
    return blob


def stop_run(token: str) -> None:
    """Make running and queued batches of the run with this stop token return early.

    Run on every worker with `client.run` (in its event loop).

    Parameters
    ----------
    token : str
        The stop token of the run to stop.
    """
    stopping.stop(token)
