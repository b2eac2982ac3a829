"""Worker side (and the kernel's, for `--local`): running a batch's items, in chunks.

`run_items` never raises for an item: each item's exception becomes an error record
(`records.py`) with its own traceback, so one failing item loses nothing else. Each item
starts from the notebook's state: it gets its own copy of every captured value that it could
change, and shares the rest (`context.py`).

**One loop per chunk.** A batch runs in chunks, each one call that appends each item's value:

- a function over plain items (no seed, nothing it reads to copy per item):
  ``values.extend(map(fn, chunk))`` (`starmap` when an item unpacks into arguments);
- a cell that is one expression and captures nothing to copy: the cell compiled into a loop,
  ``for x in chunk: values.append(<expression>)`` (`context.cell_loop`), whose globals are
  the shared namespace;
- anything else (statements, values to copy per item, a seed, an unpacking target, keyword
  arguments, a trial): `_one_item`, which gives the item a fresh namespace, mapped over
  (item, index) pairs.

**Chunks.** The items run in chunks sized to take about `CHUNK_S`: the first chunk is one
item, each next one at most twice the last, from the time per item of the last chunk (and
never past the batch's time budget). A stop token, a cancelled task or a spent budget,
checked between chunks, so takes effect within a few ms, or one item for items slower
than that, while the bookkeeping costs nothing per item. The general path also checks the
stop token before each item: a cell that waited on something, then was stopped, starts no
further item.

**A failing item fails alone.** The values are appended in order to one list, so when the
chunk's call raises, the list's length is the failing item's position in the batch: it gets
its error record and a None, and the call is made again on the rest of the chunk (an
iterator, from which the failing item was taken). The resumption runs outside the `except`
block, so the next item's own exception carries no `__context__` from this one. The item
running is likewise the one at position ``len(values)``: `output.collect` files its prints
under its index.

`dump_result` pickles what a batch sends back, failing only the items whose values cannot
travel.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any

import cloudpickle

from nbcluster.worker import output, stopping, trial
from nbcluster.worker.ahead import first_of
from nbcluster.worker.context import Context, Copy, read_only_error
from nbcluster.worker.records import ErrorRecord, error_record

CHUNK_S = 0.002  # seconds a chunk aims at: how long a stop or a spent budget may wait


def run_items(
    context: Context,
    indices: Any,
    items: list[Any],
    large_values: tuple[Any, ...] = (),
    *,
    capture: bool,
    token: str | None = None,
    budget: float | None = None,
    first: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run items in this thread until done or stopped; never raises for an item's own failure.

    Stops early, between chunks of a few ms, when the run was told to stop (`token`), once
    `budget` seconds have gone by, or when Dask cancelled the task (checked every
    `stopping.CHECK_S`).

    Parameters
    ----------
    context : Context
        The run's context: the cell's code or function, its captured values, how an item
        binds names, the seed.
    indices : sequence of int
        The run's index of each of `items` (a list or a range), for seeds and output.
    items : list
        The items themselves, in order.
    large_values : tuple
        The values of ``context.large``, fetched on this worker, in that order: added to the
        names each item sees.
    capture : bool
        True keeps each item's output in the result (on a worker); False lets it go to the
        real streams (in the kernel, for ``--local``).
    token : str or None
        The run's stop token (`stopping.stopped`); None is never stopped.
    budget : float or None
        Seconds after which no further chunk is started (the batch's time budget); None runs
        them all.
    first : callable, optional
        Called once the first item ended, with that item's result (`ahead.first_of`),
        before the next item starts: a run's first direct batch may send
        it ahead of the rest (`ahead.py`).

    Returns
    -------
    dict
        ``values`` (one per item run, None where it failed), ``errors`` (position in the
        batch -> `ErrorRecord`), ``outputs`` (item index -> chunks, when captured),
        ``count`` (the items run, from the first), ``seconds`` (their time) and ``stopped``
        (True when some items were not reached).

    Raises
    ------
    KeyboardInterrupt
        Ctrl-C in the kernel during ``--local``: it stops the cell rather than fail one
        item.
    """
    base, copies = context.shared(large_values)
    run, todo = _plan(context, base, copies, indices, items, token)
    read_only = tuple(sorted(context.arrays))
    values: list[Any] = []  # appended in order: its length is the running item's position
    errors: dict[int, ErrorRecord] = {}
    outputs: dict[int, list[list[Any]]] = {}
    if capture:
        output.collect(outputs, values, indices)
    todo, n, size, stopped = iter(todo), len(items), 1, False
    started = checked = time.perf_counter()
    try:
        while len(values) < n and not stopped:
            if stopping.stopped(token):
                break
            before, begun = len(values), time.perf_counter()
            chunk = itertools.islice(todo, size)
            while True:
                try:
                    run(chunk, values)  # again after a failing item: on from the next one
                    break
                except KeyboardInterrupt:
                    raise  # Ctrl-C in the kernel (--local) stops the cell; workers never get one
                except _Stopped:
                    stopped = True
                    break
                except BaseException as e:  # SystemExit too: one item's sys.exit() fails that item
                    errors[len(values)] = error_record(read_only_error(e, read_only))
                    values.append(None)
            if stopped:
                break
            now = time.perf_counter()
            if first is not None:  # the first chunk is the first item alone
                first(first_of(values, errors, outputs, indices[0], now - started))
                first = None
            aim = CHUNK_S if budget is None else min(CHUNK_S, budget - (now - started))
            per_item = (now - begun) / (len(values) - before)
            size = max(1, min(2 * size, int(aim / per_item) if per_item > 0 else 2 * size))
            stopped = budget is not None and now - started >= budget
            if now - checked > stopping.CHECK_S:
                checked = now
                stopped = stopped or stopping.cancelled()
    finally:
        output.collect(None)
    seconds, count = time.perf_counter() - started, len(values)
    return {"values": values, "errors": errors, "outputs": outputs, "count": count, "seconds": seconds,
            "stopped": count < n}  # fmt: skip


