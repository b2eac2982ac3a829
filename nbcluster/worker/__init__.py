"""What runs on a worker (and, for `--local`, in the kernel): one batch of items.

What is where: this module runs a batch, from the Dask task to the result blob: its items,
in chunks (`run_items`), their prints and `display()`s (`install`) and the blob's pickling
(`dump_result`), and the request that runs a batch without the scheduler (`serve`, below).
Beside it, each with one purpose: `context.py`, the cell's context loaded once per worker,
the large values it reads and the runs told to stop; `held.py`, `--persist`. The other strategies' items: `trial.py` and `checkpoint.py`
(`--trials`), `rank.py` (`--ranks`) with `process_groups.py` (its torch groups kept until its
item returns); `local.py` keeps a value per worker process, on purpose.

**The task.** A Dask task is `run_batch((context_key, inline_context), batch, token)`, with
no Dask dependencies at all, so the scheduler treats every batch as a root task and hands
them out from its queue to whichever thread is free. The kernel sends three functions of
this package, pickled by reference (`run_batch`; `context.stop_run` and `context.pin`):
keep their names. A run's first batches come as a request to the worker itself instead
("Direct batches", below), which runs the same `run_batch` in the same thread pool, without
the scheduler, and sends its first item's result ahead when the batch goes on. One batch's path:
`run_batch` -> `run` -> `context.load`/`fetch` -> `run_items` -> `dump_result`.

- `batch` is one opaque blob `(indices, items, budget)`: Dask never walks into it, so its
  cost does not grow with the items inside.
- A key of a large value that no worker holds any more (every holder died) comes back as
  `{"lost": key}`; the kernel scatters it again and resubmits the batch.
- The task returns one opaque blob: per-item values, error records, captured output, the
  time spent in the items and how long the thread waited for the batch since its last one
  of the run (`idle`, for the batch sizing in `run/policy.py`; measured with the thread's
  own clock). A small blob is also pushed to the kernel as a Dask event just before the
  task ends (`push`), which saves the kernel a gather. A batch never raises for an item:
  each item's exception becomes an error record with its own traceback, so one failing
  item loses nothing else. Only a context that cannot even be loaded fails the whole
  batch, again as a returned record (`{"fatal": record}`).

**Each item starts from the notebook's state**: it gets its own copy of every captured
value that it could change, and shares the rest (`context.py`).

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
never past the batch's time *budget*: a batch sized from a misleading estimate returns on
time, with the items it reached, and the kernel sends the rest again).

**A failing item fails alone.** The values are appended in order to one list, so when the
chunk's call raises, the list's length is the failing item's position in the batch: it gets
its error record and a None, and the call is made again on the rest of the chunk (an
iterator, from which the failing item was taken). The resumption runs outside the `except`
block, so the next item's own exception carries no `__context__` from this one. An item's
`StopIteration` does not raise out of ``map`` (it ends it, as the end of the items would): a
call that ran fewer items than its chunk holds, and was not stopped, fails the item it ended
at with `SWALLOWED` (naming the fix), and goes on with the rest.

**Stopping.** A batch carries its run's *stop token*. `stop_run(token)`, sent to every
worker by the kernel on interrupt or `Results.cancel()`, makes the run's batches return with
the items they finished, `"stopped": True`, before their next chunk (a few ms, or one item;
the general path also checks before each item, so a cell that waited on something, then
was stopped, starts no further item). So a cancel keeps finished work, and a worker thread
is free again one item later (Dask cannot stop a running thread, and cancelling the task on
the scheduler would throw the finished items away). A batch whose Dask task was cancelled
outright also stops, checked every `CHECK_S`.

**Direct batches.** A batch that goes through Dask crosses the scheduler twice (kernel to
scheduler to worker, and the result's way back): 4 to 5 ms here for a task that does
nothing, against 0.3 to 0.5 ms for a request the kernel sends a worker over the same TLS
connection pool. So a run's short batches, the first ones of every run (`engine.py`, "Direct
batches"), go straight to a worker: the request ``nbcluster_run_batch`` (`HANDLER`) runs the
batch in the worker's own thread pool, the one its Dask tasks run in (so it never runs more
at once than the worker has threads: a direct batch queues behind a running task, as a task
would), and answers with the result blob `run_batch` would have returned.

The handler is not part of Dask: `serve`, run once per worker through Dask's own ``run``
request (`Client.run`'s, which every worker serves), adds it. A worker that cannot import
nbcluster answers that request with its error, and the kernel sends that worker's batches
through the scheduler, where they fail with one line (`run/transport.py`, `task`).

What a direct batch does not do, and why that is safe:
- The scheduler does not see it as a task. The run's live view still draws it: the worker
  reports each one as a Dask event (`_wire.DIRECT_TOPIC`), which nbcluster's metrics plugin
  records as a task of the run, and Dask's call stacks show it while it runs
  (`_compat.as_worker`). Dask's own dashboard does not, which is why only a run's first
  seconds go direct.
- A worker that is not running (paused past its memory limit, closing) refuses it
  (``{"refused": why}``), and the kernel sends the batch through the scheduler instead,
  which holds it until the worker can take it.
- A worker that dies under it breaks the request; the kernel sends its items again through
  the scheduler, once, as Dask would have.

**The first item goes ahead.** A run's first result should arrive one item's time after its
start, whatever the other items do (an item that blocks, or takes an hour, right behind the
first). So a run's first direct batch says ``first``: the handler then takes the request's
connection (Dask passes it to a handler whose first argument is ``comm``). A batch that ends
within `AHEAD_S` of its arrival answers once, as any batch: every small cell does. Its first
item runs alone (`run`), then the rest: when the batch is still going `AHEAD_S` after its
arrival, and its first item has finished (or when that item finishes later), the worker
writes the first item's result on that connection, ahead of the answer (``{"first":
blob}``), and leaves that item out of the answer (else the two results are `joined`). The
kernel reads both on that one connection, so the first always arrives before the rest
(`run/transport.py`). No item is sent twice or left out: whether the first went ahead is
decided once, by whichever of the two comes first, the batch's end (in its thread) or the
deadline (in the event loop). A first item that went ahead and a worker that then dies: the
kernel delivered the first, and sends the rest again, as it would for any broken batch.

In the order sent. The kernel sends a worker's direct batches as concurrent requests, each
over a connection of its pool, and two of them can reach the worker in either order (the
second's connection may be the one already open). Run out of order, an item could wait
behind a later one: a slow or blocked item 3 holding the worker's one thread while item 1,
sent first, waits. So each request carries its sender (one start of one run) and its number
among that sender's batches to this worker, and `Order` starts them in that order. A batch
whose predecessor has not come within `GAP_S` starts anyway: order is worth a wait that
short, never a hang on a request that broke on its way.

**Output.** `sys.stdout`/`sys.stderr` are wrapped once per process (`install`) by a stream
that sends writes to the running item's buffer when the writing thread runs items, and to
the real stream otherwise: with several threads per worker, each item sees only its own
prints. The item running is the one at position ``len(values)``, so its prints are filed
under its index at no cost per item. `outputs` maps item index -> chunks `[stream, text]`
(or `["display", mimebundle]`).

**Error records.** An item's exception becomes a record the kernel can show and re-raise
(`error_record`). The traceback is the standard library's `traceback.TracebackException`,
which walks the chain (`raise ... from`, an exception raised while handling another),
`ExceptionGroup` members and `__notes__`, and guards against cycles. Made wire-safe here, once:

- nbcluster's own frames (the batch runner's `exec`) are dropped from every part;
- source lines are not read here: the kernel reads them (`lookup_lines=False`), from the
  notebook's cells and functions, which a worker does not have;
- exception classes do not travel (a class the kernel cannot import would make the whole
  record unloadable): each part's class goes by name in `types`, in `parts()` order, and
  the kernel puts a stand-in class of that name back (`run/tracebacks.py`); notes travel as
  strings.

The exception object itself travels pickled, where it can be rebuilt, so the kernel can
raise the item's own exception (`tracebacks.reraise`).

This package imports nothing from nbcluster but base modules (`errors`, `_compat`, `_wire`):
a worker needs cloudpickle and Dask, and loads no kernel-side module
(`tests/test_worker_imports.py`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import functools
import hashlib
import io
import itertools
import os
import pickle
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any, NamedTuple, TextIO, TypedDict

import cloudpickle

from nbcluster._wire import DIRECT_TOPIC, MEMORY_TRIM_PLUGIN, PUSHED_TOPIC, DirectRecord, Pushed
from nbcluster.errors import Lost
from nbcluster.worker import trial
from nbcluster.worker.context import Context, Copy, fetch, load, ran_on, read_only_error, running, stopped_run

__all__ = ["HANDLER", "VERSION", "Context", "ErrorRecord", "FirstAhead", "Order", "Slot", "display", "dump_result",
           "error_record", "install", "parts", "push", "refusal", "run_batch", "run_items", "serve"]  # fmt: skip

#: Blobs larger than this (bytes) are not pushed, only gathered: the scheduler keeps a topic's
#: last events (`distributed.admin.low-level-log-length`), and these must stay small there.
LARGEST_PUSH = 8_192
CHUNK_S = 0.002  # seconds a chunk aims at: how long a stop or a spent budget may wait
CHECK_S = 0.05  # how often a running batch asks whether its Dask task was cancelled
LIMIT = 64 * 1024  # output characters kept per item and stream
CUT = "\n... (output truncated)\n"
#: The request a worker serves once `serve` ran there.
HANDLER = "nbcluster_run_batch"
#: Bumped when the request's arguments or answer change: a kernel only sends batches to a
#: worker that serves the same version.
VERSION = 3
GAP_S = 0.5  # how long a direct batch waits for the one its sender sent this worker before it
KEPT_STARTS = 256  # batch starts a worker keeps for `Order` (the oldest are forgotten)
#: The error of an item whose StopIteration escaped it: `map` took it for the end of the items.
SWALLOWED = ("the item raised StopIteration, which ends a loop over the items rather than failing one: catch it in the "
             "item's code (next(it, None) returns None at the end), or raise another exception")  # fmt: skip
AHEAD_S = 0.005  # a first batch still running this long after its arrival sends its first item ahead


class Slot(NamedTuple):
    """Stands for the `k`-th dependency of a task (`held.py`), in a batch's items or captured names."""

    k: int


