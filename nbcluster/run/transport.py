"""How a run's batches leave the kernel and come back: one interface, two ways out behind it.

The engine (`engine.py`) decides what to send (its `policy.Policy`); a `Transport` sends it
and hands back what finished. The engine talks to nothing else of the way out. Its verbs:

- `open` begins a start (the first run, each retry) and says whether its batches may go to
  the workers directly; `close` ends it;
- `map` submits batches as Dask tasks, in one graph message (`client.map`), keyed
  ``distribute-<run id>-<n>`` (``persist-...`` for a persisted item);
- `send_direct` sends a batch to a worker directly instead (a start's first half-second,
  where a small cell's round trip is 0.5 ms, not the scheduler's 4-5 ms), and `flush`
  starts the direct requests of one top-up together;
- `completions` yields the finished batches, futures and direct calls in one queue, in the
  order they finish (`distributed.as_completed` takes futures only); `results` reads their
  result blobs; `take` tells which items a finished batch held, and whether it ran alone;
- `stop` submits nothing more, `cancel` cancels on the scheduler what is still out, `lose`
  forgets it all (the cluster went away).

Every batch out is *pending* (its items by future, or by direct `Call`) until taken. A
`Transport` lives as long as its run.

What is where, in this module: `Transport`, with its one queue of finished batches; Dask
tasks bound to their workers (`_placing`); the direct path (`Call`, `_Direct`); results
pushed ahead of a gather (`_Inbox`); tasks that load anywhere (`task`, `halt_reason`); what
goes before the first batch (`Shipment`).

Direct batches. A batch that is a Dask task crosses the scheduler on its way out and on its
way back: 4 to 5 ms here for a task that does nothing, the whole cost of a small cell. A
request from the kernel to a worker over the client's own connection pool (TLS, the
cluster's credentials) answers in 0.3 to 0.5 ms. So for the first `distribute.direct`
seconds of a run (0.5 s), `send_direct` sends each batch straight to a worker, which runs it
in the thread pool its tasks run in (`worker/__init__.py`) and answers with the same result
blob a task returns. A small cell, 20,000 tiny items, a million of them: all of it is over
within that half-second, in a few direct round trips. A longer run goes on through the
scheduler after that, where Dask's dashboard, its work stealing and adaptive scaling see its
batches as they always did.

- The first batch. A run's first result must come one item's time after its start, whatever
  the items behind it do. Through the scheduler, the first batch is that item alone; sent
  directly, it is a probe like the others, and its worker sends the first item's result
  ahead of the answer when the batch goes on (`worker/__init__.py`), on the same connection
  (`_compat.worker_exchange`): `completions` gives it as a `Call` of its own (``of`` the
  batch), before the batch's answer, which leaves that item out.
- Which workers. Only a run whose items fit every worker goes direct (one with ``--gpus`` or
  ``--cpus`` is Dask tasks: the scheduler counts resources), spread by the workers' threads:
  a worker gets at most `in-flight` direct batches per thread at once. And at most
  `MAX_WORKERS` of them: the kernel opens a connection, with a TLS handshake, to each worker
  it sends to (the scheduler has one to every worker already), so on a cluster of a thousand
  workers the batches beyond those workers' slots go through the scheduler from the start,
  in the same top-up (and each of those workers then gets one direct batch per thread, not
  `in-flight`: a batch that would wait on a busy worker goes to an idle one through the
  scheduler instead). A worker is asked once per client to serve direct batches
  (`worker.serve`, through Dask's ``run`` request); one that cannot (nbcluster
  missing there, another nbcluster version) is remembered and gets Dask tasks only.
- When it goes wrong, the batch goes through the scheduler instead, and the start sends
  every later batch that way (`take` says it came back unrun): the worker refused it (paused
  past its memory limit, closing), and the scheduler holds the batch until a worker can take
  it; or the request broke (the worker died, or left the cluster, which the run's watch
  thread notices within half a second: `abandon_lost`), and its items run again, once, as
  Dask re-runs a task whose worker died. A crash that an item itself causes is then found by
  the engine's suspects, as before. Nothing of a batch is lost or run twice by this: a
  batch's items are delivered only from its answer, and an answer that never came delivered
  nothing.

Results without a gather. A worker pushes a small result blob (or a persisted item's report)
to the kernel as a Dask event on `PUSHED_TOPIC` just before the task ends (`worker.push`).
Events from a worker travel on the same ordered stream as its task-finished message, so by
the time the kernel sees the task done, its blob is in the client's `_Inbox`; where it is
not (a worker of another version, a blob too large, a lost event) the blob is gathered, so
a push never costs a result. The inbox keeps only the pushes of the keys a run of this
kernel expects, and forgets a run's keys when the run closes. It is opened on a run's first
Dask task: a run whose batches all went directly has nothing pushed.

Tasks that fail, not hang, on a worker without nbcluster (`task`). Dask unpickles a task as
part of the message that brings it to a worker; one that cannot import nbcluster failed
there, outside any task, lost its connection, and the batch waited forever. So a task is
sent as one ``pickle.loads`` of bytes: the message loads anywhere, and the import happens
when the task runs, where its ``ModuleNotFoundError`` halts the run in one line
(`halt_reason`). A task with Dask dependencies (the futures of `--persist` handles it reads)
keeps them as arguments Dask sees: ``dask.utils.apply(loader, [*deps])``, ``loader`` a nested
task loading the function with its other arguments.

What goes before the first batch (`Shipment`). The run's context (the cell or function and
what it captured) travels inline in every batch when small (up to `worker.context.INLINE_CONTEXT`
bytes), else is scattered once to every worker and pinned there; large captured values are
scattered once per kernel (`capture.shipments`). A scattered value every holder of which
died is sent again (`Shipment.reship`) to the worker that asked, which is alive, at most
`RESHIPS` times a run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import pickle
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dask.base import annotate

from nbcluster import config, worker
from nbcluster._compat import call_in_loop, erred_on, nested_task, run_on_worker, worker_call, worker_exchange
from nbcluster._version import __version__
from nbcluster._wire import PUSHED_TOPIC
from nbcluster.errors import ClusterUnreachable
from nbcluster.persist.handles import outcome
from nbcluster.run.capture import scatter, shipments
from nbcluster.run.target import Link, Needs
from nbcluster.worker import HANDLER, VERSION, refusal, serve

if TYPE_CHECKING:  # the job imports persisted handles, which import `outcome` from here
    from nbcluster.run.capture import Job

RESHIPS = 10  # a run sends its lost values again at most this many times
#: Workers one start sends direct batches to, at most (the first by address).
MAX_WORKERS = 32
#: Per client: worker address -> True (serves direct batches), False (does not), or the
#: asyncio task asking it now. Touched only in the client's event loop.
_SERVES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


class Transport:
    """One run's batches in flight; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id, in its batches' keys.
    """

    def __init__(self, run_id: str):
        self.run_id, self.lock, self._seq = run_id, threading.Lock(), itertools.count()
        self.pending: dict[Any, Any] = {}  # future (or direct call) -> the item indices of its batch
        self.stopping = False  # nothing more is submitted
        self.idle = threading.Event()  # set while no batch is out (and taken)
        self.idle.set()
        self._alone: Any = None  # the batch that has been the only one out since its submit
        self._completed: queue.SimpleQueue[Any] | None = None  # finished batches; itself: the start is over
        self._direct: _Direct | None = None
        self._inbox: _Inbox | None = None

    def open(self, link: Link, per_thread: int = 1, direct: bool = True) -> bool:
        """Begin a start: batches may go out; True when its batches go to workers directly.

        Parameters
        ----------
        link : Link
            The run's link, open.
        per_thread : int
            Batches a worker thread may have at once.
        direct : bool
            Whether the run's batches may go directly at all: only a run whose items fit
            every worker and read no persisted values (for ``distribute.direct`` seconds).

        Returns
        -------
        bool
            Whether a worker takes direct batches now.
        """
        completed, sending = queue.SimpleQueue[Any](), None
        if direct and link.needs == Needs() and config.seconds("distribute.direct") > 0:
            sending = _Direct(link.client, link.workers(), per_thread, completed)
        with self.lock:
            self._completed, self._direct = completed, sending
        return sending is not None and sending.worker() is not None

    def close(self) -> None:
        """End a start: what finishes from now on is ignored; nothing is expected any more."""
        with self.lock:
            self._completed = self._direct = None
            self.idle.set()
        if self._inbox is not None:
            self._inbox.forget(self.run_id)

    def map(self, client: Any, calls: Sequence[tuple[Any, ...]], batches: Sequence[Any], *, persist: bool = False,
            placed: Sequence[Sequence[str]] = (), **where: Any) -> list[Any | None]:  # fmt: skip
        """Submit each of `calls` as a Dask task, all in one graph message.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        calls : sequence of tuple
            Per task: its function (the same for all) and arguments (as `task` makes them).
        batches : sequence
            Per task: the item indices it runs.
        persist : bool
            Keys ``persist-<run id>-<n>`` (a persisted item's), not ``distribute-...``.
        placed : sequence of sequence of str
            Per task, the workers it should run on, loosely; empty, or none: anywhere.
        **where : Any
            Dask's submit keywords for every one of them.

        Returns
        -------
        list of distributed.Future or None
            The tasks' futures; Nones when stopping (nothing was submitted).
        """
        self._inbox = self._inbox or _inbox(client)
        with self.lock:
            if self.stopping:
                return [None] * len(calls)
            keys = [f"{'persist' if persist else 'distribute'}-{self.run_id}-{next(self._seq)}" for _ in calls]
            if self._inbox is not None:
                self._inbox.expect(keys)  # before the tasks can run: a push may come first
            columns = zip(*(c[1:] for c in calls), strict=True)
            with _placing(keys, placed, where):
                made = client.map(calls[0][0], *columns, key=keys, pure=False, **where)
            for future, indices in zip(made, batches, strict=True):
                self._out(future, indices)
            completed = self._completed
        if completed is not None:
            for future in made:
                future.add_done_callback(completed.put)
        return list(made)

    def send_direct(self, indices: Any, context: tuple[str, bytes | None], blob: bytes, token: str) -> bool:
        """Send one batch to a worker directly at the next `flush`; False: it must be a Dask task.

        Parameters
        ----------
        indices : sequence of int
            The batch's items.
        context : tuple of (str, bytes or None)
            The run's context key and inline blob.
        blob : bytes
            The pickled batch.
        token : str
            The start's stop token.

        Returns
        -------
        bool
            True when it was sent, or dropped because the run is stopping (its items then
            become cancelled).
        """
        with self.lock:
            if self.stopping or (sending := self._direct) is None:
                return self.stopping
            key = f"distribute-{self.run_id}-{next(self._seq)}"
            if (call := sending.send(key, context, blob, token, not self.pending)) is not None:
                self._out(call, indices)
        return call is not None

    def _out(self, batch: Any, indices: Any) -> None:
        # Under `lock`: `batch` (a future or a direct call) is pending, alone if none else is.
        self._alone = None if self.pending else batch
        self.pending[batch] = indices
        self.idle.clear()

    def flush(self) -> None:
        """Start the direct requests `send_direct` made since the last flush, together."""
        if self._direct is not None:
            self._direct.flush()

    def completions(self) -> Iterator[list[Any]]:
        """Lists of finished batches (futures and direct calls), in the order they finished,
        each all that had finished by then, until none is out.

        Yields
        ------
        list
            Dask futures and direct calls.
        """
        # Each pending batch reaches the queue once it is finished (a direct batch's first
        # item sent ahead, before it); `lose` puts the queue itself there.
        while (completed := self._completed) is not None and self.pending:
            done = [completed.get()]
            while not completed.empty():  # the only reader: what it holds, it gives
                done.append(completed.get_nowait())
            if completed in done:
                return
            yield done

    def results(self, client: Any, done: list[Any]) -> list[Any]:
        """The result blobs of the finished batches in `done`, fetched in one gather.

        A direct call's came with its answer; one its worker pushed ahead of the task's end
        needs no gather. A batch that did not finish gives its exception instead, and so
        does one whose gather failed (each is then asked alone).

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        done : list
            Finished futures and direct calls.

        Returns
        -------
        list
            Per batch, its blob or its exception.
        """
        got = {id(f): f.answer if isinstance(f, Call) else self.pushed(str(f.key)) for f in done}
        if fetch := [f for f in done if got[id(f)] is None and f.status == "finished"]:
            with contextlib.suppress(Exception):  # one of them went meanwhile: each is asked alone
                got.update({id(f): blob for f, blob in zip(fetch, client.gather(fetch), strict=True)})
        return [outcome(f) if got[id(f)] is None else got[id(f)] for f in done]

    def pushed(self, key: str) -> bytes | None:
        """What the worker of task `key` pushed ahead of its end, if it came.

        Parameters
        ----------
        key : str
            The task's key.

        Returns
        -------
        bytes or None
            Its result blob (or a persisted item's report); None when none came.
        """
        return self._inbox.take(key) if self._inbox is not None else None

    def take(self, future: Any) -> tuple[Any, bool, bool]:
        """The items of a finished batch, now no longer pending.

        Parameters
        ----------
        future : distributed.Future or Call
            A finished batch.

        Returns
        -------
        tuple of (indices or None, bool, bool)
            Its items (None when it was cancelled or withdrawn, or the first item of a batch
            no longer out); whether no other batch was out while it ran; whether it came back
            unrun from a worker asked directly (refused, or the worker died under it), in
            which case every later batch of this start is a Dask task.
        """
        with self.lock:
            if isinstance(future, Call) and future.of is not None:
                # The first item of a batch still out (`worker/__init__.py`): a batch of its own
                # now; the batch's answer leaves it out.
                if (whole := self.pending.get(future.of)) is not None:
                    self.pending[future.of] = whole[1:]
                return (None if whole is None else whole[:1]), False, False
            batch = self.pending.pop(future, None)
            alone, self._alone = self._alone is future, None
        unrun = isinstance(future, Call) and future.status != "finished"
        if unrun and self._direct is not None:
            self._direct.stopped = True
        return batch, alone, unrun

    def drained(self) -> bool:
        """Whether nothing is out any more (then `idle` is set).

        Returns
        -------
        bool
            True when no batch is pending.
        """
        with self.lock:
            if not self.pending:
                self.idle.set()
            return not self.pending

    def abandon_lost(self, workers: dict[str, int]) -> None:
        """Give up the direct calls to workers no longer in the cluster.

        Parameters
        ----------
        workers : dict of str to int
            The cluster's workers now.
        """
        with self.lock:
            lost = [c for c in self.pending if isinstance(c, Call) and c.worker not in workers]
        for call in lost:
            if (sent := call.sent) is not None:
                call_in_loop(call.client, sent.cancel)  # a task of the client's loop

    def stop(self) -> bool:
        """Submit nothing more; whether batches are still out.

        Returns
        -------
        bool
            True while some batch is pending.
        """
        with self.lock:
            self.stopping = True
            return bool(self.pending)

    def cancel(self, client: Any) -> None:
        """Stop, and cancel on the scheduler every batch still out (its items are given up).

        A direct batch cannot be cancelled: it was told the stop token, and its answer, if it
        still comes, is ignored.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        """
        if futures := [f for f in self.lose() if not isinstance(f, Call)]:
            client.cancel(futures, reason="interrupted from the notebook")

    def lose(self) -> list[Any]:
        """Stop, and forget every batch still out; those batches.

        Returns
        -------
        list
            The futures and direct calls that were pending.
        """
        with self.lock:
            self.stopping, completed = True, self._completed
            futures, self.pending = list(self.pending), {}
        if completed is not None:
            completed.put(completed)  # `completions` ends
        return futures


@contextlib.contextmanager
def _placing(keys: Sequence[str], placed: Sequence[Sequence[str]], where: dict[str, Any]) -> Iterator[None]:
    """Bind each of the tasks `keys` loosely to its workers in `placed`, within one graph message.

    Dask's submit keywords bind every task of a message to the same workers, which would cost
    a chained cell one message per worker holding its inputs. A graph's annotation may
    instead be a function of the key, which the scheduler calls for each new task: a
    mapping's own lookup, so the scheduler needs nothing of nbcluster to load it. `where` is
    updated in place when all the tasks go to the same workers.
    """
    if not any(placed):
        yield
    elif all(list(p) == list(placed[0]) for p in placed):
        where.update(workers=list(placed[0]), allow_other_workers=True)
        yield
    else:
        by_key = collections.defaultdict(list, {k: list(p) for k, p in zip(keys, placed, strict=True) if p})
        with annotate(workers=by_key.__getitem__, allow_other_workers=True):
            yield


# -- direct batches: to a worker, not through the scheduler --------------------------------
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
        (`worker/__init__.py`): the batch it came from; None for a batch's answer.
    """

    __slots__ = ("answer", "client", "key", "of", "sent", "status", "worker")

    def __init__(self, client: Any, key: str, worker: str, of: Call | None = None, answer: Any = None):
        self.client, self.key, self.worker, self.of, self.answer = client, key, worker, of, answer
        self.status = "pending" if of is None else "finished"
        self.sent: Any = None  # the request (a task of the client's event loop), while it runs


class _Direct:
    """Sends one start's direct batches; see the module docstring.

    Parameters
    ----------
    client : distributed.Client
        The run's client (its event loop sends the requests).
    workers : dict of str to int
        The workers every item fits, with their threads (`MAX_WORKERS` of them are used).
    per_thread : int
        Direct batches a worker may hold per thread (``distribute.in-flight``).
    completions : queue.SimpleQueue
        Where each call goes when it is answered, after it was counted out.
    """

    def __init__(self, client: Any, workers: dict[str, int], per_thread: int, completions: queue.SimpleQueue[Any]):
        self.client, self.completions = client, completions
        chosen = sorted(workers)[:MAX_WORKERS]
        # Past MAX_WORKERS, the batches a thread would queue here go to another worker's free thread.
        per_thread = 1 if len(chosen) < len(workers) else per_thread
        self.slots = {address: max(1, workers[address]) * per_thread for address in chosen}
        self.out = dict.fromkeys(chosen, 0)
        self.until = time.monotonic() + config.seconds("distribute.direct")
        self.stopped = False  # set by the transport after a failed call: the rest are Dask tasks
        self._lock = threading.Lock()  # `out`: the driver sends, the client's loop answers
        self._held: list[tuple[Call, dict[str, Any], bool]] = []  # sent, not yet started
        # Each worker starts this start's batches in the order they were sent (`worker/__init__.py`).
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
        free = [(self.out[a] / slots, a) for a, slots in self.slots.items()
                if self.out[a] < slots and known.get(a) is not False]  # fmt: skip
        return min(free)[1] if free else None

    def send(self, key: str, context: tuple[str, bytes | None], blob: bytes, token: str, first: bool) -> Call | None:
        """Send one batch to the worker `worker()` names at the next `flush`; None: no worker.

        Parameters
        ----------
        key : str
            The batch's name (``distribute-<run id>-<n>``).
        context, blob, token
            As a batch's task takes them (`worker.run_batch`).
        first : bool
            The run's first batch: a worker still running it after `worker.AHEAD_S`
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
            return await worker_call(self.client, call.worker, HANDLER, **args)
        message = {"op": HANDLER, "reply": True, "first": True, **args}
        return await worker_exchange(self.client, call.worker, message, functools.partial(self._ahead, call))

    def _ahead(self, call: Call, blob: bytes) -> None:
        # In the client's event loop: the first item of `call`, ahead of its answer.
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
            refused = refusal(answer)
            call.status, call.answer = ("finished", answer) if refused is None else ("error", refused)
        self.completions.put(call)


async def _install(client: Any, worker: str) -> bool:
    """Whether `worker` now serves direct batches of this nbcluster's `VERSION`."""
    try:
        return bool(await run_on_worker(client, worker, serve) == VERSION)
    except Exception:
        return False


# -- results pushed by the workers -----------------------------------------------------------
class _Inbox:
    """The blobs pushed on `PUSHED_TOPIC` to one client, kept for the keys some run expects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes | None] = {}  # by the key expected: its blob, once pushed

    def expect(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._blobs.update(dict.fromkeys(keys))

    def take(self, key: str) -> bytes | None:
        with self._lock:
            return self._blobs.pop(key, None)

    def forget(self, run_id: str) -> None:
        """Expect nothing more of run `run_id` (its keys hold ``-<run id>-``)."""
        with self._lock:
            self._blobs = {k: b for k, b in self._blobs.items() if f"-{run_id}-" not in k}

    def arrived(self, event: tuple[float, Any]) -> None:
        key, blob = event[1].get("key"), event[1].get("report")
        with self._lock:
            if isinstance(key, str) and isinstance(blob, bytes) and key in self._blobs:
                self._blobs[key] = blob


_INBOXES: weakref.WeakKeyDictionary[Any, _Inbox] = weakref.WeakKeyDictionary()
_INBOXES_LOCK = threading.Lock()


def _inbox(client: Any) -> _Inbox | None:
    """The inbox of `client`, subscribed the first time; None if it cannot subscribe (every
    blob is then gathered)."""
    with _INBOXES_LOCK:
        if client not in _INBOXES:
            with contextlib.suppress(Exception):
                found = _Inbox()
                client.subscribe_topic(PUSHED_TOPIC, found.arrived)
                _INBOXES[client] = found
        return _INBOXES.get(client)


# -- tasks that load anywhere --------------------------------------------------------------------
class _Call:
    """Pickles as ``fn(*args)``: unpickling makes the call."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]):
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return self.fn, self.args


def task(fn: Callable[..., Any], *args: Any, deps: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """``client.submit(*task(fn, *args, deps=deps))`` runs ``fn(*args, *deps)``; where `fn`
    cannot be imported, the task fails with that ImportError instead of breaking the
    worker's connection (see the module docstring).

    Parameters
    ----------
    fn : callable
        A function importable by name (a module's top-level function) where the task runs.
    *args : Any
        Its arguments: plain data, pickled with it (no Dask futures: Dask would not see them).
    deps : tuple
        Dask futures, passed last, as their values: Dask resolves them on the worker.

    Returns
    -------
    tuple
        ``(pickle.loads, the pickled call)``; with `deps`, ``(dask.utils.apply, a nested task
        loading the function with its arguments, [*deps])``.

    Examples
    --------
    >>> import operator
    >>> loads, call = task(operator.add, 2, 3)
    >>> loads(call)
    5
    """
    if deps:
        from dask.utils import apply

        loader = nested_task(pickle.loads, pickle.dumps(functools.partial(fn, *args), protocol=pickle.HIGHEST_PROTOCOL))
        return (apply, loader, list(deps))
    return (pickle.loads, pickle.dumps(_Call(fn, args), protocol=pickle.HIGHEST_PROTOCOL))


def halt_reason(client: Any, key: str, why: str) -> str:
    """The one line for a batch that could not import nbcluster: the worker it failed on and
    the fix, where the scheduler can say which worker (it has nbcluster), else the cluster's.

    Parameters
    ----------
    client : distributed.Client
        The run's client, to ask the scheduler where the task failed.
    key : str
        The failed batch's Dask key (still held, so the scheduler remembers it).
    why : str
        The import error, as one line (``ModuleNotFoundError: No module named 'nbcluster'``).

    Returns
    -------
    str
        The line the cell ends with: the worker, its address and the nbcluster version to
        install there; or that the whole cluster needs nbcluster, on its scheduler and workers.
    """
    workers = []
    with contextlib.suppress(Exception):  # a scheduler without nbcluster cannot run this: say what is known
        workers = client.run_on_scheduler(erred_on, key)
    if not workers:
        return (f"the cluster at {client.scheduler.address} cannot load nbcluster's tasks ({why}): "
                "nbcluster must be installed where its scheduler runs and on its workers")  # fmt: skip
    name, address = workers[0]
    return (f"worker {name} ({address}) cannot import nbcluster ({why}): install nbcluster {__version__} "
            "in the Python environment that runs it (as on the scheduler), or stop that worker")  # fmt: skip


# -- what goes before the first batch --------------------------------------------------------
class Shipment:
    """One run's context on the cluster; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id, in its context's key.
    """

    def __init__(self, run_id: str):
        self.key = f"nbcluster-context-{run_id}"
        self.context: tuple[str, bytes | None] | None = None  # (key, inline blob or None); None: not shipped
        self._blob, self._reships = b"", 0
        self._future: Any = None

    def ship(self, client: Any, job: Job) -> list[str]:
        """Scatter large values (once per kernel) and the context blob; report lines.

        Called before the first submit, and again by a retry after the cluster went away
        (the context is then sent afresh: `context` was reset).

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        job : Job
            What the run runs.

        Returns
        -------
        list of str
            What shipping did, for the line the cell prints (a large value sent, or one
            already on the workers from an earlier run); empty when it was shipped already.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            When the values cannot be sent (the cluster's connection failed), saying to run
            the cell again in a moment.
        """
        if self.context is not None:
            return []
        try:
            large, notes = shipments(client).ship(client, job.capture.large)
            self._blob = job.for_workers(large)
            if not (inline := len(self._blob) <= worker.context.INLINE_CONTEXT):
                self._future = self._scatter(client)
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(f"could not send the cell's data to the workers ({e}); if a worker just died, "
                                     "run the cell again in a moment") from None  # fmt: skip
        self.context = (self.key, self._blob if inline else None)
        return notes

    def _scatter(self, client: Any, workers: list[str] | None = None) -> Any:
        return scatter(client, self.key, self._blob, len(self._blob), workers)

    def reship(self, client: Any, job: Job, key: str, to: str | None) -> bool:
        """Send again a scattered value every holder of which died; False to give up.

        Sent to the worker that asked, which is alive: a broadcast could pick a dead worker
        the scheduler still lists, and wait out its connect timeout.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        job : Job
            What the run runs (its large values).
        key : str
            The lost value's key.
        to : str or None
            The worker that asked for it.

        Returns
        -------
        bool
            True when the value is on the cluster again (or never was lost).
        """
        try:
            current = self._future if key == self.key else shipments(client).future(key)
            # A value lost with all its holders shows as a cancelled future here.
            if current is not None and current.status == "finished" and client.who_has([current]).get(key):
                return True
            self._reships += 1
            if self._reships > RESHIPS:
                return False
            workers = [to] if to else None
            if key == self.key:
                self._future = self._scatter(client, workers)
                return True
            return bool(shipments(client).reship(client, key, job.capture.large, workers))
        except (OSError, TimeoutError):
            return False
