"""What runs on a worker (and, for `--local`, in the kernel): one batch of items.

A Dask task is `run_batch((context_key, inline_context), batch)`, with no Dask
dependencies at all, so the scheduler treats every batch as a root task and hands them
out from its queue to whichever thread is free.

- The *context* is one opaque pickled blob per cell run: the cell's code (or function),
  the small captured variables (each pickled on its own in the kernel, so a bad one is
  named before anything is sent), modules to import, how an item binds names, the seed,
  and the Dask keys of the large values. Up to `INLINE_CONTEXT` bytes it rides inline in
  every batch; above that it is scattered and fetched by key. Either way each worker
  unpickles it once (`_CONTEXTS`) however many batches it runs.
- *Large values* (pickles over 1 MB) are scattered to every worker by the kernel and
  kept in `_OBJECTS`, an LRU bounded in bytes, *outside* Dask's store: Dask's active
  memory manager drops "superfluous" replicas of scattered data every few seconds, which
  would make the next cell fetch the array again (that is also why they are not task
  dependencies). Right after the scatter the kernel runs `pin` on every worker, which
  moves the fresh replica into `_OBJECTS` (the same object, no copy); a worker that
  joins later fetches the value from a peer on its first batch (`_fetch`).
- A key that no worker holds any more (every holder died) comes back as `{"lost": key}`;
  the kernel scatters it again and resubmits the batch.
- `batch` is one opaque blob `(indices, items)`: Dask never walks into it (walking a list
  of 2,500 items costs ~16 us per item; an opaque blob ~1 us).

A batch may carry a time *budget*: it returns, between items, once the budget is spent,
with the items it reached; the kernel sends the rest again. So a batch sized from a
misleading estimate still comes back on time (see `batching.py`).

The task returns one opaque blob: per-item values, error records, captured output, the
time spent in the items (for the batch sizing in `batching.py`). A batch never raises for an item:
each item's exception is recorded with its own traceback, so one failing item loses
nothing else. Only a context that cannot even be loaded fails the whole batch, again as
a returned record.

Stopping: a batch carries its run's *stop token*. `stop_run(token)`, sent to every
worker by the kernel on interrupt or `Results.cancel()`, adds it to `_STOPPED`; a batch
looks the token up before each item (a set lookup, ~50 ns) and returns early with the
items it finished, `"stopped": True`. So a cancel keeps finished work, and a worker thread
is free again one item later (Dask cannot stop a running thread, and cancelling the
task on the scheduler would throw the finished items away). A batch whose Dask task was
cancelled outright (the kernel gave up waiting) also stops, checked every 50 ms.

Captured values are shared by the items a worker runs (as Dask shares a dependency
between tasks): treat them as read-only.

Output capture: `sys.stdout`/`sys.stderr` are wrapped once per process by a stream that
sends writes to the current item's buffer when the writing thread is running an item,
and to the real stream otherwise. With several threads per worker, each item sees only
its own prints.

This module imports nothing else from nbcluster: a worker needs cloudpickle and Dask.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import io
import linecache
import marshal
import os
import pickle
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from types import CodeType
from typing import Any, TextIO

import cloudpickle

_CONTEXTS: OrderedDict[str, Context] = OrderedDict()
_CONTEXTS_LOCK = threading.Lock()
_KEEP_CONTEXTS = 8
_local = threading.local()
_OUTPUT_LIMIT = 64 * 1024  # characters kept per item and stream
_CANCEL_CHECK_S = 0.05
_STOPPED: OrderedDict[str, None] = OrderedDict()  # stop tokens of runs told to stop, newest last
_KEEP_STOPPED = 256
INLINE_CONTEXT = 64 * 1024  # bytes: a bigger context is scattered instead of sent per batch
_OBJECTS: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (value, size)
_OBJECTS_LOCK = threading.Lock()
_INFLIGHT: dict[str, threading.Event] = {}  # keys being fetched, for other threads to wait on
_OBJECTS_BYTES = 2_000_000_000  # at most this much (or 40% of the worker's memory limit)
_FETCH_CHECK_S = 2.0  # while fetching a value, how often to check that someone still holds it
_HERE = os.path.normcase(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE)


class Context:
    """A cell run's shared state on one worker (or in the kernel for --local)."""

    def __init__(self, spec: dict[str, Any], namespace: dict[str, Any]):
        self.kind: str = spec["kind"]
        self.mode: str = spec["mode"]
        self.names: tuple[str, ...] = tuple(spec["names"])
        self.target: str = spec["target"]
        self.unpacks: bool = spec["unpacks"]
        self.positional: bool = spec["positional"]
        self.seed: int | None = spec["seed"]
        self.large: list[tuple[str, str, int]] = spec["large"]  # (name, key, size)
        # The function of a "function" item; the code of a "cell" one.
        self.fn: Callable[..., Any] | None = spec.get("fn")
        self.namespace = namespace
        self.body: CodeType | None = None
        self.last: CodeType | None = None
        self.bind: CodeType | None = None
        if self.kind == "cell":
            filename, source = spec["filename"], spec["source"]
            linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
            # marshal, not cloudpickle: cloudpickle renames every code object's file to
            # "<dynamic-code>", and the cell's filename is what maps tracebacks to cell lines.
            self.body = spec["body"] if isinstance(spec["body"], CodeType) else marshal.loads(spec["body"])
            last = spec["last"]
            self.last = marshal.loads(last) if isinstance(last, bytes) else last
            if self.unpacks and self.mode == "over":
                self.bind = compile(
                    f"{self.target} = __nbcluster_item__", "<--over>", "exec", dont_inherit=True
                )

    @classmethod
    def from_payload(cls, payload: bytes) -> Context:
        spec = cloudpickle.loads(payload)
        namespace: dict[str, Any] = {"__name__": "__main__"}
        for name, module in spec["modules"].items():
            try:
                namespace[name] = importlib.import_module(module)
            except ImportError as e:
                raise ImportError(
                    f"the cell uses `{name}` (module {module}), which cannot be imported on the "
                    f"worker: {e}. Install it on the workers"
                ) from None
        for name, blob in spec["values"].items():
            try:
                namespace[name] = cloudpickle.loads(blob)
            except Exception as e:
                raise RuntimeError(
                    f"the variable `{name}` could not be loaded on the worker: {type(e).__name__}: {e} "
                    "(is a module it needs missing there?)"
                ) from None
        if spec["kind"] == "function":
            spec["fn"] = cloudpickle.loads(spec["fn"])
        return cls(spec, namespace)


