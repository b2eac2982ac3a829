"""The kernel side of `--persist` batches that is not the engine's: reports and placement.

A persisted item's value stays on its worker (`worker/held.py`); the kernel reads only its
report (`held_report`), and places a batch that reads persisted values where they are
(`Placement`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from nbcluster._compat import run_on_holder
from nbcluster.journal.store import Writer
from nbcluster.persist.handles import Handle, made_where, publish
from nbcluster.run.transport import outcome
from nbcluster.worker import held


def held_report(client: Any, pushed: bytes | None, future: Any, result: Any) -> Any:
    """A persisted item's report blob, read where it ran; else its task's exception.

    The worker pushed it as an event ahead of the task's end (`reports.py`): no round trip.
    Where it did not come, it is read from the worker's event loop (a task would queue
    behind the worker's next item), and failing that (the worker dropped it) made again
    from the value by a small task. A task without a value raised after its report was
    out (`worker/held.py`): its report, too large to push, is asked of the workers.

    Parameters
    ----------
    client : distributed.Client
        The run's client.
    pushed : bytes or None
        What the worker pushed for the task (`Transport.pushed`).
    future : distributed.Future
        The item's finished task.
    result : Any
        What the transport read for it (None: nothing).

    Returns
    -------
    Any
        The report blob, or the task's exception.
    """
    if pushed is not None:
        return pushed
    key = str(future.key)
    if future.status == "error":
        with contextlib.suppress(Exception):
            for said in client.run(held.report_of, key, on_error="return").values():
                if isinstance(said, bytes):
                    return said
    if future.status != "finished":
        return result if result is not None else outcome(future)
    with contextlib.suppress(Exception):
        report = run_on_holder(client, key, held.report_of, key)
        if report is not None:
            return report
    return outcome(client.submit(held.report_for, future, pure=False))


def handle_of(
    future: Any, indices: Sequence[int], described: list[Any], errors: dict[int, Any], ran_on: tuple[str, str] | None
) -> list[Any]:
    """The handle of a persisted item that has a value: its task's own future and key.

    Parameters
    ----------
    future : distributed.Future
        The item's task.
    indices : sequence of int
        The batch's one item.
    described : list of HeldValue or None
        The worker's description of the value.
    errors : dict of int to ErrorRecord
        The batch's failures, by position.
    ran_on : tuple of (str, str) or None
        The worker that ran it: (address, name).

    Returns
    -------
    list of Handle or None
        One entry per described value: the handle, or None where the item has no value (its
        task raised, or ran nothing; the future then goes with the caller's frame).
    """
    if not described or 0 in errors or described[0] is None:
        return [None] * len(described)
    return [Handle(future, described[0], indices[0], made_on=ran_on[0] if ran_on else None)]


def published(client: Any, made: list[Handle], prefix: str, journal: Writer | None) -> str | None:
    """Keep a journaled run's new values on the cluster past this kernel (`handles.publish`).

    Parameters
    ----------
    client : distributed.Client
        The run's client.
    made : list of Handle
        A delivered batch's new handles.
    prefix : str
        The run's dataset prefix.
    journal : Writer or None
        The run's journal, let go of when the cluster will not keep the values.

    Returns
    -------
    str or None
        `prefix`; None when the cluster would not keep them (one line says so: the run goes
        on, unjournaled, since a journal must never break a cell).
    """
    try:
        publish(client, made, prefix)
    except Exception as e:
        if journal is not None:
            journal.release()
        print(f"nbcluster: the cluster would not keep this run's values for --resume ({type(e).__name__}: {e}): "
              "the run goes on without a journal", file=sys.stderr)  # fmt: skip
        return None
    return prefix


class Placement:
    """Where the handles a run reads are: asked once per start, for all of them."""

    def __init__(self) -> None:
        self._placed: dict[Any, list[str]] | None = None

    def of(self, client: Any, items: Sequence[Any], deps: Sequence[Any]) -> list[str]:
        """Where a batch reading the handles `deps` should run: a hint.

        Dask may still run it elsewhere (`allow_other_workers`), and moves the value then.
        A handle made in this kernel knows the worker that made it (`Handle.made_on`), and
        Dask keeps a value there until that worker goes (then the hint names no live worker,
        and Dask places the batch itself): nothing is asked, which was a round trip before
        the first item of every chained cell could go out. Only the others (handles adopted
        from a journal) are asked of the scheduler, in one round trip.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        items : sequence
            The plan's items (the handles among them are looked up at the first call).
        deps : sequence of distributed.Future
            The futures of the handles the batch reads.

        Returns
        -------
        list of str
            The workers holding the first of them that has a known holder; empty for none.
        """
        if not deps:
            return []
        if self._placed is None:
            known, unknown = made_where(items)
            self._placed = known
            if unknown:
                with contextlib.suppress(Exception):  # the scheduler busy or gone: let Dask place them
                    self._placed.update({k: list(v) for k, v in client.who_has(unknown).items()})
        for f in deps:
            if self._placed.get(f.key):
                return self._placed[f.key]
        return []
