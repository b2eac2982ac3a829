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
  half-second goes direct. The events leave `EVENTS_S` after the answers, together
  (`_Events`), so that they do not compete with the answer the kernel waits for.
- A worker that is not running (paused past its memory limit, closing) refuses it
  (``{"refused": why}``), and the kernel sends the batch through the scheduler instead, which
  holds it until the worker can take it.
- A worker that dies under it breaks the request; the kernel sends its items again through
  the scheduler, once, as Dask would have.

A run's first batch says ``first``: the handler then takes the request's connection
(Dask passes it to a handler whose first argument is ``comm``) and, when the batch is still
going `ahead.AHEAD_S` after it arrived, writes the first item's result on it ahead of the
answer (`ahead.py`).

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
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from nbcluster._compat import as_worker, worker_accepts_work
from nbcluster._wire import DIRECT_TOPIC, DirectRecord
from nbcluster.worker import run_blob
from nbcluster.worker.ahead import AHEAD_S, FirstAhead
from nbcluster.worker.items import dump_result

#: The request a worker serves once `install` ran there.
HANDLER = "nbcluster_run_batch"
#: Bumped when the request's arguments or answer change: a kernel only sends batches to a
#: worker that installed the same version.
VERSION = 3
#: How long a batch waits for the one its sender sent this worker before it.
GAP_S = 0.5
#: Senders whose order a worker keeps (the oldest are forgotten: their runs are over).
MAX_SENDERS = 64
#: How long a finished batch's event waits on the worker before it goes to the scheduler.
EVENTS_S = 0.02


class _Line:
    """One sender's batches on this worker: the number to start next, and those waiting for their turn."""

    __slots__ = ("following", "waiting")

    def __init__(self) -> None:
        self.following = 0
        self.waiting: dict[int, asyncio.Future[None]] = {}


class _Order:
    """Starts each sender's direct batches in the order it numbered them (module docstring)."""

    def __init__(self) -> None:
        self._lines: OrderedDict[str, _Line] = OrderedDict()

    async def turn(self, sender: str, number: int) -> None:
        """Wait until the batches `sender` numbered before `number` started (or `GAP_S`)."""
        line = self._lines.get(sender)
        if line is None:
            line = self._lines[sender] = _Line()
            while len(self._lines) > MAX_SENDERS:
                self._lines.popitem(last=False)
        if number <= line.following:
            return
        waiter = line.waiting[number] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(waiter, GAP_S)
        except asyncio.TimeoutError:
            pass
        finally:
            line.waiting.pop(number, None)

    def started(self, sender: str, number: int) -> None:
        """Batch `number` of `sender` is in the thread pool's queue: wake the next one."""
        line = self._lines.get(sender)
        if line is None:
            return
        line.following = max(line.following, number + 1)
        waiter = line.waiting.get(line.following)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Events:
    """A worker's direct-batch events, sent to the scheduler `EVENTS_S` after the first of them.

    Sent at once, a batch's event left beside its answer: on this 2-core machine the worker's
    write to the scheduler, the scheduler's read and its metrics plugin took their share of
    the cores in the very millisecond the kernel was taking the answer in, which is what the
    cell waits for. Held back, it goes after, and one message carries the events of every
    batch that ended meanwhile (a cell's first item and the probe behind it). The live view,
    which draws them, refreshes every few hundred ms.
    """

    def __init__(self, dask_worker: Any):
        self._worker = dask_worker
        self._held: list[DirectRecord] = []

    def add(self, event: DirectRecord) -> None:
        """Send `event` on `DIRECT_TOPIC` with the others that come within `EVENTS_S` (in the worker's loop)."""
        self._held.append(event)
        if len(self._held) == 1:
            asyncio.get_running_loop().call_later(EVENTS_S, self._send)

    def _send(self) -> None:
        held, self._held = self._held, []
        for event in held:  # one loop callback: Dask's batched stream takes them in one write
            self._worker.log_event(DIRECT_TOPIC, event)