def run_batch(context: tuple[str, bytes | None], batch: bytes, token: str | None = None, deps: tuple[Any, ...] = (),
              names: dict[str, int] | None = None, ahead: FirstAhead | None = None) -> bytes:  # fmt: skip
    """The Dask task, and a direct batch's run: run a batch of items, return the opaque result blob.

    The result says how long this thread waited since it ended its last batch of the same
    run (``idle``, for the batch sizing in `run/policy.py`; none for the thread's first).
    A small blob is also pushed to the kernel as the task's event (`push`; nothing is sent
    for a direct batch, which is no task).

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
    deps : tuple
        The values of the handles the batch reads, for its `Slot`s (`held.py`).
    names : dict of str to int, optional
        Handles captured by name: the cell's global name -> the index of its value in `deps`.
    ahead : FirstAhead, optional
        A run's first direct batch: its first item runs alone, and may go ahead of the rest,
        which the result then leaves out (`FirstAhead`).

    Returns
    -------
    bytes
        The cloudpickled result: per-item values, error records, output, the count and time of
        the items run, and ``"stopped"`` when stopped early; or ``{"lost": key, "worker": ...}``
        when a large value is held by no worker any more, or ``{"fatal": record}`` when the
        context cannot be loaded. It never raises for an item.
    """
    last, ended = running.ended
    idle = time.perf_counter() - ended if token is not None and last == token else None
    result = run(context, batch, token, deps, names, ahead)
    if idle is not None and "values" in result:
        result["idle"] = idle  # what a task's round costs this thread
    blob = dump_result(result)
    running.ended = (token, time.perf_counter())
    push(blob)
    return blob


