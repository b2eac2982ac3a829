"""Worker side: the large captured values, kept in an LRU outside Dask's store.

Large values (pickles over 1 MB) are scattered to every worker by the kernel and kept in
`_OBJECTS`, an LRU bounded in bytes, *outside* Dask's store: Dask's active memory manager
drops "superfluous" replicas of scattered data every few seconds, which would make the
next cell fetch the array again (that is also why they are not task dependencies). Right
after the scatter the kernel runs `pin` on every worker, which moves the fresh replica into
`_OBJECTS` (the same object, no copy); a worker that joins later fetches the value from a
peer on its first batch (`fetch`). A key no worker holds any more raises `Lost`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from nbcluster.errors import Lost

_OBJECTS: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # key -> (value, size)
_OBJECTS_LOCK = threading.Lock()
_INFLIGHT: dict[str, threading.Event] = {}  # keys being fetched, for other threads to wait on
_OBJECTS_BYTES = 2_000_000_000  # at most this much (or 40% of the worker's memory limit)
_FETCH_CHECK_S = 2.0  # while fetching a value, how often to check that someone still holds it


def fetch(key: str, size: int, *, keep: bool = True) -> Any:
    """A scattered value by key: cached, else this worker's Dask store, else a peer.

    `_OBJECTS_LOCK` is never held while waiting on the network: `pin` takes it from the
    worker's event loop, and a fetch needs that loop to make progress. Threads wanting the
    same key wait for the one fetching it (`_INFLIGHT`).

    Parameters
    ----------
    key : str
        The value's Dask key (from the scatter).
    size : int
        Its pickled size in bytes, what it counts for in the LRU's budget.
    keep : bool
        Whether to keep it in the LRU afterwards (False for a context, which `context.load`
        caches itself).

    Returns
    -------
    Any
        The value.

    Raises
    ------
    nbcluster.errors.Lost
        When no worker holds the key any more (the kernel then scatters it again).
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


def pin(keys: list[tuple[str, int]], dask_worker: Any = None) -> int:
    """Keep the values just scattered here (`client.run`, in the worker's event loop).

    Run right after a broadcast scatter, before Dask's memory manager can drop this
    worker's replica: the worker then never fetches them again.

    Parameters
    ----------
    keys : list of (str, int)
        The scattered values' keys with their pickled sizes.
    dask_worker : distributed.Worker
        The worker, which `client.run` passes in.

    Returns
    -------
    int
        How many of the keys this worker now keeps (a key it had no replica of is fetched on
        its first batch instead).
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


def ran_on() -> tuple[str, str] | None:
    """This worker's address and name (its address when it has none), or None outside a worker.

    A batch's result carries it, so the kernel's journal can say which worker ran each item.

    Returns
    -------
    tuple of (str, str) or None
        ``(address, name)`` as the scheduler knows the worker.
    """
    try:
        from distributed import get_worker

        worker = get_worker()
    except Exception:
        return None
    return worker.address, str(worker.name if worker.name is not None else worker.address)


def address() -> str | None:
    """This worker's address, or None outside a Dask worker.

    Returns
    -------
    str or None
        The address, as the scheduler knows the worker.
    """
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return None
