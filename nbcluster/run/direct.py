"""Direct batches, kernel side: a run's first batches go to a worker, not through the scheduler.

Why. A batch that is a Dask task crosses the scheduler on its way out and on its way back:
4 to 5 ms here for a task that does nothing, the whole cost of a small cell. A request from
the kernel to a worker over the client's own connection pool (TLS, the cluster's
credentials) answers in 0.3 to 0.5 ms. So for the first `distribute.direct` seconds of a
run (0.5 s), the engine sends each batch straight to a worker (`Direct.send`), which runs it
in the thread pool its tasks run in (`worker/direct.py`) and answers with the same result
blob a task returns. A small cell, 20,000 tiny items, a million of them: all of it is over
within that half-second, in a few direct round trips. A longer run goes on through the
scheduler after that, where Dask's dashboard, its work stealing and adaptive scaling see
its batches as they always did.

The first batch. A run's first result must come one item's time after its start, whatever
the items behind it do. Through the scheduler, the first batch is that item alone; sent
directly, it is a probe like the others, and its worker sends the first item's result
ahead of the answer when the batch goes on (`worker/direct.py`), on the same connection
(`_compat.worker_exchange`): the driver takes it as a `Call` of its own (``of`` the batch), before the
batch's answer, which leaves that item out.

Which workers. Only those that fit every item (a run with ``--gpus``/``--cpus`` asks the
scheduler, which counts resources), spread by their threads: a worker gets at most
`in-flight` direct batches per thread at once. And at most `MAX_WORKERS` of them: the
kernel opens a connection, with a TLS handshake, to each worker it sends to (the scheduler
has one to every worker already), so on a cluster of a thousand workers the batches beyond
those workers' slots go through the scheduler from the start, in the same top-up (and
each of those workers then gets one direct batch per thread, not `in-flight`: a batch that
would wait on a busy worker goes to an idle one through the scheduler instead). A worker is asked once per client to serve
direct batches (`worker.direct.install`, through Dask's ``run`` request); one that cannot
(nbcluster missing there, an older nbcluster) is remembered and gets Dask tasks only.

When it goes wrong, the batch goes through the scheduler instead, and the run sends every
later batch that way:
- the worker refused it (paused past its memory limit, closing): the scheduler holds the
  batch until a worker can take it;
- the request broke (the worker died, or left the cluster, which the run's watch thread
  notices within half a second: `abandon_lost`): its items run again, once, as Dask re-runs
  a task whose worker died. A crash that an item itself causes is then found by the
  engine's suspects (`engine.py`), as before.
Nothing of a batch is lost or run twice by this: a batch's items are delivered only from
its answer, and an answer that never came delivered nothing.

`Completions` is the engine's one queue of finished batches, Dask futures and direct
calls alike, in the order they finish (`distributed.as_completed` takes futures only).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from nbcluster import config
from nbcluster._compat import call_in_loop, run_on_worker, worker_call, worker_exchange
from nbcluster.worker import direct as served

#: Workers one run sends direct batches to, at most (the first by address).
MAX_WORKERS = 32
#: Per client: worker address -> True (serves direct batches), False (does not), or the
#: asyncio task asking it now. Touched only in the client's event loop.
_SERVES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


class Call:
    """One direct batch, as the engine keeps it where it keeps a Dask future.

    Attributes
    ----------
    key : str
        Its name, as a Dask key would be (``distribute-<run id>-<n>``).
    worker : str
        The worker's address.
    status : str
        ``"pending"``, ``"finished"`` (``answer`` is the result blob) or ``"error"``
        (``answer`` is why: the exception, or a refusal's reason).
    answer : Any
        See `status`.
    of : Call or None
        For the first item of a run's first batch, sent ahead of its answer
        (`worker/direct.py`): the batch it came from; None for a batch's answer.
    """

    __slots__ = ("__weakref__", "_sent", "answer", "key", "of", "status", "worker")

    def __init__(self, key: str, worker: str, of: Call | None = None):
        self.key = key
        self.worker = worker
        self.of = of
        self.status = "pending"
        self.answer: Any = None
        self._sent: Any = None  # the request (a task of the client's event loop), while it runs

    def __repr__(self) -> str:
        return f"<direct batch {self.key} on {self.worker}: {self.status}>"


class Completions:
    """The batches of one start as they finish: Dask futures and direct `Call`s in one queue.

    `add` a Dask future or `add_call` a sent call; `batches()` yields lists of those
    finished, each list all that had finished by then, until none is out; `clear()` stops
    it (the run is over: what finishes later is ignored).
    """

    def __init__(self) -> None:
        self._done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._out = 0
        self._cleared = False

    def add(self, future: Any) -> None:
        """Wait for a Dask future.

        Parameters
        ----------
        future : distributed.Future
            A batch's task.
        """
        with self._lock:
            self._out += 1
        future.add_done_callback(self._done.put)

    def add_call(self, call: Call) -> None:
        """Wait for a direct call (`Direct.send` puts it here when it is answered).

        Parameters
        ----------
        call : Call
            The call just sent.
        """
        with self._lock:
            self._out += 1

    def ahead(self, part: Call) -> None:
        """The first item of a call still out came ahead of its answer: hand it to the driver.

        Parameters
        ----------
        part : Call
            Finished, its ``of`` the call it came from.
        """
        with self._lock:
            self._out += 1
        self._done.put(part)

    def finished(self, call: Call) -> None:
        """A direct call was answered (or failed): hand it to the waiting driver.

        Parameters
        ----------
        call : Call
            The call, its status set.
        """
        self._done.put(call)

    def batches(self) -> Iterator[list[Any]]:
        """Lists of finished batches, in the order they finished, until none is out.

        Yields
        ------
        list
            Dask futures and `Call`s: the first to finish, and every other finished by then.
        """
        while True:
            with self._lock:
                if self._out <= 0 or self._cleared:
                    return
            first = self._done.get()
            if first is self:  # cleared
                return
            done = [first]
            while True:
                try:
                    more = self._done.get_nowait()
                except queue.Empty:
                    break
                if more is self:
                    return
                done.append(more)
            with self._lock:
                self._out -= len(done)
            yield done

    def clear(self) -> None:
        """Stop: `batches()` ends, and what finishes from now on is ignored."""
        with self._lock:
            self._cleared = True
        self._done.put(self)


class Direct:
    """Sends one start's direct batches; see the module docstring.

    Parameters
    ----------
    client : distributed.Client
        The run's client (its event loop sends the requests).
    workers : dict of str to int
        The workers every item fits, with their threads (`MAX_WORKERS` of them are used).
    per_thread : int
        Direct batches a worker may hold per thread (``distribute.in-flight``).
    completions : Completions
        Where each call goes when it is answered.
    """

    def __init__(self, client: Any, workers: dict[str, int], per_thread: int, completions: Completions):
        self.client = client
        chosen = sorted(workers)[:MAX_WORKERS]
        if len(chosen) < len(workers):
            per_thread = 1  # the batches a thread would queue here go to another worker's free thread
        self.slots = {address: max(1, workers[address]) * per_thread for address in chosen}
        self.out: dict[str, int] = dict.fromkeys(chosen, 0)
        self.until = time.monotonic() + config.seconds("distribute.direct")
        self.completions = completions
        self.calls: weakref.WeakSet[Call] = weakref.WeakSet()
        self.stopped = False
        self._lock = threading.Lock()  # `out`: the driver sends, the client's loop answers
        self._held: list[tuple[Call, tuple[str, bytes | None], bytes, str, int, bool]] = []  # sent, not yet started
        # Each worker starts this start's batches in the order they were sent (`worker/direct.py`).
        self.sender = uuid.uuid4().hex
        self._numbered: dict[str, int] = dict.fromkeys(chosen, 0)

    def worker(self) -> str | None:
        """The worker the next batch goes to directly, or None: send it through the scheduler.

        Returns
        -------
        str or None
            The address of the least busy worker (by its share of its slots) with a free
            slot; None once the direct time is over, after a failed call, or when every
            slot is taken.
        """
        if self.stopped or time.monotonic() >= self.until:
            return None
        known = _SERVES.get(self.client, {})
        best, load = None, 1.0
        for address, slots in self.slots.items():
            if known.get(address) is False:
                continue
            share = self.out[address] / slots
            if share < load:
                best, load = address, share
        return best

    def send(
        self, key: str, worker: str, context: tuple[str, bytes | None], blob: bytes, token: str, first: bool = False
    ) -> Call:
        """Send one batch to `worker` (from `worker()`) at the next `flush`; it reaches the
        completions when answered.

        Parameters
        ----------
        key : str
            The batch's name (``distribute-<run id>-<n>``).
        worker : str
            The worker's address.
        context, blob, token
            As a batch's task takes them (`worker.run_batch`).
        first : bool
            The run's first batch: a worker still running it after `worker.direct.AHEAD_S`
            sends its first item ahead, which reaches the completions as a `Call` of its own
            (``of`` this one) before this one's answer, which then leaves that item out.

        Returns
        -------
        Call
            The call, pending.
        """
        call = Call(key, worker)
        with self._lock:
            self.out[worker] += 1
            self.calls.add(call)
            number = self._numbered[worker]
            self._numbered[worker] = number + 1
            self._held.append((call, context, blob, token, number, first))
        self.completions.add_call(call)
        return call

    def flush(self) -> None:
        """Start the requests of the calls `send` made since the last flush: one wake of the
        client's event loop for them all (each wake is a write to its pipe, and each request
        made from another thread a future chained to a future: 0.1 ms a batch here)."""
        with self._lock:
            held, self._held = self._held, []
        if held:
            call_in_loop(self.client, self._start, held)

    def _start(self, held: list[tuple[Call, tuple[str, bytes | None], bytes, str, int, bool]]) -> None:
        # In the client's event loop.
        for call, context, blob, token, number, first in held:
            ahead = functools.partial(self._ahead, call) if first else None
            sent = asyncio.ensure_future(
                _request(self.client, call.worker, call.key, context, blob, token, self.sender, number, ahead)
            )
            call._sent = sent
            sent.add_done_callback(functools.partial(self._answered, call))

    def _ahead(self, call: Call, blob: bytes) -> None:
        # In the client's event loop: the first item of `call`, ahead of its answer.
        part = Call(call.key, call.worker, of=call)
        part.status, part.answer = "finished", blob
        self.completions.ahead(part)

    def _answered(self, call: Call, sent: Any) -> None:
        with self._lock:
            self.out[call.worker] -= 1
        call._sent = None
        try:
            answer = sent.result()
        except BaseException as e:  # the request broke, or was given up (`abandon_lost`)
            call.status, call.answer = "error", e
        else:
            refused = served.refusal(answer)
            if refused is None:
                call.status, call.answer = "finished", answer
            else:
                call.status, call.answer = "error", refused
        self.completions.finished(call)

    def failed(self, call: Call) -> None:
        """`call` broke or was refused: every later batch of this start goes through the scheduler.

        Parameters
        ----------
        call : Call
            The failed call.
        """
        self.stopped = True

    def abandon_lost(self, workers: dict[str, int]) -> None:
        """Give up the calls to workers no longer in the cluster (their answer will not come).

        Parameters
        ----------
        workers : dict of str to int
            The cluster's workers now, as the run's watch thread read them.
        """
        with self._lock:
            calls = list(self.calls)
        for call in calls:
            sent = call._sent
            if sent is not None and call.worker not in workers:
                call_in_loop(self.client, sent.cancel)  # a task of the client's loop


async def _request(
    client: Any,
    worker: str,
    key: str,
    context: Any,
    blob: bytes,
    token: str,
    sender: str,
    number: int,
    ahead: Callable[[bytes], None] | None = None,
) -> Any:
    """Ask `worker` to run the batch (installing the handler there first, once per client).

    With `ahead`, the batch is a run's first: `ahead` is called with its first item's result
    blob if that comes ahead of the answer (`worker/direct.py`).
    """
    known = _SERVES.setdefault(client, {})
    serves = known.get(worker)
    if serves is None or isinstance(serves, asyncio.Task):
        if serves is None:
            serves = known[worker] = asyncio.ensure_future(_install(client, worker))
        known[worker] = serves = await serves
    if not serves:
        return {"refused": "it cannot serve direct batches"}
    args = {"key": key, "context": context, "batch": blob, "token": token, "sender": sender, "number": number}
    if ahead is None:
        return await worker_call(client, worker, served.HANDLER, **args)
    return await worker_exchange(client, worker, {"op": served.HANDLER, "reply": True, "first": True, **args}, ahead)


async def _install(client: Any, worker: str) -> bool:
    """Whether `worker` now serves direct batches of this nbcluster's `VERSION`."""
    try:
        return bool(await run_on_worker(client, worker, served.install) == served.VERSION)
    except Exception:
        return False
