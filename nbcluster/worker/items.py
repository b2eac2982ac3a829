"""Worker side (and the kernel's, for `--local`): running a batch's items, in chunks (`loop.py`).

`run_items` never raises for an item: each item's exception becomes an error record
(`records.py`) with its own traceback, so one failing item loses nothing else. It stops
early, between chunks of a few ms, when the run was told to stop, the Dask task was cancelled
(`stopping.py`), or the batch's time budget is spent (see `batching.py`). `dump_result`
pickles what a batch sends back, failing only the items whose values cannot travel.

Each item starts from the notebook's state: it gets its own copy of every captured value
that it could change, and shares the rest (`context.py`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from nbcluster.worker import loop, output, stopping, trial
from nbcluster.worker.ahead import first_of
from nbcluster.worker.context import Context, Copy, item_namespace, read_only_error
from nbcluster.worker.plain import plain
from nbcluster.worker.records import ErrorRecord, error_record


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

    Stops early, between chunks of a few ms (`loop.py`), when the run was told to stop
    (`token`), once `budget` seconds have gone by, or when Dask cancelled the task (checked
    every `stopping.CHECK_S`).

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
    errors: dict[int, ErrorRecord] = {}
    outputs: dict[int, list[list[Any]]] = {}
    if capture:
        output.collect(outputs)
    cell_loop, over, todo = _plan(context, base, copies, indices, items, token)
    values: list[Any] = []  # appended in order: its length is the running item's position
    started = time.perf_counter()
    ended_first = None
    if first is not None:
        tell = first
        ended_first = lambda: tell(first_of(values, errors, outputs, indices[0], time.perf_counter() - started))  # noqa: E731
    try:
        stopped = _run_chunks(cell_loop, over, todo, len(items), indices, values, errors, token, budget,
                              started, capture, ended_first, tuple(sorted(context.arrays)))  # fmt: skip
    finally:
        output.collect(None)
    done = len(values)
    return {
        "values": values,
        "errors": errors,
        "outputs": outputs,
        "count": done,
        "seconds": time.perf_counter() - started,
        "stopped": stopped and done < len(items),
    }


def _plan(
    context: Context, base: dict[str, Any], copies: list[Copy], indices: Any, items: list[Any], token: str | None
) -> tuple[loop.Loop | None, Any, Iterable[Any]]:
    """How `loop.run_chunk` runs this context's items: (the cell's loop, over, what to iterate).

    A one-expression cell whose captured values are all shared: its loop (`Context.loop`),
    reading the names of `base`. A function over plain items that reads nothing to copy:
    `map` (or `starmap`) of the function. Anything else (statements, values to copy per
    item, a seed, an unpacking target, keyword arguments): `_runner`'s one-item step over
    (item, index) pairs, which also checks for a stop before each item.
    """
    if context.seed is None and context.trial is None:  # else each item binds its own seed, or is a trial
        if context.kind == "function" and context.mode == "over" and context.fn_blob is None:
            over = itertools.starmap if context.unpacks else map
            return None, functools.partial(over, context.item_function()), items
        if context.kind == "cell" and context.loop is not None and not copies:
            return loop.loop_function(context.loop, base), None, items
    step = _runner(context, base, copies, token)
    return None, functools.partial(itertools.starmap, step), zip(items, indices, strict=True)


def _run_chunks(
    cell_loop: loop.Loop | None,
    over: Any,
    todo: Iterable[Any],
    n: int,
    indices: Any,
    values: list[Any],
    errors: dict[int, ErrorRecord],
    token: str | None,
    budget: float | None,
    started: float,
    capture: bool,
    ended_first: Callable[[], None] | None = None,
    read_only: tuple[str, ...] = (),
) -> bool:
    """Run the `n` items of `todo` in chunks of a few ms (`loop.py`), checking for a stop
    between them. Returns whether it stopped before the end. `ended_first` is called after
    the first chunk, which is the first item alone."""
    clock = time.perf_counter
    timed = [0, 0.0]  # items and seconds of the chunks run so far, for the next chunk's size

    def per_item() -> float | None:
        return timed[1] / timed[0] if timed[0] else None

    def left() -> float | None:
        return None if budget is None else budget - (clock() - started)

    def failed(j: int, e: BaseException) -> None:
        errors[j] = error_record(read_only_error(e, read_only))

    if capture:
        output.follow(values, indices)
    checked = started
    for chunk in loop.chunks(todo, n, loop.chunk_sizes(per_item, left)):
        if stopping.stopped(token):
            return True
        before, begun = len(values), clock()
        step_stopped = loop.run_chunk(cell_loop, over, chunk, values, failed)
        now = clock()
        timed[0] += len(values) - before
        timed[1] += now - begun
        if ended_first is not None and values:
            ended_first()
            ended_first = None
        if step_stopped:
            return True
        if budget is not None and now - started >= budget:
            return len(values) < n
        if now - checked > stopping.CHECK_S:
            checked = now
            if stopping.cancelled():
                return len(values) < n
    return False


def _runner(context: Context, base: dict[str, Any], copies: list[Copy], token: str | None) -> Callable[[Any, int], Any]:
    """What runs one item on the general path, raising `loop.Stopped` first when the run was
    told to stop: `_run_one`, or for the commonest cell (one name, no seed) the same steps
    without looking up the context's fields again for every item (a fifth of its time)."""
    told = stopping.told()
    if context.trial is not None:  # each item a trial of its own (`trial.py`)
        spec = context.trial

        def run_trial(item: Any, index: int) -> Any:
            if token in told:
                raise loop.Stopped
            return trial.run_item(spec, index, token, lambda: _run_one(context, base, copies, item, index))

        return run_trial
    if context.kind == "cell" and context.mode == "over" and context.bind is None and context.seed is None:
        name, body, last = context.names[0], context.body, context.last

        def run_cell(item: Any, index: int) -> Any:
            if token in told:
                raise loop.Stopped
            ns = item_namespace(base, copies) if copies else dict(base)
            ns[name] = item
            if body is not None:
                exec(body, ns)
            return eval(last, ns) if last is not None else None

        return run_cell

    def run_one(item: Any, index: int) -> Any:
        if token in told:
            raise loop.Stopped
        return _run_one(context, base, copies, item, index)

    return run_one


def _run_one(context: Context, base: dict[str, Any], copies: list[Copy], item: Any, index: int) -> Any:
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
        return context.item_function()(*args, **kwargs)
    ns = item_namespace(base, copies)
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
        `result` cloudpickled, its ``"values"`` pickled as one blob when they are all builtin
        data (`plain.py`: the kernel keeps that blob until they are read). A value that cannot
        be pickled is replaced by None and its item fails with a `TypeError` saying why; an
        exception that cannot be pickled travels as its traceback only (``"exception"`` None).

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
    >>> packed = cloudpickle.loads(dump_result({**result, "values": [1, 2]}))["values"]
    >>> type(packed).__name__, cloudpickle.loads(packed)  # builtin data: one blob, for the kernel to keep
    ('bytes', [1, 2])
    """
    values = result["values"]
    packed = plain(values) if values else None
    try:
        return cloudpickle.dumps(result if packed is None else {**result, "values": packed})
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
    for record in result["errors"].values():
        try:
            cloudpickle.dumps(record)
        except Exception:
            record["exception"] = None
    return cloudpickle.dumps(result)
