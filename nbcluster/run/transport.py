"""How a run's batches leave the kernel and come back: one interface, Dask tasks behind it.

The engine (`engine.py`) decides what to send (its `policy.Policy`); a `Transport` sends it
and hands back what finished. Its verbs:

- `map` submits batches as Dask tasks, in one graph message (`client.map`), keyed
  ``distribute-<run id>-<n>`` (``persist-...`` for a persisted item);
- `completions` yields the finished batches in the order they finish; `results` reads
  their result blobs (a small one its worker pushed ahead of the task's end, `reports.py`;
  the rest in one gather); `take` tells which items a finished batch held, and whether it
  ran alone;
- `stop` submits nothing more, `cancel` cancels on the scheduler what is still out, `lose`
  forgets it all (the cluster went away).

Every batch out is *pending* (its items by future) until taken. A `Transport` lives as long
as its run; `open` and `close` bracket each start (the first run, each retry).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from dask.base import annotate

from nbcluster.run import reports


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
        self.pending: dict[Any, Any] = {}  # future -> the item indices of its batch
        self.stopping = False  # nothing more is submitted
        self.idle = threading.Event()  # set while no batch is out (and taken)
        self.idle.set()
        self._alone: Any = None  # the batch that has been the only one out since its submit
        self._seq = itertools.count()
        self._done: queue.SimpleQueue[Any] | None = None  # this start's finished futures; None: no start
        self._inbox: reports.Inbox | None = None

    def open(self, client: Any) -> None:
        """Begin a start: batches may go out, and `completions` hands them back.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        """
        if self._inbox is None:
            self._inbox = reports.inbox(client)
        with self.lock:
            self.stopping = False
            self._done = queue.SimpleQueue()

    def close(self) -> None:
        """End a start: what finishes from now on is ignored; nothing is expected any more."""
        with self.lock:
            self._done = None
            self.pending.clear()
            self.idle.set()
        if self._inbox is not None:
            for prefix in ("persist", "distribute"):
                self._inbox.forget(f"{prefix}-{self.run_id}-")

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
            done = self._done
        if done is not None:
            for future in made:
                future.add_done_callback(done.put)
        return list(made)

    def completions(self) -> Iterator[list[Any]]:
        """Lists of finished futures, in the order they finished, until none is pending.

        Yields
        ------
        list of distributed.Future
            The first to finish, and every other finished by then.
        """
        while True:
            with self.lock:
                done = self._done
                if done is None or not self.pending:
                    return
            first = done.get()
            finished = [first]
            while first is not None and not done.empty():
                finished.append(done.get_nowait())
            if None in finished:  # `lose`: the start is over
                return
            yield finished

    def results(self, client: Any, done: list[Any]) -> list[Any]:
        """The result blobs of the finished futures in `done`, fetched in one gather.

        A small one its worker pushed ahead of its task's end (`worker/push.py`) needs no
        gather. A batch that did not finish gives its exception instead, and so does one
        whose gather failed (asked alone then).

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        done : list of distributed.Future
            Finished futures.

        Returns
        -------
        list
            Per batch, its blob or its exception.
        """
        got: dict[int, Any] = {}
        finished = [f for f in done if f.status == "finished"]
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

    def take(self, future: Any) -> tuple[Any, bool]:
        """The items of a finished batch, now no longer pending.

        Parameters
        ----------
        future : distributed.Future
            A finished batch.

        Returns
        -------
        tuple of (indices or None, bool)
            Its items (None when it was cancelled or withdrawn), and whether no other batch
            was out while it ran.
        """
        with self.lock:
            batch = self.pending.pop(future, None)
            alone, self._alone = self._alone is future, None
        return batch, alone

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
        if futures := self.lose():
            client.cancel(futures, reason="interrupted from the notebook")

    def lose(self) -> list[Any]:
        """Stop, and forget every batch still out; those batches.

        Returns
        -------
        list of distributed.Future
            The futures that were pending.
        """
        with self.lock:
            self.stopping = True
            futures = list(self.pending)
            self.pending.clear()
            if self._done is not None:
                self._done.put(None)  # ends `completions`
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
