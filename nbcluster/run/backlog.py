"""A run's held-back work, told to the scheduler for the adaptive target.

The scheduler sees only the batches out, never the backlog in the kernel, so a running
run's watch thread reports its backlog every half second (`nbcluster_backlog`: items left
and their expected seconds), where the adaptive target counts it as queued work
(`cluster/adaptive.py`). A cluster without that handler (a scheduler nbcluster did not
start) answers the first report with an error, and gets no more.
"""

from __future__ import annotations

import contextlib
from typing import Any

import dask.config
from dask.utils import parse_timedelta


class BacklogReport:
    """One run's backlog reports; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id, as the scheduler keys its reports.
    """

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.taken = True  # the scheduler takes backlog reports (until it refuses one)
        self.holding = False  # the last report sent said items were held back

    def send(self, client: Any, needs: Any, items: int, per_item: float | None) -> None:
        """Tell the scheduler the run holds `items` back (from the client's event loop).

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        needs : target.Needs
            What each item asks of a worker (GPU work is counted apart).
        items : int
            Items not submitted yet.
        per_item : float or None
            Mean seconds an item took so far; None before any was measured.
        """
        if not self.taken:
            return
        kind = "gpu" if needs.gpus else "cpu"
        if per_item is None:  # nothing measured yet: what Dask assumes of an unknown task
            per_item = float(parse_timedelta(dask.config.get("distributed.scheduler.unknown-task-duration")))
        self.holding = items > 0

        async def report() -> None:
            try:
                await client.scheduler.nbcluster_backlog(
                    run=self.run_id, kind=kind, items=items, seconds=items * per_item
                )
            except Exception:  # not nbcluster's scheduler (or gone): stop asking it
                self.taken = False

        with contextlib.suppress(Exception):
            client.loop.add_callback(report)

    def withdraw(self, client: Any, needs: Any) -> None:
        """Nothing is held back any more: say so, if an earlier report said otherwise.

        A run over before the watch thread's first report (every small cell) told the
        scheduler nothing, and has nothing to withdraw.

        Parameters
        ----------
        client : distributed.Client or None
            The run's client (None once its cluster went away).
        needs : target.Needs
            What each item asks of a worker.
        """
        if self.holding and self.taken and client is not None:
            self.send(client, needs, 0, 0.0)