def install(dask_worker: Any) -> int:
    """Serve `HANDLER` on this worker from now on (run by the kernel through ``Client.run``'s request).

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
    order = getattr(dask_worker, "_nbcluster_direct_order", None)
    if order is None:
        order = dask_worker._nbcluster_direct_order = _Order()

    # A function, not a `functools.partial`: Dask logs each handler by its `__name__`. Its
    # first argument is named `comm`, so Dask passes the request's connection (`ahead.py`).
    async def nbcluster_run_batch(
        comm: Any,
        key: str,
        context: tuple[str, bytes | None],
        batch: bytes,
        token: str,
        sender: str,
        number: int,
        first: bool = False,
    ) -> Any:
        await order.turn(sender, number)
        ahead = None
        if first:
            ahead = FirstAhead(lambda result: {"first": dump_result(result)}, comm.write, asyncio.get_running_loop())
        return await serve(
            dask_worker, key, context, batch, token, started=lambda: order.started(sender, number), ahead=ahead
        )

    dask_worker.handlers[HANDLER] = nbcluster_run_batch
    return VERSION


async def serve(
    dask_worker: Any,
    key: str,
    context: tuple[str, bytes | None],
    batch: bytes,
    token: str,
    started: Callable[[], None] = lambda: None,
    ahead: FirstAhead | None = None,
) -> Any:
    """Run one batch in the worker's thread pool; its result blob, or why it was refused.

    Parameters
    ----------
    dask_worker : distributed.Worker
        The worker serving the request.
    key : str
        The batch's name, as its Dask key would be (``distribute-<run id>-<n>``): the live
        view draws it by that name.
    context, batch, token
        As for `nbcluster.worker.run_batch`.
    started : callable, optional
        Called once the batch is queued in the thread pool, or refused.
    ahead : FirstAhead, optional
        For a run's first batch: sends its first item ahead when the batch is still going
        `ahead.AHEAD_S` after its start (`ahead.py`).

    Returns
    -------
    bytes or dict
        The result blob; ``{"refused": reason}`` when this worker takes no work now.
    """
    try:
        refused = worker_accepts_work(dask_worker)
        if refused is not None:
            return {"refused": refused}
        start = time.time()
        loop = asyncio.get_running_loop()
        # Queued in the pool by this call itself, before `started` lets the next batch in.
        running = loop.run_in_executor(
            dask_worker.executors["default"], _as_worker, dask_worker, key, run_blob, context, batch, token, ahead
        )
    finally:
        started()
    if ahead is None:
        blob = await running
    else:
        # From the request's arrival: a batch that queued behind another is late already, and
        # its first item goes ahead as soon as it ends.
        deadline = loop.call_later(AHEAD_S, ahead.due)
        try:
            blob = await running
        finally:
            deadline.cancel()
        if ahead.written is not None:
            await ahead.written  # the first item before the rest, on the same connection
    events = getattr(dask_worker, "_nbcluster_direct_events", None)
    if events is None:
        events = dask_worker._nbcluster_direct_events = _Events(dask_worker)
    events.add(DirectRecord(key=key, start=start, stop=time.time()))
    return blob


def _as_worker(dask_worker: Any, key: str, fn: Any, *args: Any) -> Any:
    # The item's code may ask `distributed.get_worker()` (and a large value's fetch does):
    # the pool's thread runs it as this worker's, as it would a task.
    with as_worker(dask_worker, key):
        return fn(*args)


def refusal(answer: Any) -> str | None:
    """Why a worker refused a direct batch, or None when `answer` is a result blob.

    Parameters
    ----------
    answer : Any
        What `serve` answered.

    Returns
    -------
    str or None
        The reason (``"paused"``, ``"closing"``...).
    """
    if isinstance(answer, dict):
        return str(answer.get("refused", "an unexpected answer"))
    return None


