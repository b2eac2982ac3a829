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

import hashlib
import time
from typing import Any

import cloudpickle

from nbcluster.distribute.worker import output, stopping
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

    Stops early, between items, when the run was told to stop (`token`) or once `budget`
    seconds have gone by. Returns the values and errors of the first `count` items, their
    output, the time they took (`seconds`), and `stopped` if some were not reached.
    """
    base = context.namespace
    if large_values:
        base = {**base, **{name: v for (name, _, _), v in zip(context.large, large_values, strict=True)}}
    values: list[Any] = [None] * len(items)
    errors: dict[int, ErrorRecord] = {}
    outputs: dict[int, list[list[Any]]] = {}
    if capture:
        output.collect(outputs)
    started = checked = time.perf_counter()
    done = 0
    stopped = False
    try:
        for j, item in enumerate(items):
            if stopping.stopped(token):
                stopped = True
                break
            index = indices[j]
            output.at(index)
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
            if now - checked > stopping.CHECK_S:
                checked = now
                if stopping.cancelled():
                    stopped = True
                    break
    finally:
        output.collect(None)
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
    """The batch's result as one blob; an item whose value cannot be pickled fails alone."""
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