class Lost(Exception):
    """A scattered value no worker holds any more."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def run_batch(context: tuple[str, bytes | None], batch: bytes, token: str | None = None) -> bytes:
    """The Dask task: run a batch of items, return the opaque result blob."""
    if token in _STOPPED:  # queued before the stop: nothing to load or run
        return cloudpickle.dumps(
            {"values": [], "errors": {}, "outputs": {}, "count": 0, "seconds": 0.0, "stopped": True}
        )
    try:
        loaded = _context(*context)
        large_values = tuple(_fetch(key, size) for _, key, size in loaded.large)
    except Lost as e:
        return cloudpickle.dumps({"lost": e.key, "worker": _address()})
    except BaseException as e:
        return cloudpickle.dumps({"fatal": error_record(e)})
    indices, items, budget = pickle.loads(batch)
    _install_streams()
    return dump_result(
        run_items(loaded, indices, items, large_values, capture=True, token=token, budget=budget)
    )


def stop_run(token: str) -> None:
    """Make running and queued batches of the run with this stop token return early.

    Run on every worker with `client.run` (in its event loop); batches read `_STOPPED`
    from their threads, which a dict under the GIL allows.
    """
    _STOPPED[token] = None
    while len(_STOPPED) > _KEEP_STOPPED:
        _STOPPED.popitem(last=False)


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

    Stops early, between items, when the run was told to stop (`token`) or once `budget`
    seconds have gone by. Returns the values and errors of the first `count` items, their
    output, the time they took (`seconds`), and `stopped` if some were not reached.
    """
    base = context.namespace
    if large_values:
        base = {**base, **{name: v for (name, _, _), v in zip(context.large, large_values, strict=True)}}
    values: list[Any] = [None] * len(items)
    errors: dict[int, dict[str, Any]] = {}
    outputs: dict[int, list[list[str]]] = {}
    if capture:
        _local.outputs = outputs
    started = checked = time.perf_counter()
    done = 0
    stopped = False
    try:
        for j, item in enumerate(items):
            if token in _STOPPED:
                stopped = True
                break
            index = indices[j]
            _local.index = index
            try:
                values[j] = _run_one(context, base, item, index)
            except KeyboardInterrupt:
                raise  # Ctrl-C in the kernel (--local) stops the cell; workers never get one
            except BaseException as e:  # SystemExit too: one item's sys.exit() fails that item
                errors[j] = error_record(e)
            done = j + 1
            now = time.perf_counter()
            if budget is not None and now - started >= budget:
                stopped = True
                break
            if now - checked > _CANCEL_CHECK_S:
                checked = now
                if _task_cancelled():
                    stopped = True
                    break
    finally:
        _local.outputs = None
    return {
        "values": values[:done],
        "errors": errors,
        "outputs": outputs,
        "count": done,
        "seconds": time.perf_counter() - started,
        "stopped": stopped and done < len(items),
    }


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
    assert context.body is not None  # set for every "cell" context
    exec(context.body, ns)
    return eval(context.last, ns) if context.last is not None else None