def run(context: tuple[str, bytes | None], batch: bytes, token: str | None, deps: tuple[Any, ...] = (),
        names: dict[str, int] | None = None, ahead: FirstAhead | None = None) -> dict[str, Any]:  # fmt: skip
    """A batch's result, not yet pickled; as `run_batch` describes it (`held.py` and `rank.py`
    pickle and push their own).

    Parameters
    ----------
    context, batch, token, deps, names, ahead
        As for `run_batch`.

    Returns
    -------
    dict
        What `run_items` returns; or, where no item could run, ``stopped``, ``lost`` or
        ``fatal``.
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
    go = functools.partial(run_items, loaded, large_values=large_values, capture=True, token=token)
    if ahead is None or len(items) < 2:
        return go(indices, items, budget=budget)
    first = go(indices[:1], items[:1], budget=budget)  # the first item alone, which may go ahead (`FirstAhead`)
    if first["count"]:  # else stopped before it: the rest is too
        ahead.ran({"first": dump_result(first)})
    rest = go(indices[1:], items[1:], budget=None if budget is None else budget - first["seconds"])
    return rest if ahead.close() else joined(first, rest)


def push(blob: bytes) -> None:
    """Send `blob` to the kernel as the current task's event, if it is small enough.

    On the same ordered stream as the task-finished message that follows, so the kernel has
    it when it sees the task done, and needs no gather (`run/transport.py`); where it does not
    come, the result is gathered, so a push never loses a result. Outside a Dask task (a
    direct batch, `--local`, a test calling a task's function) nothing is sent.

    Parameters
    ----------
    blob : bytes
        The task's result blob, or a persisted item's report.
    """
    from nbcluster._compat import running_task_key

    if len(blob) <= LARGEST_PUSH and (key := running_task_key()) is not None:
        from distributed import get_worker

        get_worker().log_event(PUSHED_TOPIC, Pushed(key=str(key), report=blob))


# -- the items --------------------------------------------------------------------------------
def run_items(context: Context, indices: Any, items: list[Any], large_values: tuple[Any, ...] = (), *, capture: bool,
              token: str | None = None, budget: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Run items in this thread until done or stopped; never raises for an item's own failure.

    Stops early, between chunks of a few ms, when the run was told to stop (`token`), once
    `budget` seconds have gone by, or when Dask cancelled the task.

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
        The run's stop token (`stop_run`); None is never stopped.
    budget : float or None
        Seconds after which no further chunk is started (none at all when it is not above 0);
        None runs them all.

    Returns
    -------
    dict
        ``values`` (one per item run, None where it failed), ``errors`` (position in the
        batch -> `ErrorRecord`), ``outputs`` (item index -> chunks, when captured),
        ``count`` (the items run, from the first), ``seconds`` (their time), ``stopped``
        (True when some items were not reached) and ``ran_on`` (the worker that ran them, for
        the kernel's journal: `context.ran_on`).

    Raises
    ------
    KeyboardInterrupt
        Ctrl-C in the kernel during ``--local``: it stops the cell rather than fail one item.
    """
    run, todo = _plan(context, *context.shared(large_values), indices, items, token)
    values: list[Any] = []  # appended in order: its length is the running item's position
    errors: dict[int, ErrorRecord] = {}
    outputs: dict[int, list[list[Any]]] = {}  # item index -> chunks
    if capture:
        running.outputs, running.follow = outputs, (values, indices)
    todo, n, size, stopped = iter(todo), len(items), 1, budget is not None and budget <= 0
    started = checked = time.perf_counter()
    try:
        while len(values) < n and not stopped and not stopped_run(token):
            before, begun = len(values), time.perf_counter()
            chunk, end = itertools.islice(todo, size), min(n, before + size)
            while True:
                try:
                    run(chunk, values)  # again after a failing item: on from the next one
                    if len(values) < end and not stopped_run(token):  # `map` ended the chunk at the item
                        raise RuntimeError(SWALLOWED)
                    break
                except KeyboardInterrupt:
                    raise  # Ctrl-C in the kernel (--local) stops the cell; workers never get one
                except BaseException as e:  # SystemExit too: one item's sys.exit() fails that item
                    shared = context.sharing  # read-only: a write to one names it
                    errors[len(values)] = error_record(read_only_error(e, tuple(sorted(shared.arrays)), tuple(sorted(shared.holders))))
                    values.append(None)
            if len(values) == before:  # told to stop before the chunk's first item
                break
            now = time.perf_counter()
            aim = CHUNK_S if budget is None else min(CHUNK_S, budget - (now - started))
            per_item = (now - begun) / (len(values) - before)
            size = max(1, min(2 * size, int(aim / per_item) if per_item > 0 else 2 * size))
            stopped = budget is not None and now - started >= budget
            if now - checked > CHECK_S:  # a Dask task cancelled outright stops too
                from nbcluster._compat import running_task_key, worker_task

                checked = now
                if (key := running_task_key()) is not None:  # None outside a task: --local, a direct batch
                    state = getattr(worker_task(key), "state", "forgotten")  # no record of it: forgotten
                    stopped = stopped or state in ("cancelled", "released", "forgotten")
    finally:
        running.outputs = None
    seconds, count = time.perf_counter() - started, len(values)
    return {"values": values, "errors": errors, "outputs": outputs, "count": count, "seconds": seconds,
            "stopped": count < n, "ran_on": ran_on()}  # fmt: skip


def _plan(c: Context, base: dict[str, Any], copies: list[Copy], indices: Any, items: list[Any],
          token: str | None) -> tuple[Callable[[Iterator[Any], list[Any]], None], Any]:  # fmt: skip
    """How the items run: ``run(chunk, values)``, which appends each item's value, and what the
    chunks are cut from."""
    if c.seed is None and c.trial is None:  # else each item binds its own seed, or is a trial
        if c.kind == "function" and c.mode == "over" and c.code.fn_copy is None:
            fn, over = c.item_function(), itertools.starmap if c.unpacks else map
            return lambda chunk, values: values.extend(over(fn, chunk)), items
        if c.code.expression is not None and not copies:
            return FunctionType(c.code.expression, base), items

    def step(item: Any, index: int) -> Any:
        if c.trial is not None:
            return trial.run_item(c.trial, index, token, lambda: _one_item(c, base, copies, item, index))
        return _one_item(c, base, copies, item, index)

    def run(chunk: Iterator[Any], values: list[Any]) -> None:  # checked per item: a stopped run starts no further one
        values.extend(itertools.starmap(step, itertools.takewhile(lambda _: not stopped_run(token), chunk)))

    return run, zip(items, indices, strict=True)


def _one_item(c: Context, base: dict[str, Any], copies: list[Copy], item: Any, index: int) -> Any:
    """One item on the general path: a function called with its arguments, or a cell run in a
    namespace of its own."""
    named = dict(zip(c.names, item, strict=True)) if c.mode in ("grid", "zip") else {}
    if c.seed is not None:
        named["seed"] = item_seed(c.seed, index)
    if c.kind == "function":
        args = (tuple(item) if c.unpacks else (item,)) if c.mode == "over" else ()
        return c.item_function()(*args, **named)
    ns = dict(base)
    for fresh in copies:
        ns.update(fresh())
    ns.update(named)
    if c.code.bind is not None:  # `TARGET = __nbcluster_item__`, which then deletes that name
        ns["__nbcluster_item__"] = item
        exec(c.code.bind, ns)
    elif c.mode == "over":
        ns[c.names[0]] = item
    if c.code.body is not None:  # None: the cell is one expression
        exec(c.code.body, ns)
    return eval(c.code.last, ns) if c.code.last is not None else None


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
    return int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest(), "little")


