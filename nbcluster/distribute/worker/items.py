"""Worker side (and the kernel's, for `--local`): running a batch's items one by one.

`run_items` never raises for an item: each item's exception becomes an error record
(`records.py`) with its own traceback, so one failing item loses nothing else. It stops
early, between items, when the run was told to stop, the Dask task was cancelled
(`stopping.py`), or the batch's time budget is spent (see `batching.py`). `dump_result`
pickles what a batch sends back, failing only the items whose values cannot travel.

Captured values are shared by the items a worker runs (as Dask shares a dependency between
tasks): treat them as read-only.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

import cloudpickle

from nbcluster.distribute.worker import loop, output, stopping
from nbcluster.distribute.worker.context import Context
from nbcluster.distribute.worker.records import ErrorRecord, error_record


def run_items(
    context: Context,
    indices: Any,
    items: list[Any],
    large_values: tuple[Any, ...] = (),
    *,
    capture: bool,
    token: str | None = None,
    budget: float | None = None,
) -> dict[str, Any]:
    """Run items in this thread until done or stopped; never raises for an item's own failure.

    Stops early, between items, when the run was told to stop (`token`), once `budget`
    seconds have gone by, or when Dask cancelled the task (checked every
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
        Seconds after which no further item is started (the batch's time budget); None runs
        them all.

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
    base = context.namespace
    if large_values:
        base = {**base, **{name: v for (name, _, _), v in zip(context.large, large_values, strict=True)}}
    errors: dict[int, ErrorRecord] = {}
    outputs: dict[int, list[list[Any]]] = {}
    if capture:
        output.collect(outputs)
    fast = _fast(context, base)
    started = time.perf_counter()
    try:
        if fast is not None:
            values: list[Any] = []  # appended in order: its length is the running item's position
            stopped = _run_chunks(fast, indices, items, values, errors, token, budget, started, capture)
            done = len(values)
        else:
            values = [None] * len(items)
            done, stopped = _run_each(context, base, indices, items, values, errors, token, budget, started)
            del values[done:]
    finally:
        output.collect(None)
    return {
        "values": values,
        "errors": errors,
        "outputs": outputs,
        "count": done,
        "seconds": time.perf_counter() - started,
        "stopped": stopped and done < len(items),
    }


def _run_each(
    context: Context,
    base: dict[str, Any],
    indices: Any,
    items: list[Any],
    values: list[Any],
    errors: dict[int, ErrorRecord],
    token: str | None,
    budget: float | None,
    started: float,
) -> tuple[int, bool]:
    """The general path: item by item, checking for a stop before each. Returns (items run,
    stopped)."""
    run_one = _runner(context, base)
    checked = started
    done = 0
    for j, item in enumerate(items):
        if stopping.stopped(token):
            return done, True
        index = indices[j]
        output.at(index)
        try:
            values[j] = run_one(item, index)
        except KeyboardInterrupt:
            raise  # Ctrl-C in the kernel (--local) stops the cell; workers never get one
        except BaseException as e:  # SystemExit too: one item's sys.exit() fails that item
            errors[j] = error_record(e)
        done = j + 1
        now = time.perf_counter()
        if budget is not None and now - started >= budget:
            return done, True
        if now - checked > stopping.CHECK_S:
            checked = now
            if stopping.cancelled():
                return done, True
    return done, False


def _fast(context: Context, base: dict[str, Any]) -> tuple[CodeType | None, dict[str, Any], Any] | None:
    """What `loop.run_chunk` needs for this context, or None when its items run one by one.

    (code, namespace, None) for a one-expression cell (its own copy of the namespace: the
    loop binds the item names in it); (None, {}, fn over a chunk) for a function.
    """
    if context.seed is not None:
        return None  # each item binds its own seed
    if context.kind == "function" and context.mode == "over" and context.fn is not None:
        over = itertools.starmap if context.unpacks else map
        return None, {}, functools.partial(over, context.fn)
    if context.kind == "cell" and context.loop is not None:
        return context.loop, dict(base), None
    return None


def _run_chunks(
    fast: tuple[CodeType | None, dict[str, Any], Any],
    indices: Any,
    items: list[Any],
    values: list[Any],
    errors: dict[int, ErrorRecord],
    token: str | None,
    budget: float | None,
    started: float,
    capture: bool,
) -> bool:
    """The fast path (`loop.py`): chunks of a few ms, checking for a stop between them.
    Returns whether it stopped before the end."""
    code, namespace, fn = fast
    clock = time.perf_counter
    timed = [0, 0.0]  # items and seconds of the chunks run so far, for the next chunk's size

    def per_item() -> float | None:
        return timed[1] / timed[0] if timed[0] else None

    def left() -> float | None:
        return None if budget is None else budget - (clock() - started)

    def failed(j: int, e: BaseException) -> None:
        errors[j] = error_record(e)

    if capture:
        output.follow(values, indices)
    checked = started
    for chunk in loop.chunks(items, loop.chunk_sizes(per_item, left)):
        if stopping.stopped(token):
            return True
        before, begun = len(values), clock()
        loop.run_chunk(code, namespace, fn, chunk, values, failed)
        now = clock()
        timed[0] += len(values) - before
        timed[1] += now - begun
        if budget is not None and now - started >= budget:
            return len(values) < len(items)
        if now - checked > stopping.CHECK_S:
            checked = now
            if stopping.cancelled():
                return len(values) < len(items)
    return False


def _runner(context: Context, base: dict[str, Any]) -> Callable[[Any, int], Any]:
    """What runs one item: `_run_one`, or for the commonest cell (one name, no seed) the same
    steps without looking up the context's fields again for every item (a fifth of a tiny
    item's time)."""
    if context.kind == "cell" and context.mode == "over" and context.bind is None and context.seed is None:
        name, body, last = context.names[0], context.body, context.last

        def run_cell(item: Any, index: int) -> Any:
            ns = dict(base)
            ns[name] = item
            if body is not None:
                exec(body, ns)
            return eval(last, ns) if last is not None else None

        return run_cell
    return functools.partial(_run_one, context, base)


def _run_one(context: Context, base: dict[str, Any], item: Any, index: int) -> Any:
    seed = None if context.seed is None else item_seed(context.seed, index)
    if context.kind == "function":
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        if context.mode == "over":
            args = tuple(item) if context.unpacks else (item,)
        elif context.mode in ("grid", "zip"):
            kwargs = dict(zip(context.names, item, strict=True))
        if seed is not None:
            kwargs["seed"] = seed
        assert context.fn is not None  # set for every "function" context
        return context.fn(*args, **kwargs)
    ns = dict(base)
    if context.mode == "over":
        if context.bind is not None:
            ns["__nbcluster_item__"] = item
            exec(context.bind, ns)
            del ns["__nbcluster_item__"]
        else:
            ns[context.names[0]] = item
    elif context.mode in ("grid", "zip"):
        ns.update(zip(context.names, item, strict=True))
    if seed is not None:
        ns["seed"] = seed
    if context.body is not None:  # None: the cell is one expression
        exec(context.body, ns)
    return eval(context.last, ns) if context.last is not None else None


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
        `result` cloudpickled. A value that cannot be pickled is replaced by None and its item
        fails with a `TypeError` saying why; an exception that cannot be pickled travels as
        its traceback only (``"exception"`` None).

    Examples
    --------
    >>> import threading, cloudpickle
    >>> result = {"values": [1, threading.Lock()], "errors": {}, "outputs": {}, "count": 2,
    ...           "seconds": 0.1, "stopped": False}
    >>> back = cloudpickle.loads(dump_result(result))
    >>> back["values"]
    [1, None]
    >>> print(back["errors"][1]["message"])
    the item's result cannot be sent back to the kernel: TypeError: cannot pickle '_thread.lock' object
    """
    try:
        return cloudpickle.dumps(result)
    except Exception:
        pass
    # Some value cannot travel back: find which, and fail only those items.
    values = result["values"]
    for j, value in enumerate(values):
        try:
            cloudpickle.dumps(value)
        except Exception as e:
            values[j] = None
            result["errors"][j] = error_record(
                TypeError(f"the item's result cannot be sent back to the kernel: {type(e).__name__}: {e}")
            )
    for record in result["errors"].values():
        try:
            cloudpickle.dumps(record)
        except Exception:
            record["exception"] = None
    return cloudpickle.dumps(result)
