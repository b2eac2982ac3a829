"""`--everywhere`: the cell once on each worker, as one task pinned to that worker.

The engine's strategy for a plan whose items are worker addresses (`run.py` makes it from
the workers that qualify). It shares the engine's tasks and state (submitting, taking in
a finished task, failing items: the `Tasks` below) but none of the batch driver's policy:
no batching, no backlog, no suspects. What it adds: a task pinned to a worker that leaves
the cluster would wait forever (`allow_other_workers=False`), so every second the
workers still there are read, and the item of a departed one is failed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import cloudpickle

from nbcluster import _compat
from nbcluster.worker import ErrorRecord, error_record

LOOK_S = 1.0  # how often to look for departed workers while tasks are out


class Tasks(Protocol):
    """What the strategy asks of the engine (`engine.Engine`)."""

    @property
    def client(self) -> Any:
        """The cluster's Dask client, to read which workers are still there."""

    @property
    def items(self) -> Sequence[Any]:
        """The plan's items: worker addresses."""

    @property
    def placement(self) -> dict[str, Any]:
        """The submit keywords every task of the run takes (its resources)."""

    @property
    def stopping(self) -> bool:
        """True once the run was told to stop (interrupt, cancel, or the cluster gone)."""

    def submit_task(self, indices: list[int], blob: bytes, **where: Any) -> Any | None:
        """Submit one task for `indices`, through the engine's bookkeeping.

        Parameters
        ----------
        indices : list of int
            The items the task runs (here always one).
        blob : bytes
            The pickled batch, ``(indices, items, budget)``.
        **where : Any
            Dask's submit keywords: ``workers``, ``allow_other_workers``, resources.

        Returns
        -------
        distributed.Future or None
            The task's future; None when the run is stopping and nothing was submitted.
        """

    def outstanding(self, futures: list[Any]) -> list[Any]:
        """Those of `futures` still out (not taken in, withdrawn or cancelled).

        Parameters
        ----------
        futures : list of distributed.Future
            The futures submitted so far.

        Returns
        -------
        list of distributed.Future
            Those still to be taken in.
        """

    def settle_task(self, future: Any) -> list[int]:
        """Take in a finished task: its values, errors and output.

        Parameters
        ----------
        future : distributed.Future
            A done task.

        Returns
        -------
        list of int
            Items to submit again (a batch that came back lost or stopped short).
        """

    def withdraw(self, future: Any) -> None:
        """Stop waiting for a task: the caller then fails its items or gives them up.

        Parameters
        ----------
        future : distributed.Future
            The task.
        """

    def fail(self, indices: list[int], record: ErrorRecord) -> None:
        """Record the same error for each of `indices`.

        Parameters
        ----------
        indices : list of int
            The items that failed.
        record : ErrorRecord
            Why.
        """

    def finish(self) -> None:
        """The strategy is over: nothing is out any more, and the run's state ends."""


def drive(tasks: Tasks, indices: list[int]) -> None:
    """Run item `i` on worker `tasks.items[i]`, for each of `indices`, until all are in.

    Parameters
    ----------
    tasks : Tasks
        The engine, whose tasks and state the strategy uses.
    indices : list of int
        The items to run, each naming its worker by position in `Tasks.items`.
    """
    futures: dict[Any, int] = {}
    changed = threading.Event()
    try:
        todo = list(indices)
        while True:
            for i in todo:
                blob = cloudpickle.dumps(([i], [None], None))
                where = {"workers": [tasks.items[i]], "allow_other_workers": False, **tasks.placement}
                if (future := tasks.submit_task([i], blob, **where)) is not None:
                    futures[future] = i
                    future.add_done_callback(lambda _: changed.set())
            out = tasks.outstanding(list(futures))
            if not out or tasks.stopping:
                break
            # Woken by a finished task, or once a second to look for departed workers.
            changed.wait(LOOK_S)
            changed.clear()
            todo = [i for future in out if future.done() for i in tasks.settle_task(future)]
            try:
                alive = set(_compat.workers(tasks.client))
            except Exception:
                if tasks.stopping:
                    break  # the cluster went away: the engine has ended the run
                raise
            for future in out:
                i = futures[future]
                if future.status == "pending" and tasks.items[i] not in alive:
                    tasks.withdraw(future)
                    future.cancel()
                    left = RuntimeError(f"worker {tasks.items[i]} left the cluster before running the cell")
                    tasks.fail([i], error_record(left))
    finally:
        tasks.finish()
