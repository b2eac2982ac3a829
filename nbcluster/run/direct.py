"""Direct batches, kernel side: a run's first batches go to a worker, not through the scheduler.

The direct path of `transport.py`, behind its interface: the engine never calls this module.

Why. A batch that is a Dask task crosses the scheduler on its way out and on its way back:
4 to 5 ms here for a task that does nothing, the whole cost of a small cell. A request from
the kernel to a worker over the client's own connection pool (TLS, the cluster's
credentials) answers in 0.3 to 0.5 ms. So for the first `distribute.direct` seconds of a
run (0.5 s), the transport sends each batch straight to a worker (`Direct.send`), which runs it
in the thread pool its tasks run in (`worker/direct.py`) and answers with the same result
blob a task returns. A small cell, 20,000 tiny items, a million of them: all of it is over
within that half-second, in a few direct round trips. A longer run goes on through the
scheduler after that, where Dask's dashboard, its work stealing and adaptive scaling see
its batches as they always did.

The first batch. A run's first result must come one item's time after its start, whatever
the items behind it do. Through the scheduler, the first batch is that item alone; sent
directly, it is a probe like the others, and its worker sends the first item's result
ahead of the answer when the batch goes on (`worker/direct.py`), on the same connection
(`_compat.worker_exchange`): the driver takes it as a `Call` of its own (``of`` the batch),
before the batch's answer, which leaves that item out.

Which workers. Only a run whose items fit every worker goes direct (one with ``--gpus`` or
``--cpus`` is Dask tasks: the scheduler counts resources), spread by the workers' threads: a
worker gets at most `in-flight` direct batches per thread at once. And at most `MAX_WORKERS`
of them: the kernel opens a connection, with a TLS handshake, to each worker it sends to
(the scheduler has one to every worker already), so on a cluster of a thousand workers the
batches beyond those workers' slots go through the scheduler from the start, in the same
top-up (and each of those workers then gets one direct batch per thread, not `in-flight`: a
batch that would wait on a busy worker goes to an idle one through the scheduler instead).
A worker is asked once per client to serve direct batches (`worker.direct.install`, through
Dask's ``run`` request); one that cannot (nbcluster missing there, another nbcluster
version) is remembered and gets Dask tasks only.

When it goes wrong, the batch goes through the scheduler instead, and the run sends every
later batch that way:
- the worker refused it (paused past its memory limit, closing): the scheduler holds the
  batch until a worker can take it;
- the request broke (the worker died, or left the cluster, which the run's watch thread
  notices within half a second: `Transport.abandon_lost`): its items run again, once, as Dask re-runs
  a task whose worker died. A crash that an item itself causes is then found by the
  engine's suspects (`engine.py`), as before.
Nothing of a batch is lost or run twice by this: a batch's items are delivered only from
its answer, and an answer that never came delivered nothing.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
import weakref
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
    """One direct batch, kept where the engine keeps a Dask future.

    Attributes
    ----------
    client : distributed.Client
        The client whose event loop sends it.
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

    __slots__ = ("answer", "client", "key", "of", "sent", "status", "worker")

    def __init__(self, client: Any, key: str, worker: str, of: Call | None = None, answer: Any = None):
        self.client, self.key, self.worker, self.of, self.answer = client, key, worker, of, answer
        self.status = "pending" if of is None else "finished"
        self.sent: Any = None  # the request (a task of the client's event loop), while it runs


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
    completions : Any
        Where each call goes when it is answered: its ``put(call)``, after ``expect()``
        counted it out (`transport._Completions`).
    """

    def __init__(self, client: Any, workers: dict[str, int], per_thread: int, completions: Any):
        self.client = client
        chosen = sorted(workers)[:MAX_WORKERS]
        if len(chosen) < len(workers):
            per_thread = 1  # the batches a thread would queue here go to another worker's free thread
        self.slots = {address: max(1, workers[address]) * per_thread for address in chosen}
        self.out = dict.fromkeys(chosen, 0)
        self.until = time.monotonic() + config.seconds("distribute.direct")
        self.completions = completions
        self.stopped = False  # set by the transport after a failed call: the rest are Dask tasks
        self._lock = threading.Lock()  # `out`: the driver sends, the client's loop answers
        self._held: list[tuple[Call, dict[str, Any], bool]] = []  # sent, not yet started
        # Each worker starts this start's batches in the order they were sent (`worker/direct.py`).
        self.sender = uuid.uuid4().hex
        self._numbered = dict.fromkeys(chosen, 0)

    def worker(self) -> str | None:
        """The worker the next batch goes to directly, or None: send it through the scheduler.

        Returns
        -------
        str or None
            The least busy worker (by its share of its slots) with a free slot; None once the
            direct time is over, after a failed call, or when every slot is taken.
        """
        if self.stopped or time.monotonic() >= self.until:
            return None
        known = _SERVES.get(self.client, {})
        best, load = None, 1.0
        for address, slots in self.slots.items():
            if known.get(address) is not False and (share := self.out[address] / slots) < load:
                best, load = address, share
        return best

    def send(self, key: str, context: tuple[str, bytes | None], blob: bytes, token: str, first: bool) -> Call | None:
        """Send one batch to the worker `worker()` names at the next `flush`; None: no worker.

        Parameters
        ----------
        key : str
            The batch's name (``distribute-<run id>-<n>``).
        context, blob, token
            As a batch's task takes them (`worker.run_batch`).
        first : bool
            The run's first batch: a worker still running it after `worker.direct.AHEAD_S`
            sends its first item ahead, which reaches the completions as a `Call` of its own
            (``of`` this one) before this one's answer, which then leaves that item out.

        Returns
        -------
        Call or None
            The call, pending; None when no worker takes a direct batch now (see `worker`).
        """
        if (worker := self.worker()) is None:
            return None
        call = Call(self.client, key, worker)
        with self._lock:
            self.out[worker] += 1
            number, self._numbered[worker] = self._numbered[worker], self._numbered[worker] + 1
            args = {"key": key, "context": context, "batch": blob, "token": token, "sender": self.sender, "number": number}
            self._held.append((call, args, first))
        self.completions.expect()
        return call

    def flush(self) -> None:
        """Start the requests `send` held since the last flush, in one wake of the client's
        event loop (each wake is a write to its pipe)."""
        with self._lock:
            held, self._held = self._held, []
        if held:
            call_in_loop(self.client, self._start, held)

    def _start(self, held: list[tuple[Call, dict[str, Any], bool]]) -> None:
        # In the client's event loop.
        for call, args, first in held:
            call.sent = asyncio.ensure_future(self._request(call, args, first))
            call.sent.add_done_callback(functools.partial(self._answered, call))

    async def _request(self, call: Call, args: dict[str, Any], first: bool) -> Any:
        """Ask the worker to run the batch, installing the handler there first (once per client)."""
        known = _SERVES.setdefault(self.client, {})
        if (serves := known.get(call.worker)) is None:
            serves = known[call.worker] = asyncio.ensure_future(_install(self.client, call.worker))
        if isinstance(serves, asyncio.Future):
            serves = known[call.worker] = await serves
        if not serves:
            return {"refused": "it cannot serve direct batches"}
        if not first:
            return await worker_call(self.client, call.worker, served.HANDLER, **args)
        message = {"op": served.HANDLER, "reply": True, "first": True, **args}
        return await worker_exchange(self.client, call.worker, message, functools.partial(self._ahead, call))

    def _ahead(self, call: Call, blob: bytes) -> None:
        # In the client's event loop: the first item of `call`, ahead of its answer.
        self.completions.expect()
        self.completions.put(Call(self.client, call.key, call.worker, of=call, answer=blob))

    def _answered(self, call: Call, sent: Any) -> None:
        with self._lock:
            self.out[call.worker] -= 1
        call.sent = None
        try:
            answer = sent.result()
        except BaseException as e:  # the request broke, or was given up (`abandon_lost`)
            call.status, call.answer = "error", e
        else:
            refused = served.refusal(answer)
            call.status, call.answer = ("finished", answer) if refused is None else ("error", refused)
        self.completions.put(call)


async def _install(client: Any, worker: str) -> bool:
    """Whether `worker` now serves direct batches of this nbcluster's `VERSION`."""
    try:
        return bool(await run_on_worker(client, worker, served.install) == served.VERSION)
    except Exception:
        return False