def item_seed(seed: int, index: int) -> int:
    """A 32-bit seed from the cell's seed and the item's index (fits `np.random.seed`)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def dump_result(result: dict[str, Any]) -> bytes:
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


# -- errors ---------------------------------------------------------------------------------
def error_record(e: BaseException) -> dict[str, Any]:
    """Everything the kernel needs to show and re-raise `e`, with this module's frames gone."""
    chain: list[dict[str, Any]] = []
    seen: set[int] = set()
    current: BaseException | None = e
    relation = ""
    while current is not None and id(current) not in seen and len(chain) < 8:
        seen.add(id(current))
        chain.append(
            {
                "type": _type_name(type(current)),
                "message": _safe_str(current),
                "frames": _frames(current.__traceback__),
                "relation": relation,
            }
        )
        if current.__cause__ is not None:
            current, relation = current.__cause__, "cause"
        elif current.__context__ is not None and not current.__suppress_context__:
            current, relation = current.__context__, "context"
        else:
            current = None
    exception: bytes | None
    try:
        exception = cloudpickle.dumps(e)
        cloudpickle.loads(exception)  # an exception that cannot be rebuilt is useless later
    except Exception:
        exception = None
    return {"type": chain[0]["type"], "message": chain[0]["message"], "chain": chain, "exception": exception}


def _frames(tb: Any) -> list[tuple[str, int, str]]:
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = (
            os.path.normcase(os.path.abspath(code.co_filename))
            if not code.co_filename.startswith("<")
            else ""
        )
        if not filename.startswith(_PACKAGE):
            frames.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    return frames


def _type_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:
        return f"<unprintable {type(e).__name__}>"


# -- cancellation -----------------------------------------------------------------------------
def _task_cancelled() -> bool:
    """True when this thread's Dask task was cancelled (best effort; False outside Dask)."""
    try:
        from dask.context import thread_state  # the object distributed.worker re-exports

        from nbcluster._compat import worker_task

        key = getattr(thread_state, "key", None)
        if key is None:
            return False
        ts = worker_task(key)
        return ts is None or ts.state in ("cancelled", "released", "forgotten")
    except Exception:
        return False


# -- context cache --------------------------------------------------------------------------
def _context(key: str, inline: bytes | None) -> Context:
    with _CONTEXTS_LOCK:
        context = _CONTEXTS.get(key)
        if context is not None:
            _CONTEXTS.move_to_end(key)
            return context
    # Unpickle outside the lock; two threads racing on the first batch both build one.
    context = Context.from_payload(inline if inline is not None else _fetch(key, 0, keep=False))
    with _CONTEXTS_LOCK:
        _CONTEXTS[key] = context
        while len(_CONTEXTS) > _KEEP_CONTEXTS:
            _CONTEXTS.popitem(last=False)
    return context


def _fetch(key: str, size: int, *, keep: bool = True) -> Any:
    """A scattered value by key: cached, else this worker's Dask store, else a peer.

    `_OBJECTS_LOCK` is never held while waiting on the network: `pin` takes it from the
    worker's event loop, and a fetch needs that loop to make progress. Threads wanting the
    same key wait for the one fetching it (`_INFLIGHT`).
    """
    while True:
        with _OBJECTS_LOCK:
            found = _OBJECTS.get(key)
            if found is not None:
                _OBJECTS.move_to_end(key)
                return found[0]
            waiting = _INFLIGHT.get(key)
            if waiting is None:
                _INFLIGHT[key] = threading.Event()
        if waiting is None:
            break
        waiting.wait()  # then look again: found, or that fetch failed and this thread tries
    try:
        from distributed import Future, get_client, get_worker

        worker = get_worker()
        try:
            value = worker.data[key]  # zict mappings are thread-safe
        except KeyError:
            client = get_client()
            # state="memory" is how Dask's own Variable hands a Future to another client.
            # Dask annotates `state` as a FutureState, yet looks it up in its string-keyed
            # `Client._state_handlers`, as its Variable does.
            future: Future[Any] = Future(key, client, state="memory")  # type: ignore[arg-type]
            try:
                value = _gather_watching(client, future)
            except Lost:
                raise
            except Exception as e:
                raise Lost(key) from e
            finally:
                future.release()
        if keep:
            with _OBJECTS_LOCK:
                _remember(worker, key, value, size)
        return value
    finally:
        with _OBJECTS_LOCK:
            _INFLIGHT.pop(key).set()


