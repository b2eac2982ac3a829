"""What a run sends the cluster before its first batch: its context, and its large values.

A run's *context* (the cell or function, what it captured: `capture.Job.for_workers`) travels
inline in every batch when it is small (up to `worker.INLINE_CONTEXT` bytes), else is
scattered once to every worker under ``nbcluster-context-<run id>`` and pinned there. Large
captured values are scattered once per kernel and reused by later runs (`capture.shipments`).

A scattered value every holder of which died is sent again (`reship`) to the worker that
asked, which is alive; the others fetch it from there. Broadcasting could pick a dead
worker the scheduler still lists, and wait out its connect timeout. Batches that were
already running report the loss too: once the value is back they are simply submitted
again. A run sends again at most `RESHIPS` times.
"""

from __future__ import annotations

from typing import Any

from nbcluster import worker
from nbcluster.errors import ClusterUnreachable
from nbcluster.run.capture import Job, pin_soon, shipments

RESHIPS = 10  # a run sends its lost values again at most this many times


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
        self._blob = b""
        self._future: Any = None
        self._reships = 0

    def ship(self, client: Any, job: Job) -> list[str]:
        """Scatter large values (cached) and the context blob; report lines.

        Called on the kernel's main thread before the first submit, and again by a retry
        after the cluster went away (the context is then sent afresh: `context` was reset).

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
            blob = job.for_workers(large)
            self._blob = blob
            if len(blob) > worker.INLINE_CONTEXT:
                self._future = self._scatter(client)
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(
                f"could not send the cell's data to the workers ({e}); if a worker just died, "
                "run the cell again in a moment"
            ) from None
        self.context = (self.key, blob if len(blob) <= worker.INLINE_CONTEXT else None)
        return notes

    def _scatter(self, client: Any, workers: list[str] | None = None) -> Any:
        future = client.scatter({self.key: self._blob}, workers=workers, broadcast=workers is None, hash=False)[self.key]
        pin_soon(client, future, len(self._blob))
        return future

    def reship(self, client: Any, job: Job, key: str, to: str | None) -> bool:
        """Send again a scattered value every holder of which died; False to give up.

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