def joined(first: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """One batch's result from its first item's and the rest's (`run_items` results, in order).

    Parameters
    ----------
    first : dict
        The result of the batch's first item, run alone.
    rest : dict
        The result of the items after it.

    Returns
    -------
    dict
        The result of the whole batch: the positions in ``errors`` of the rest moved on by
        the first's count.

    Examples
    --------
    >>> first = {"values": [5], "errors": {}, "outputs": {0: ["a"]}, "count": 1, "seconds": 0.1, "stopped": False}
    >>> rest = {"values": [6, 7], "errors": {1: "e"}, "outputs": {2: ["b"]}, "count": 2, "seconds": 0.2,
    ...         "stopped": False}
    >>> out = joined(first, rest)
    >>> out["values"], out["errors"], out["outputs"], out["count"], round(out["seconds"], 3)
    ([5, 6, 7], {2: 'e'}, {0: ['a'], 2: ['b']}, 3, 0.3)
    """
    return {**rest, "values": first["values"] + rest["values"], "outputs": {**first["outputs"], **rest["outputs"]},
            "errors": {**first["errors"], **{j + first["count"]: record for j, record in rest["errors"].items()}},
            "count": first["count"] + rest["count"], "seconds": first["seconds"] + rest["seconds"],
            "stopped": first["stopped"] or rest["stopped"]}  # fmt: skip


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
        fails with a `TypeError` saying why (an exception that cannot be pickled travels as
        its traceback only: `error_record`).

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
    with contextlib.suppress(Exception):
        return cloudpickle.dumps(result)
    values = result.get("values", [])  # none in a batch that ran no item
    for j, value in enumerate(values):
        try:
            cloudpickle.dumps(value)
        except Exception as e:
            values[j] = None
            why = f"the item's result cannot be sent back to the kernel: {type(e).__name__}: {e}"
            result["errors"][j] = error_record(TypeError(why))
    return cloudpickle.dumps(result)


# -- error records -------------------------------------------------------------------------
_PACKAGE = os.path.dirname(os.path.dirname(os.path.normcase(os.path.abspath(__file__))))


class TypeName(TypedDict):
    """An exception class by name: as Python prints it (`module.Qualname`, bare for builtins)."""

    module: str
    qualname: str
    syntax: bool  # a SyntaxError: printed with its file, line and caret


class ErrorRecord(TypedDict):
    """One failed item, as it crosses from worker to kernel (inside a batch's result blob)."""

    type: str  # "ZeroDivisionError", "mymodule.MyError"
    message: str
    traceback: traceback.TracebackException  # classes removed: see `types`
    types: list[TypeName]  # the class of each part of `traceback`, in `parts()` order
    exception: bytes | None  # the exception, cloudpickled, if it could be rebuilt


def error_record(e: BaseException, *, frames: bool = True) -> ErrorRecord:
    """Everything the kernel needs to show and re-raise `e`, nbcluster's frames gone.

    Parameters
    ----------
    e : BaseException
        The exception an item raised (or one the kernel made for it).
    frames : bool
        False drops every frame: for failures the kernel makes itself (a worker that died, a
        batch Dask refused), whose frames are nbcluster's or Dask's, nothing the user can act
        on.

    Returns
    -------
    ErrorRecord
        Safe to pickle and to load in a kernel that cannot import the exception's class:
        the traceback with its classes replaced by names, and the exception itself
        cloudpickled, or None where it cannot be rebuilt.

    Examples
    --------
    >>> try:
    ...     1 / 0
    ... except ZeroDivisionError as e:
    ...     record = error_record(e)
    >>> record["type"], record["message"]
    ('ZeroDivisionError', 'division by zero')
    >>> record["types"]
    [{'module': 'builtins', 'qualname': 'ZeroDivisionError', 'syntax': False}]
    """
    tb = traceback.TracebackException.from_exception(e, lookup_lines=False)
    types: list[TypeName] = []
    for part in parts(tb):
        cls = part.exc_type  # always a class: each part is an exception that was raised
        types.append({"module": cls.__module__, "qualname": cls.__qualname__, "syntax": issubclass(cls, SyntaxError)})
        part.exc_type = BaseException  # a builtin stand-in; the class travels by name in `types`
        part.stack = traceback.StackSummary.from_list([f for f in part.stack if frames and not _internal(f.filename)])
        notes = getattr(part, "__notes__", None)
        if notes is not None:  # strings only, so the record loads anywhere
            # vars(): Python 3.10's TracebackException has no `__notes__` to type-check against.
            vars(part)["__notes__"] = [str(n) for n in (notes if isinstance(notes, list | tuple) else [notes])]
    exception: bytes | None
    try:
        exception = cloudpickle.dumps(e)
        cloudpickle.loads(exception)  # an exception that cannot be rebuilt is useless later
    except Exception:
        exception = None
    module, qualname = types[0]["module"], types[0]["qualname"]  # as Python prints it: bare for builtins, __main__
    name = qualname if module in ("builtins", "__main__") else f"{module}.{qualname}"
    return {"type": name, "message": str(tb), "traceback": tb, "types": types, "exception": exception}


def parts(tb: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """`tb` and every exception it holds: causes, contexts, exception group members.

    Parameters
    ----------
    tb : traceback.TracebackException
        The outermost exception.

    Yields
    ------
    traceback.TracebackException
        `tb` first, then depth first what it links to, each link's cause before its context
        and group members after both: the order of `ErrorRecord`'s ``types``.
    """
    todo = [tb]
    while todo:
        part = todo.pop()
        yield part
        # `exceptions` (group members) exists from Python 3.11.
        linked = [part.__cause__, part.__context__, *(getattr(part, "exceptions", None) or ())]
        todo.extend(reversed([p for p in linked if p is not None]))


def _internal(filename: str) -> bool:
    # "<...>": a cell's code ("<distribute-...>"), or one compiled by the user
    return not filename.startswith("<") and os.path.normcase(os.path.abspath(filename)).startswith(_PACKAGE)


# -- output --------------------------------------------------------------------------------
def _chunks(outputs: dict[int, list[list[Any]]]) -> list[list[Any]]:
    """The running item's output chunks in `outputs`, this thread's."""
    values, indices = running.follow
    return outputs.setdefault(int(indices[len(values)]), [])


class _ItemStream(io.TextIOBase):
    """Writes go to the running item's buffer in this thread, else to the real stream (never a tty)."""

    def __init__(self, name: str, real: TextIO):
        self.name_, self.real = name, real

    def write(self, text: str) -> int:
        if (outputs := running.outputs) is None:
            return self.real.write(text)
        chunks = _chunks(outputs)
        if not chunks or chunks[-1][0] != self.name_:
            chunks.append([self.name_, ""])
        if len(chunks[-1][1]) <= LIMIT:  # a longer one was cut already: it takes no more
            full = chunks[-1][1] + text  # cut, and say so, whether one write or many got here
            chunks[-1][1] = full if len(full) <= LIMIT else full[:LIMIT] + CUT
        return len(text)

    def flush(self) -> None:
        if running.outputs is None:
            self.real.flush()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # TextIOBase declares a plain attribute
        return getattr(self.real, "encoding", "utf-8")

    def fileno(self) -> int:
        return self.real.fileno()


def install() -> None:
    """Wrap this process's `sys.stdout`/`sys.stderr` (once) and give it a `display`."""
    for name in ("stdout", "stderr"):
        if not isinstance(getattr(sys, name), _ItemStream):
            setattr(sys, name, _ItemStream(name, getattr(sys, name)))
    # In a notebook `display` is a builtin (IPython puts it there); cells and notebook
    # functions call it unqualified, so a worker needs one too.
    if not hasattr(builtins, "display"):
        builtins.display = display  # type: ignore[attr-defined]


def display(*objs: Any, raw: bool = False, **_ignored: Any) -> None:
    """`display()` for worker items: records each object's rich representation for the cell.

    Outside an item the plain-text form is printed instead.

    Parameters
    ----------
    *objs : Any
        The objects to show; each becomes a mimebundle, as IPython's formatter makes it (else
        its ``repr``).
    raw : bool
        When True, an object that is a dict is taken as a ready mimebundle, as in IPython.
    **_ignored : Any
        IPython's other keywords (``display_id``, ``metadata``...), accepted so cells written
        for the notebook run unchanged, and ignored.

    Examples
    --------
    Outside an item, as here, the plain-text form is printed:

    >>> display({"text/plain": "done", "text/html": "<b>done</b>"}, raw=True)
    done
    """
    for obj in objs:
        bundle = obj if raw and isinstance(obj, dict) else _mimebundle(obj)
        if (outputs := running.outputs) is None:
            print(bundle.get("text/plain", ""))
        else:
            _chunks(outputs).append(["display", bundle])


def _mimebundle(obj: Any) -> dict[str, Any]:
    with contextlib.suppress(Exception):  # no IPython on the worker, or a failing _repr_*_: plain text
        from IPython.core.formatters import DisplayFormatter

        data, _ = DisplayFormatter().format(obj)
        if data:
            return dict(data)
    try:
        return {"text/plain": repr(obj)}
    except Exception:
        return {"text/plain": f"<unprintable {type(obj).__name__}>"}


# -- direct batches ------------------------------------------------------------------------
class Order:
    """Starts each sender's direct batches in the order it numbered them (module docstring).

    One per worker, in its event loop: a request waits its `turn`, and says when it `started`.
    Each start is an `asyncio.Event`, the latest `KEPT_STARTS` kept: a batch waits for its
    predecessor's.
    """

    def __init__(self) -> None:
        self._starts: OrderedDict[tuple[str, int], asyncio.Event] = OrderedDict()  # (sender, number) -> started

    async def turn(self, sender: str, number: int) -> None:
        """Wait until the batch `sender` numbered before `number` started, or `GAP_S` went by.

        Parameters
        ----------
        sender : str
            One start of one run, in one kernel.
        number : int
            The batch's number among that sender's batches to this worker, from 0.
        """
        if number and not (before := self._start(sender, number - 1)).is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(before.wait(), GAP_S)

    def started(self, sender: str, number: int) -> None:
        """Batch `number` of `sender` is in the thread pool's queue: wake the next one.

        Parameters
        ----------
        sender : str
            As for `turn`.
        number : int
            As for `turn`.
        """
        self._start(sender, number).set()

    def _start(self, sender: str, number: int) -> asyncio.Event:
        start = self._starts.setdefault((sender, number), asyncio.Event())
        while len(self._starts) > KEPT_STARTS:  # the oldest: their runs are over
            self._starts.popitem(last=False)
        return start


class FirstAhead:
    """Whether, and when, one batch's first item goes ahead of its answer (module docstring).

    Made in the worker's event loop by the request handler, as the batch arrives. The pool's
    thread hands it the first item's message when that item ends (`ran`), and asks at the
    batch's end whether it went (`close`); `AHEAD_S` after the start it is due (in the loop).
    The first item goes once it ended and is due, unless the batch ended first: the one
    decision, "sent" or "closed", is taken by whichever comes first (`dict.setdefault` is
    atomic), and the write happens in the loop in the same step as "sent".

    Parameters
    ----------
    write : callable
        Sends a message on the request's connection (``comm.write``); called in the event
        loop, it returns an awaitable.
    loop : asyncio.AbstractEventLoop
        The worker's event loop.
    """

    def __init__(self, write: Any, loop: asyncio.AbstractEventLoop):
        self._write, self._loop = write, loop
        self._message: Any = None  # the first item's message, once it ended
        self._due = False
        self._decided: dict[str, str] = {}  # "is": "sent" or "closed", set once
        self.written: asyncio.Future[Any] | None = None  # the ahead write, for the answer to wait on
        # From the request's arrival: a batch that queued behind another is late already, and
        # its first item goes ahead as soon as it ends. Due after the batch ended, it does nothing.
        loop.call_later(AHEAD_S, self.due)

    def ran(self, message: Any) -> None:
        """The first item ended (in the pool's thread): the message that carries its result.

        Parameters
        ----------
        message : Any
            ``{"first": blob}``, the blob a result of that one item (`dump_result`).
        """
        self._message = message
        if self._due:  # else `due` sends it, when it comes
            self._loop.call_soon_threadsafe(self._send)

    def due(self) -> None:
        """`AHEAD_S` after the batch arrived (in the event loop): send the first if it ended."""
        self._due = True
        self._send()

    def close(self) -> bool:
        """The batch ended (in the pool's thread): whether its first item went ahead.

        Returns
        -------
        bool
            True when the answer must leave the first item out.
        """
        return self._decided.setdefault("is", "closed") == "sent"

    def _send(self) -> None:
        if self._message is not None and self.written is None and self._decided.setdefault("is", "sent") == "sent":
            self.written = asyncio.ensure_future(self._write(self._message))


def serve(dask_worker: Any) -> int:
    """Serve `HANDLER` on this worker from now on (run by the kernel through ``Client.run``'s request).

    The handler runs one batch in the worker's thread pool and answers its result blob, or
    ``{"refused": reason}`` when this worker takes no work now (module docstring).

    Parameters
    ----------
    dask_worker : distributed.Worker
        The worker, as Dask's ``run`` request passes it.

    Returns
    -------
    int
        `VERSION`: the kernel sends direct batches only to a worker that answers its own.
    """
    from nbcluster._compat import as_worker, worker_accepts_work

    # One order per worker, kept when another kernel's client installs the handler again.
    order = dask_worker._nbcluster_direct_order = getattr(dask_worker, "_nbcluster_direct_order", None) or Order()

    def in_pool(key: str, context: tuple[str, bytes | None], batch: bytes, token: str, ahead: FirstAhead | None) -> bytes:
        # The item's code may ask `distributed.get_worker()` (and a large value's fetch does):
        # the pool's thread runs it as this worker's, as it would a task.
        with as_worker(dask_worker, key):
            return run_batch(context, batch, token, ahead=ahead)

    # A function, not a `functools.partial`: Dask logs each handler by its `__name__`. Its
    # first argument is named `comm`, so Dask passes the request's connection. `key` is the
    # batch's name as its Dask key would be (``distribute-<run id>-<n>``): the live view
    # draws it by that name.
    async def nbcluster_run_batch(comm: Any, key: str, context: tuple[str, bytes | None], batch: bytes, token: str,
                                  sender: str, number: int, first: bool = False) -> Any:  # fmt: skip
        await order.turn(sender, number)
        loop = asyncio.get_running_loop()
        try:
            if (refused := worker_accepts_work(dask_worker)) is not None:
                return {"refused": refused}
            ahead = FirstAhead(comm.write, loop) if first else None
            start = time.time()
            # Queued in the pool by this call itself, before the sender's next batch may start.
            running = loop.run_in_executor(dask_worker.executors["default"], in_pool, key, context, batch, token, ahead)
        finally:
            order.started(sender, number)
        blob = await running
        if (trim := dask_worker.plugins.get(MEMORY_TRIM_PLUGIN)) is not None:
            trim.dirty = True  # what it freed goes back to the system, as after a task
        if ahead is not None and ahead.written is not None:
            await ahead.written  # the first item before the rest, on the same connection
        dask_worker.log_event(DIRECT_TOPIC, DirectRecord(key=key, start=start, stop=time.time()))
        return blob

    dask_worker.handlers[HANDLER] = nbcluster_run_batch
    return VERSION


def refusal(answer: Any) -> str | None:
    """Why a worker refused a direct batch, or None when `answer` is a result blob.

    Parameters
    ----------
    answer : Any
        What the worker answered.

    Returns
    -------
    str or None
        The reason (``"paused"``, ``"closing"``...).
    """
    return str(answer.get("refused", "an unexpected answer")) if isinstance(answer, dict) else None
