"""Reading a `%%distribute` run (`nbcluster.Results`) as a progress source.

The distribute engine pushes changes (``Results.subscribe``); the widget polls. Polling
wins here: the widget redraws at a fixed rate however fast batches land, and the engine's
driver thread never waits on the widget. So `progress_hook` only starts the widget on the
engine's first call and ignores the rest.

What is read, all through the observation surface documented in results.py: ``counts()``
and ``done`` every tick; for ``--grid`` runs ``params``, ``values()`` and ``errors`` when the
counts change; ``run_id`` to pick this run's batches (``distribute-<run id>-<n>``) out of the
cluster's task stream; ``mode`` to recognise a grid run when the caller does not say, and
``client`` (the run's Dask client), whose connection the metrics feed reuses; and, once the
run is done, ``Results._direct_keys``, the batches whose task records the final picture waits for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from nbcluster._wire import TaskRecord
from nbcluster.metrics.feed import Feed, client_feed, has_plugin
from nbcluster.widgets._progress import decorate, reported
from nbcluster.widgets._theme import THEME

logger = logging.getLogger(__name__)

GRID_MAX_ITEMS = 5000
_MISSING = object()


def is_results(obj: Any) -> bool:
    """Whether `obj` is a distribute `Results` (what `live` reads its counts and grid from).

    Parameters
    ----------
    obj : object
        Anything passed to `nbcluster.widgets.live`.

    Returns
    -------
    bool
        True for a `Results` (duck-typed: ``counts()`` and ``run_id``).
    """
    return callable(getattr(obj, "counts", None)) and hasattr(obj, "run_id")


class ResultsProgress:
    """``source()`` for the live widget over a `Results`; the grid table for grid runs."""

    def __init__(self, results: Any, grid: bool | None = None) -> None:
        self.results = results
        if grid is None:
            grid = results.mode == "grid"
        self.grid = bool(grid) and len(results) <= GRID_MAX_ITEMS
        self._params: list[dict[str, Any]] | None = None
        self._grid_key: tuple[int, ...] | None = None
        self._grid: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        c = dict(self.results.counts())
        # Results counts queued and executing items together as "running"; say "pending".
        c["pending"] = c.pop("running", 0)
        c["finished"] = bool(self.results.done)
        if c["finished"] and (direct := self.results._direct_keys):
            c["awaited"] = direct  # their records come after their answers (`Live` waits)
        if self.grid:
            key = (c["done"], c["failed"], c.get("cancelled", 0))
            if key != self._grid_key:
                self._grid_key, self._grid = key, self._grid_rows()
            c["grid"] = self._grid  # the same object while nothing changed: no re-ranking
            trials = getattr(self.results, "_trials", None)
            if trials is not None:  # a trial run ranks by its objective, or claims no order
                c["best"] = trials.objective.mode if trials.objective is not None else None
        trials = getattr(self.results, "_trials", None)
        if trials is not None and trials.series and len(self.results) <= GRID_MAX_ITEMS:
            c["curves"] = trials.curves(self.results.states, self._best())
        return c

    def _best(self) -> int | None:
        """The best trial's index, None while there is none (or no objective)."""
        try:
            return int(self.results.best().item)
        except Exception:  # no objective, or no value for it yet
            return None

    def _grid_rows(self) -> dict[str, Any]:
        if self._params is None:
            self._params = self.results.params
        failed = {e.index for e in self.results.errors}
        values = self.results.values(missing=_MISSING)
        trials = getattr(self.results, "_trials", None)  # a trial run: its objective is the value
        rows = []
        for i, (params, value) in enumerate(zip(self._params, values, strict=False)):
            row: dict[str, Any] = {"params": params}
            scored = None if trials is None else trials.objective_value(i, None if value is _MISSING else value)
            if i in failed:
                row.update(value="failed", status="error")
            elif scored is not None:
                row.update(value=scored, status="ok")
            elif value is not _MISSING:
                row.update(value=value, status="ok")
            rows.append(row)
        names = list(self._params[0]) if self._params else []
        return {"params": names, "rows": rows}


def task_filter_for(results: Any) -> Callable[[TaskRecord], bool]:
    """The task-stream filter that keeps a run's own tasks.

    Parameters
    ----------
    results : Results
        The run.

    Returns
    -------
    callable
        True for the task records whose key is one of the run's.
    """
    prefixes = (f"distribute-{results.run_id}-", f"persist-{results.run_id}-")  # batches; --persist items
    return lambda t: str(t.get("key", "")).startswith(prefixes)


def reporter_for(results: Any) -> Callable[[dict[str, Any]], None] | None:
    """Send the run's item counts to the scheduler's plugin (``nbcluster_progress``), so
    the sidebar shows items as the cell counts them.

    Parameters
    ----------
    results : Results
        The run.

    Returns
    -------
    callable or None
        ``report(counts)``; None where the run has no client (``--local``).
    """
    client = results.client
    if client is None:
        return None
    run = results.run_id
    # Sent from the client's event loop, one at a time and the newest counts only: the cell
    # no longer waits for the scheduler's reply (a round trip, 2.3 ms of every small cell
    # when its view closed), and a newer report never arrives before an older one.
    lock = threading.Lock()
    newest: list[dict[str, Any]] = []
    sending = [False]

    async def send() -> None:
        while True:
            with lock:
                if not newest:
                    sending[0] = False
                    return
                counts = newest.pop()
            try:
                await client.scheduler.nbcluster_progress(run=run, counts=counts)
            except Exception as e:  # the cluster went away: the sidebar has nothing to show
                logger.info("nbcluster: cannot report the run's progress (%s: %s)", type(e).__name__, e)

    def report(counts: dict[str, Any]) -> None:
        if not has_plugin(client):
            return
        with lock:
            newest[:] = [counts]
            if sending[0]:
                return
            sending[0] = True
        client.loop.add_callback(send)

    return report


def final_counts(results: Any, label: str | None) -> dict[str, Any]:
    """What a finished run reports to the sidebar when it never showed a view: what a
    `Live` reports as it freezes.

    Parameters
    ----------
    results : Results
        The run, finished.
    label : str or None
        Its view's label.

    Returns
    -------
    dict
        `reported` counts of the run's end.
    """
    c = results.counts()
    elapsed = (results.ended or time.time()) - results.started
    state = "cancelled" if c.get("cancelled") else "done"
    return reported(decorate(c, elapsed=elapsed, rate=None, state=state, label=label))


def feed_for(results: Any) -> Feed | None:
    """The metrics feed over the run's own Dask client, if the run has one.

    Parameters
    ----------
    results : Results
        The run.

    Returns
    -------
    Feed or None
        `nbcluster.metrics.feed.client_feed` of its client; None without one.
    """
    client = results.client
    return client_feed(client, detail=THEME["stream"]["maxLanes"]) if client is not None else None
