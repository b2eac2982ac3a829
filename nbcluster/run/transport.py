"""How a run's batches leave the kernel and come back: one interface, Dask tasks behind it.

The engine (`engine.py`) decides what to send (its `policy.Policy`); a `Transport` sends it
and hands back what finished. Its verbs:

- `map` submits batches as Dask tasks, in one graph message (`client.map`), keyed
  ``distribute-<run id>-<n>`` (``persist-...`` for a persisted item);
- `completions` yields the finished batches in the order they finish; `results` reads
  their result blobs (a small one its worker pushed ahead of the task's end, `reports.py`;
  the rest in one gather); `take` tells which items a finished batch held, and whether it
  ran alone;
- `stop` submits nothing more and tells every worker the start's stop token (`token`:
  each running batch then returns after its current item), `cancel` cancels on the
  scheduler what is still out, `lose` forgets it all (the cluster went away).

Every batch out is *pending* (its items by future) until taken. A `Transport` lives as long
as its run; `open` and `close` bracket each start (the first run, each retry).

Batches that fail, not hang, on a worker without nbcluster (`task`). Dask unpickles a task
as part of the message that brings it to a worker; a worker that cannot import nbcluster
failed there, outside any task, its connection broke, and the batch waited for another
worker forever. So a task is sent as one ``pickle.loads`` of bytes that makes the call
(`_Call`): the message loads anywhere, the import happens when the task runs, and its
``ModuleNotFoundError`` becomes one line (`halt_reason`). A task with Dask dependencies (the
futures of `--persist` handles it reads) keeps them as arguments Dask sees: it is
``dask.utils.apply(loader, [*deps])``, ``loader`` a nested task loading the function with its
other arguments.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import pickle
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dask.base import annotate

from nbcluster import _threads as threads
from nbcluster._compat import nested_task
from nbcluster._version import __version__
from nbcluster.run import reports
from nbcluster.worker import stop_run

_STARTS = itertools.count(1)  # each start's stop token is the run's id and one of these


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
        self.token = ""  # this start's stop token (`worker.stop_run`)
        self.told = threading.Event()  # set once every worker has been told `token`
        self._alone: Any = None  # the batch that has been the only one out since its submit
        self._seq = itertools.count()
        self._done: queue.SimpleQueue[Any] | None = None  # this start's finished futures; None: no start
        self._inbox: reports.Inbox | None = None

    def open(self, client: Any) -> None:
        """Begin a start, with a stop token of its own: batches may go out, and `completions`
        hands them back.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        """
        self._inbox = self._inbox or reports.inbox(client)
        with self.lock:
            self.stopping = False
            self.token = f"{self.run_id}-{next(_STARTS)}"
            self.told.clear()
            self._done = queue.SimpleQueue()

    def close(self) -> None:
        """End a start: what finishes from now on is ignored; nothing is expected any more."""
        with self.lock:
            self._done = None
            self.pending.clear()
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
        finished = [f for f in done if f.status == "finished"]
        got: dict[int, Any] = {id(f): blob for f in finished if (blob := self.pushed(str(f.key))) is not None}
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
        """Whether nothing is out any more.

        Returns
        -------
        bool
            True when no batch is pending.
        """
        return not self.pending  # one read of a dict: no lock needed

    def stop(self, client: Any) -> bool:
        """Submit nothing more, and tell every worker the stop token; whether batches are out.

        The workers are told from a thread of its own, only while batches are out: a worker
        that hangs must not hold the kernel (`told` is set once they all answered, or failed to).

        Parameters
        ----------
        client : distributed.Client
            The run's client.

        Returns
        -------
        bool
            True while some batch is pending.
        """
        with self.lock:
            self.stopping = True
            out = bool(self.pending)
        if out:
            threads.spawn(self._tell, client, self.token, name="nbcluster-stop")
        return out

    def _tell(self, client: Any, token: str) -> None:
        # If the cluster is gone, the scheduler-side cancel is all that is left to do.
        with contextlib.suppress(Exception):
            client.run(stop_run, token, on_error="return")
        self.told.set()

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


class _Call:
    """Pickles as ``fn(*args)``: unpickling makes the call."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]):
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return self.fn, self.args


def task(fn: Callable[..., Any], *args: Any, deps: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """``client.submit(*task(fn, *args, deps=deps))`` runs ``fn(*args, *deps)``; where `fn`
    cannot be imported, the task fails with that ImportError instead of breaking the
    worker's connection.

    Parameters
    ----------
    fn : callable
        A function importable by name (a module's top-level function) where the task runs.
    *args : Any
        Its arguments: plain data, pickled with it (no Dask futures: Dask would not see
        them inside).
    deps : tuple
        Dask futures, passed last, as their values: Dask resolves them on the worker.

    Returns
    -------
    tuple
        ``(pickle.loads, the pickled call)``: what `client.submit` takes as the function and
        its one argument; with `deps`, ``(dask.utils.apply, a nested task loading the function
        with its arguments, [*deps])``.

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


def _erred_on(key: str, dask_scheduler: Any = None) -> list[tuple[str, str]]:
    """(name, address) of the workers `key` failed on (run on the scheduler)."""
    ts = dask_scheduler.tasks.get(key)
    where = sorted(getattr(ts, "erred_on", None) or ()) if ts is not None else []
    return [(str(getattr(dask_scheduler.workers.get(a), "name", a)), a) for a in where]


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
        install there; or, where the scheduler cannot say (it lacks nbcluster itself), that
        the whole cluster needs nbcluster, on its scheduler and its workers.
    """
    try:
        workers = client.run_on_scheduler(_erred_on, key)
    except Exception:  # a scheduler without nbcluster cannot run this: say what is known
        workers = []
    if not workers:
        return (
            f"the cluster at {client.scheduler.address} cannot load nbcluster's tasks ({why}): "
            "nbcluster must be installed where its scheduler runs and on its workers"
        )
    name, address = workers[0]
    return (
        f"worker {name} ({address}) cannot import nbcluster ({why}): install nbcluster {__version__} "
        "in the Python environment that runs it (as on the scheduler), or stop that worker"
    )
