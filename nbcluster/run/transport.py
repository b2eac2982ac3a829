"""How a run's batches leave the kernel and come back: one interface, Dask tasks behind it.

The engine (`engine.py`) decides what to send (its `policy.Policy`); a `Transport` sends it
and hands back what finished. Its verbs:

- `map` submits batches as Dask tasks, in one graph message (`client.map`), keyed
  ``distribute-<run id>-<n>`` (``persist-...`` for a persisted item);
- `send_direct` sends a batch to a worker directly instead (`direct.py`: a start's first
  half-second, where a small cell's round trip is 0.5 ms, not the scheduler's 4-5 ms);
- `completions` yields the finished batches, futures and direct calls in one queue, in the
  order they finish; `results` reads their result blobs (a direct call's came with it, a
  small task's was pushed by its worker ahead of the task's end, the rest is gathered in one
  call); `take` tells which items a finished batch held, and whether it ran alone;
- `stop` submits nothing more, `cancel` cancels on the scheduler what is still out, `lose`
  forgets it all (the cluster went away).

Every batch out is *pending* (its items by future) until taken. A `Transport` lives as long
as its run; `open` and `close` bracket each start (the first run, each retry).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from dask.base import annotate

from nbcluster.run import direct, reports


class Transport:
    """One run's batches in flight; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id, in its batches' keys.
    """

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.lock = threading.Lock()
        self.pending: dict[Any, Any] = {}  # future (or direct call) -> the item indices of its batch
        self.stopping = False  # nothing more is submitted
        self.idle = threading.Event()  # set while no batch is out (and taken)
        self.idle.set()
        self._alone: Any = None  # the batch that has been the only one out since its submit
        self._seq = itertools.count()
        self._completed: direct.Completions | None = None
        self._direct: direct.Direct | None = None
        self._inbox: reports.Inbox | None = None

    # -- a start -----------------------------------------------------------------------------
    def open(self, client: Any, direct_to: dict[str, int] | None = None, per_thread: int = 1) -> bool:
        """Begin a start: batches may go out; True when its batches go to workers directly.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        direct_to : dict of str to int, optional
            The workers (and their threads) that may take batches directly (`direct.py`);
            None sends every batch through the scheduler.
        per_thread : int
            Direct batches a worker thread may have at once.

        Returns
        -------
        bool
            Whether a worker takes direct batches now.
        """
        if self._inbox is None:
            self._inbox = reports.inbox(client)
        completed = direct.Completions()
        sending = direct.Direct(client, direct_to, per_thread, completed) if direct_to is not None else None
        with self.lock:
            self.stopping = False
            self._completed, self._direct = completed, sending
        return sending is not None and sending.worker() is not None

    def close(self) -> None:
        """End a start: what finishes from now on is ignored; nothing is expected any more."""
        with self.lock:
            self._completed = None
            self._direct = None
            self.idle.set()
        if self._inbox is not None:
            for prefix in ("persist", "distribute"):
                self._inbox.forget(f"{prefix}-{self.run_id}-")

    # -- out ---------------------------------------------------------------------------------------
    def map(
        self, client: Any, calls: Sequence[tuple[Any, ...]], batches: Sequence[Any], *, persist: bool = False,
        placed: Sequence[Sequence[str]] = (), **where: Any,
    ) -> list[Any | None]:  # fmt: skip
        """Submit each of `calls` as a Dask task, all in one graph message.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        calls : sequence of tuple
            Per task: its function (the same for all) and arguments.
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
        if not calls:
            return []
        prefix = "persist" if persist else "distribute"
        with self.lock:
            if self.stopping:
                return [None] * len(calls)
            keys = [f"{prefix}-{self.run_id}-{next(self._seq)}" for _ in calls]
            if self._inbox is not None:
                for key in keys:
                    self._inbox.expect(key)  # before the task can run: its push may come first
            # One `client.map`: one graph message, however many tasks (the function is the
            # same for all) and however many workers they are bound for.
            columns = zip(*(c[1:] for c in calls), strict=True)
            with _placing(keys, placed, where):
                made = client.map(calls[0][0], *columns, key=keys, pure=False, **where)
            for future, indices in zip(made, batches, strict=True):
                self._alone = None if self.pending else future
                self.pending[future] = indices
            self.idle.clear()
            completed = self._completed
        if completed is not None:
            for future in made:
                completed.add(future)
        return list(made)

    def send_direct(self, indices: Any, context: tuple[str, bytes | None], blob: bytes, token: str) -> bool:
        """Send one batch to a worker directly; False: it must go through the scheduler.

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
        sending = self._direct
        address = sending.worker() if sending is not None else None
        if sending is None or address is None:
            return False
        with self.lock:
            if self.stopping:
                return True
            key = f"distribute-{self.run_id}-{next(self._seq)}"
            call = sending.send(key, address, context, blob, token, first=not self.pending)
            self._alone = None if self.pending else call
            self.pending[call] = indices
            self.idle.clear()
        return True

    def flush(self) -> None:
        """Start the direct requests of this top-up, together."""
        if self._direct is not None:
            self._direct.flush()

    # -- back --------------------------------------------------------------------------------------
    def completions(self) -> Iterator[list[Any]]:
        """Lists of finished batches, in the order they finished, until none is out.

        Yields
        ------
        list
            Dask futures and direct calls.
        """
        completed = self._completed
        if completed is not None:
            yield from completed.batches()

    def results(self, client: Any, done: list[Any]) -> list[Any]:
        """The result blobs of the finished batches in `done`, fetched in one gather.

        A direct call's came with its answer; a small one a worker pushed ahead of its
        task's end (`worker.push`) needs no gather. A batch that did not finish gives its
        exception instead, and so does one whose gather failed (asked alone then).

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
        got: dict[int, Any] = {id(f): f.answer for f in done if isinstance(f, direct.Call)}
        finished = [f for f in done if f.status == "finished" and id(f) not in got]
        for f in finished:
            if (pushed := self.pushed(str(f.key))) is not None:
                got[id(f)] = pushed
        if fetch := [f for f in finished if id(f) not in got]:
            with contextlib.suppress(Exception):  # one of them went meanwhile: each is asked alone
                got.update({id(f): blob for f, blob in zip(fetch, client.gather(fetch), strict=True)})
        return [got[id(f)] if id(f) in got else outcome(f) for f in done]

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
        return self._inbox.take(key, 0.0) if self._inbox is not None else None

    def take(self, future: Any) -> tuple[Any, bool, bool]:
        """The items of a finished batch, now no longer pending.

        Parameters
        ----------
        future : distributed.Future or direct.Call
            A finished batch.

        Returns
        -------
        tuple of (indices or None, bool, bool)
            Its items (None when it was cancelled or withdrawn, or the first item of a batch
            no longer out); whether no other batch was out while it ran; whether it came back
            unrun from a worker asked directly (refused, or the worker died under it), in
            which case every later batch of this start goes through the scheduler.
        """
        with self.lock:
            if isinstance(future, direct.Call) and future.of is not None:
                # The first item of a batch still out (`worker/direct.py`): a batch of its own now;
                # the batch's answer leaves it out.
                whole = self.pending.get(future.of)
                if whole is None:
                    return None, False, False
                batch, self.pending[future.of] = whole[:1], whole[1:]
                return batch, False, False
            batch = self.pending.pop(future, None)
            alone, self._alone = self._alone is future, None
        unrun = isinstance(future, direct.Call) and future.status != "finished"
        if unrun and self._direct is not None:
            self._direct.failed(future)
        return batch, alone, unrun

    def drained(self) -> bool:
        """Whether nothing is out any more (then `idle` is set).

        Returns
        -------
        bool
            True when no batch is pending.
        """
        with self.lock:
            if self.pending:
                return False
            self.idle.set()
            return True

    def abandon_lost(self, workers: dict[str, int]) -> None:
        """Give up the direct calls to workers no longer in the cluster.

        Parameters
        ----------
        workers : dict of str to int
            The cluster's workers now.
        """
        sending = self._direct
        if sending is not None:
            sending.abandon_lost(workers)

    # -- stopping ----------------------------------------------------------------------------------
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

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        """
        futures = self.lose()
        # A direct batch cannot be cancelled: it was told the stop token, and its answer, if
        # it still comes, is ignored.
        futures = [f for f in futures if not isinstance(f, direct.Call)]
        if futures:
            client.cancel(futures, reason="interrupted from the notebook")

    def lose(self) -> list[Any]:
        """Stop, and forget every batch still out; those batches.

        Returns
        -------
        list
            The futures and direct calls that were pending.
        """
        with self.lock:
            self.stopping = True
            futures = list(self.pending)
            self.pending.clear()
            completed = self._completed
        if completed is not None:
            completed.clear()
        return futures


@contextlib.contextmanager
def _placing(keys: Sequence[str], placed: Sequence[Sequence[str]], where: dict[str, Any]) -> Iterator[None]:
    """Bind each of the tasks `keys` loosely to its workers in `placed`, within one graph message.

    Dask's submit keywords bind every task of a message to the same workers, which cost a
    chained cell one message per worker holding its inputs (~1.5 ms of the scheduler's time
    each: a thousand at a thousand workers). A graph's annotation may instead be a function
    of the key, which the scheduler calls for each new task: a mapping's own lookup, so the
    scheduler needs nothing of nbcluster to load it. `where` is updated in place when all the
    tasks go to the same workers.
    """
    if not any(placed):
        yield
        return
    if all(list(p) == list(placed[0]) for p in placed):
        where.update(workers=list(placed[0]), allow_other_workers=True)
        yield
        return
    by_key = collections.defaultdict(list, {k: list(p) for k, p in zip(keys, placed, strict=True) if p})
    with annotate(workers=by_key.__getitem__, allow_other_workers=True):
        yield


def outcome(future: Any) -> Any:
    """What as_completed(with_results=True) would give: the blob, or the exception.

    Parameters
    ----------
    future : distributed.Future
        A finished task.

    Returns
    -------
    Any
        Its result, or the exception it raised.
    """
    try:
        return future.result()
    except BaseException as e:
        return e