def _plan(
    context: Context, base: dict[str, Any], copies: list[Copy], indices: Any, items: list[Any], token: str | None
) -> tuple[Callable[[Iterator[Any], list[Any]], None], Any]:
    """How the items run: ``run(chunk, values)``, which appends each item's value, and what the
    chunks are cut from."""
    c = context
    if c.seed is None and c.trial is None:  # else each item binds its own seed, or is a trial
        if c.kind == "function" and c.mode == "over" and c.fn_blob is None:
            fn, over = c.item_function(), itertools.starmap if c.unpacks else map
            return lambda chunk, values: values.extend(over(fn, chunk)), items
        if c.expression is not None and not copies:
            return FunctionType(c.expression, base), items

    def step(item: Any, index: int) -> Any:
        if stopping.stopped(token):  # beside a namespace per item this costs little: checked per item
            raise _Stopped
        if c.trial is not None:
            return trial.run_item(c.trial, index, token, lambda: _one_item(c, base, copies, item, index))
        return _one_item(c, base, copies, item, index)

    return lambda chunk, values: values.extend(itertools.starmap(step, chunk)), zip(items, indices, strict=True)


class _Stopped(Exception):
    """Raised by the general path's step, before its item, when the run was told to stop."""


def _one_item(context: Context, base: dict[str, Any], copies: list[Copy], item: Any, index: int) -> Any:
    """One item on the general path: a function called with its arguments, or a cell run in a
    namespace of its own."""
    c = context
    named = dict(zip(c.names, item, strict=True)) if c.mode in ("grid", "zip") else {}
    if c.seed is not None:
        named["seed"] = item_seed(c.seed, index)
    if c.kind == "function":
        args = (tuple(item) if c.unpacks else (item,)) if c.mode == "over" else ()
        return c.item_function()(*args, **named)
    ns = dict(base)
    for copy in copies:
        ns.update(copy())
    ns.update(named)
    if c.bind is not None:  # `TARGET = __nbcluster_item__`, which then deletes that name
        ns["__nbcluster_item__"] = item
        exec(c.bind, ns)
    elif c.mode == "over":
        ns[c.names[0]] = item
    if c.body is not None:  # None: the cell is one expression
        exec(c.body, ns)
    return eval(c.last, ns) if c.last is not None else None


def item_seed(seed: int, index: int) -> int:
    """A 32-bit seed from the cell's seed and the item's index (fits `np.random.seed`).

    The same on every worker and every Python (a hash of the text, not Python's `hash`), so
    an item draws the same numbers wherever and whenever it runs.

    Parameters
    ----------
    seed : int
        The cell's ``--seed``.
    index : int
        The item's index in the run.

    Returns
    -------
    int
        Between 0 and 2**32 - 1.

    Examples
    --------
    >>> item_seed(42, 0), item_seed(42, 1)
    (1042318869, 2349893302)
    """
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def dump_result(result: dict[str, Any]) -> bytes:
    """The batch's result as one blob; an item whose value cannot be pickled fails alone.

    Parameters
    ----------
    result : dict
        What `run_items` returned; changed in place where a value or an exception cannot be
        pickled.

    Returns
    -------
    bytes
        `result` cloudpickled. A value that cannot be pickled is replaced by None and its item fails with a `TypeError` saying why; an
        exception that cannot be pickled travels as its traceback only (``"exception"`` None).

    Examples
    --------
    >>> import threading
    >>> result = {"values": [1, threading.Lock()], "errors": {}, "outputs": {}, "count": 2,
    ...           "seconds": 0.1, "stopped": False}
    >>> back = cloudpickle.loads(dump_result(result))
    >>> back["values"]
    [1, None]
    >>> print(back["errors"][1]["message"])
    the item's result cannot be sent back to the kernel: TypeError: cannot pickle '_thread.lock' object
    """
    values = result.get("values", [])  # none in a batch that ran no item (`worker.run`)
    try:
        return cloudpickle.dumps(result)
    except Exception:
        pass
    # Some value cannot travel back: find which, and fail only those items.
    for j, value in enumerate(values):
        try:
            cloudpickle.dumps(value)
        except Exception as e:
            values[j] = None
            result["errors"][j] = error_record(
                TypeError(f"the item's result cannot be sent back to the kernel: {type(e).__name__}: {e}")
            )
    for record in result.get("errors", {}).values():
        try:
            cloudpickle.dumps(record)
        except Exception:
            record["exception"] = None
    return cloudpickle.dumps(result)