def _gather_watching(client: Any, future: Any) -> Any:
    """Gather one value from a peer, giving up as soon as no worker holds it any more.

    A holder can die mid-transfer; Dask's gather would then wait for a key nobody will
    ever send again. The transfer runs on the worker's event loop while this thread checks
    every couple of seconds that someone still holds the key (a slow transfer of a big
    value is left to finish).
    """
    import asyncio
    import concurrent.futures

    key = future.key

    async def gather() -> Any:
        return await client.gather([future], asynchronous=True)

    if not client.who_has([future]).get(key):
        raise Lost(key)
    transfer = asyncio.run_coroutine_threadsafe(gather(), client.loop.asyncio_loop)
    while True:
        try:
            return transfer.result(timeout=_FETCH_CHECK_S)[0]
        except concurrent.futures.TimeoutError:
            if not client.who_has([future]).get(key):
                transfer.cancel()
                raise Lost(key) from None


def _address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return None


def pin(keys: list[tuple[str, int]], dask_worker: Any = None) -> int:
    """Keep the values just scattered here (`client.run`, in the worker's event loop).

    Run right after a broadcast scatter, before Dask's memory manager can drop this
    worker's replica: the worker then never fetches them again. Returns how many it had.
    """
    pinned = 0
    with _OBJECTS_LOCK:
        for key, size in keys:
            if key in _OBJECTS:
                pinned += 1
                continue
            try:
                value = dask_worker.data[key]
            except KeyError:
                continue  # fetched on this worker's first batch instead
            _remember(dask_worker, key, value, size)
            pinned += 1
    return pinned


def _remember(worker: Any, key: str, value: Any, size: int) -> None:
    """Add to `_OBJECTS` (lock held), evicting the least recently used beyond the budget."""
    _OBJECTS[key] = (value, size)
    limit = _OBJECTS_BYTES
    memory_limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    if memory_limit:
        limit = min(limit, int(memory_limit * 0.4))
    while len(_OBJECTS) > 1 and sum(s for _, s in _OBJECTS.values()) > limit:
        _OBJECTS.popitem(last=False)


# -- output capture -------------------------------------------------------------------------
class _ItemStream(io.TextIOBase):
    """Writes go to the running item's buffer in this thread, else to the real stream."""

    def __init__(self, name: str, real: TextIO):
        self.name_ = name
        self.real = real

    def write(self, text: str) -> int:
        outputs = getattr(_local, "outputs", None)
        if outputs is None:
            return self.real.write(text)
        chunks = outputs.setdefault(_local.index, [])
        if chunks and chunks[-1][0] == self.name_:
            if len(chunks[-1][1]) < _OUTPUT_LIMIT:
                chunks[-1][1] += text
                if len(chunks[-1][1]) >= _OUTPUT_LIMIT:
                    chunks[-1][1] = chunks[-1][1][:_OUTPUT_LIMIT] + "\n... (output truncated)\n"
        else:
            chunks.append([self.name_, text[:_OUTPUT_LIMIT]])
        return len(text)

    def flush(self) -> None:
        if getattr(_local, "outputs", None) is None:
            self.real.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    # TextIOBase declares `encoding` a plain attribute; this one is the real stream's, read
    # when asked.
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")

    def fileno(self) -> int:
        return self.real.fileno()


def _install_streams() -> None:
    if not isinstance(sys.stdout, _ItemStream):
        sys.stdout = _ItemStream("stdout", sys.stdout)
    if not isinstance(sys.stderr, _ItemStream):
        sys.stderr = _ItemStream("stderr", sys.stderr)
    # In a notebook `display` is a builtin (IPython puts it there); cells and notebook
    # functions call it unqualified, so a worker needs one too.
    if not hasattr(builtins, "display"):
        # The builtins stub has no `display`: IPython adds one at run time, as this does (and
        # ruff's B010 asks for this form rather than setattr).
        builtins.display = display  # type: ignore[attr-defined]


def display(*objs: Any, raw: bool = False, **_ignored: Any) -> None:
    """`display()` for worker items: records each object's rich representation for the cell."""
    outputs = getattr(_local, "outputs", None)
    for obj in objs:
        bundle = obj if raw and isinstance(obj, dict) else _mimebundle(obj)
        if outputs is None:
            print(bundle.get("text/plain", ""))
        else:
            outputs.setdefault(_local.index, []).append(["display", bundle])


def _mimebundle(obj: Any) -> dict[str, Any]:
    try:
        from IPython.core.formatters import DisplayFormatter

        data, _ = DisplayFormatter().format(obj)
        if data:
            return dict(data)
    except Exception:  # no IPython on the worker, or a failing _repr_*_: plain text will do
        pass
    try:
        return {"text/plain": repr(obj)}
    except Exception:
        return {"text/plain": f"<unprintable {type(obj).__name__}>"}
