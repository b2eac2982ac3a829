"""Worker side of a direct batch: the kernel asks a worker itself, not the scheduler.

A batch that goes through Dask crosses the scheduler twice (kernel to scheduler to worker,
and the result's way back): 4 to 5 ms here for a task that does nothing, against 0.3 to
0.5 ms for a request the kernel sends a worker over the same TLS connection pool. So a run's
short batches, the first ones of every run (`engine.py`, "Direct batches"), go straight to a
worker: the request ``nbcluster_run_batch`` runs the batch in the worker's own thread pool,
the one its Dask tasks run in (so it never runs more at once than the worker has threads:
a direct batch queues behind a running task, as a task would), and answers with the result
blob `run_batch` would have returned.

The handler is not part of Dask: `install`, run once per worker through Dask's own ``run``
request (`Client.run`'s, which every worker serves), adds it. A worker that cannot import
nbcluster answers that request with its error, and the kernel sends that worker's batches
through the scheduler, where they fail with one line (`run/transport.py`, `task`).

What a direct batch does not do, and why that is safe:
- The scheduler does not see it as a task. The run's live view still draws it: the worker
  reports each one as a Dask event (`_wire.DIRECT_TOPIC`), which nbcluster's metrics plugin records as a
  task of the run. Dask's own dashboard does not, which is why only a run's first
  half-second goes direct.
- A worker that is not running (paused past its memory limit, closing) refuses it
  (``{"refused": why}``), and the kernel sends the batch through the scheduler instead, which
  holds it until the worker can take it.
- A worker that dies under it breaks the request; the kernel sends its items again through
  the scheduler, once, as Dask would have.

**The first item goes ahead.** A run's first result should arrive one item's time after its
start, whatever the other items do (an item that blocks, or takes an hour, right behind the
first). So a run's first direct batch says ``first``: the handler then takes the request's
connection (Dask passes it to a handler whose first argument is ``comm``). A batch that ends
within `AHEAD_S` of its arrival answers once, as any batch: every small cell does. When it is
still going by then, and its first item has finished (or when that item finishes later), the
worker writes the first item's result on that connection, ahead of the answer
(``{"first": blob}``), and leaves that item out of the answer. The kernel reads both on that
one connection, so the first always arrives before the rest (`run/transport.py`). No item is sent
twice or left out: whether the first went ahead is decided once, under a lock, by whichever
of the two comes first, the batch's end (in its thread) or the deadline (in the event loop).
A first item that went ahead and a worker that then dies: the kernel delivered the first,
and sends the rest again, as it would for any broken batch.

In the order sent. The kernel sends a worker's direct batches as concurrent requests, each
over a connection of its pool, and two of them can reach the worker in either order (the
second's connection may be the one already open). Run out of order, an item could wait
behind a later one: a slow or blocked item 3 holding the worker's one thread while item 1,
sent first, waits. So each request carries its sender (one start of one run) and its number
among that sender's batches to this worker, and `_Order` starts them in that order. A batch
whose predecessor has not come within `GAP_S` starts anyway: order is worth a wait that
short, never a hang on a request that broke on its way.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from typing import Any

from nbcluster._compat import as_worker, worker_accepts_work
from nbcluster._wire import DIRECT_TOPIC, DirectRecord
from nbcluster.worker import dump_result, run_blob

#: The request a worker serves once `install` ran there.
HANDLER = "nbcluster_run_batch"
#: Bumped when the request's arguments or answer change: a kernel only sends batches to a
#: worker that installed the same version.
VERSION = 3
#: How long a batch waits for the one its sender sent this worker before it.
GAP_S = 0.5
#: Senders whose order a worker keeps (the oldest are forgotten: their runs are over).
MAX_SENDERS = 64
#: A first batch still running this long after its arrival sends its first item ahead.
AHEAD_S = 0.005


class _Order:
    """Starts each sender's direct batches in the order it numbered them (module docstring)."""

    def __init__(self) -> None:
        self._next: OrderedDict[str, int] = OrderedDict()  # sender -> the number to start next
        self._waiting: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def turn(self, sender: str, number: int) -> None:
        """Wait until the batches `sender` numbered before `number` started (or `GAP_S`)."""
        if number <= self._next.setdefault(sender, 0):
            return
        if len(self._next) > MAX_SENDERS:
            self._next.popitem(last=False)
        waiter = self._waiting[sender, number] = asyncio.get_running_loop().create_future()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, GAP_S)
        finally:
            self._waiting.pop((sender, number), None)

    def started(self, sender: str, number: int) -> None:
        """Batch `number` of `sender` is in the thread pool's queue: wake the next one."""
        following = self._next[sender] = max(self._next.get(sender, 0), number + 1)
        waiter = self._waiting.get((sender, following))
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class FirstAhead:
    """Whether, and when, one batch's first item goes ahead of its answer (module docstring).

    Made in the worker's event loop by the request handler; `ran` is called from the pool's
    thread when the first item ends, `close` from it when the batch ends, `due` from the
    loop `AHEAD_S` after the start.

    Parameters
    ----------
    encode : callable
        The message that carries the first item's result (as `run_items` returns one).
        Called once it is decided to send it: if it raises, the first item is not sent
        ahead and stays in the answer.
    write : callable
        Sends a message on the request's connection (``comm.write``); called in the event
        loop, it returns an awaitable.
    loop : asyncio.AbstractEventLoop
        The worker's event loop.
    """

    def __init__(self, encode: Any, write: Any, loop: asyncio.AbstractEventLoop):
        self._encode, self._write, self._loop = encode, write, loop
        self._lock = threading.Lock()
        self._first: dict[str, Any] | None = None  # the first item's result, once it ended
        self._due = False
        self._state = "open"  # "sent": the first item goes ahead; "closed": the batch ended first
        self.written: asyncio.Future[Any] | None = None  # the ahead write, for the answer to wait on
        self.seconds = 0.0  # the first item's time, which the answer then leaves out

    def ran(self, first: dict[str, Any]) -> None:
        """The first item ended (in the pool's thread): its result, as `run_items` returns one.

        Parameters
        ----------
        first : dict
            ``values``, ``errors``, ``outputs``, ``count`` (1) and ``seconds`` of that item.
        """
        with self._lock:
            self._first = first
            message = self._take()
        if message is not None:
            self._loop.call_soon_threadsafe(self._send, message)

    def due(self) -> None:
        """`AHEAD_S` after the batch started (in the event loop): send the first if it ended."""
        with self._lock:
            self._due = True
            message = self._take()
        if message is not None:
            self._send(message)

    def close(self) -> bool:
        """The batch ended (in the pool's thread): whether its first item went ahead.

        Returns
        -------
        bool
            True when the answer must leave the first item out.
        """
        with self._lock:
            self._state = "closed" if self._state == "open" else self._state
            return self._state == "sent"

    def _take(self) -> Any:
        # Under the lock: the first item goes ahead once it ended and is due, unless the batch
        # ended first. Encoded here, so that one that cannot be is simply left in the answer.
        if self._state != "open" or not self._due or self._first is None:
            return None
        try:
            message = self._encode(self._first)
        except Exception:
            self._state = "closed"
            return None
        self._state, self.seconds = "sent", float(self._first["seconds"])
        return message

    def _send(self, message: Any) -> None:
        self.written = asyncio.ensure_future(self._write(message))


