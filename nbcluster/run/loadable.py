"""Batches that fail, not hang, on a worker without nbcluster.

Dask unpickles a task as part of the message that brings it to a worker. A worker that
cannot import nbcluster failed there, outside any task: its connection to the scheduler
broke, the worker left, and the batch waited for another worker forever (Dask never failed
it). `task` sends the call as one ``pickle.loads`` of bytes instead: the message loads
anywhere, and the import happens when the task runs, where a failure is the task's
``ModuleNotFoundError``, which the engine turns into one line (`halt_reason`) at once.

The bytes are the call itself: ``pickle.loads`` of them imports the function by name and
calls it with the arguments (`_Call` reduces to the call), so nothing but the function's
own module is needed to run it, and nothing of this module on the worker.

A task with Dask dependencies (the futures of `--persist` handles it reads) must keep them
as arguments Dask sees, so the call cannot be all bytes: it is ``dask.utils.apply(loader,
[*deps])``, where ``loader`` is a Dask task nested in the argument, ``pickle.loads`` of the
function with its other arguments, which the worker runs first, inside the task.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import Any

from nbcluster._compat import nested_task
from nbcluster._version import __version__


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