def install(dask_worker: Any) -> int:
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
    # One order per worker, kept when another kernel's client installs the handler again.
    order = getattr(dask_worker, "_nbcluster_direct_order", None) or _Order()
    dask_worker._nbcluster_direct_order = order

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
            ahead = FirstAhead(lambda result: {"first": dump_result(result)}, comm.write, loop) if first else None
            start = time.time()
            # Queued in the pool by this call itself, before the sender's next batch may start.
            running = loop.run_in_executor(dask_worker.executors["default"], _as_worker, dask_worker, key, context,
                                           batch, token, ahead)  # fmt: skip
        finally:
            order.started(sender, number)
        # From the request's arrival: a batch that queued behind another is late already, and
        # its first item goes ahead as soon as it ends.
        deadline = loop.call_later(AHEAD_S, ahead.due) if ahead is not None else None
        try:
            blob = await running
        finally:
            if deadline is not None:
                deadline.cancel()
        if ahead is not None and ahead.written is not None:
            await ahead.written  # the first item before the rest, on the same connection
        dask_worker.log_event(DIRECT_TOPIC, DirectRecord(key=key, start=start, stop=time.time()))
        return blob

    dask_worker.handlers[HANDLER] = nbcluster_run_batch
    return VERSION


def _as_worker(dask_worker: Any, key: str, *args: Any) -> bytes:
    # The item's code may ask `distributed.get_worker()` (and a large value's fetch does):
    # the pool's thread runs it as this worker's, as it would a task.
    with as_worker(dask_worker, key):
        return run_blob(*args)


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
