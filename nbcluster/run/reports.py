"""Reports of `--persist` batches, pushed by their workers, so the kernel asks for none.

A persisted batch keeps its values on its worker (`worker/held.py`); the kernel needs only
its report (errors, output, timings, a description of each value). Reading it took a round
trip per batch (`_compat.run_on_holder`: kernel to scheduler to worker and back), made by
the run's one driver thread while the workers waited for their next batch: most of what a
`--persist` cell cost over hand-written futures.

So the worker pushes the report instead, as a Dask event (`Worker.log_event` on `TOPIC`)
sent just before the batch's task ends. Events from a worker travel on the same ordered
stream as its task-finished message, and the scheduler forwards both to the client in that
order: by the time the kernel sees the batch done, its report is in this module's `Inbox`.
Nothing depends on that. `Inbox.take` waits a moment for a report that is late, and without
one the engine reads it the old way, so a worker or scheduler of another nbcluster version,
a report over `push.LARGEST` bytes, or a lost event costs a round trip, never a result.

The scheduler keeps the last events of a topic (`distributed.admin.low-level-log-length`,
1,000 by default), which is why a report travels this way only when it is small.

One `Inbox` per client, subscribed once: every run on that client registers the keys it
waits for (`expect`), and an event for any other key (another kernel's run on the same
cluster, a batch Dask ran again for lineage) is dropped.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from nbcluster._wire import PUSHED_TOPIC as TOPIC


class Inbox:
    """The pushed reports of one client's persisted batches, by batch key."""

    def __init__(self) -> None:
        self._arrived = threading.Condition()
        self._wanted: set[str] = set()
        self._reports: dict[str, bytes] = {}

    def expect(self, key: str) -> None:
        """Keep the report of batch `key` when it arrives (call before submitting the batch).

        Parameters
        ----------
        key : str
            The batch's Dask key.
        """
        with self._arrived:
            self._wanted.add(key)

    def take(self, key: str, timeout: float) -> bytes | None:
        """The report of batch `key`, waiting up to `timeout` seconds; None if none came.

        Parameters
        ----------
        key : str
            The batch's Dask key, as given to `expect`.
        timeout : float
            How long to wait for a report that has not arrived yet.

        Returns
        -------
        bytes or None
            The pickled report; None when it did not come (the caller then reads it from the
            worker). Either way the key is no longer expected.
        """
        with self._arrived:
            self._arrived.wait_for(lambda: key in self._reports, timeout)
            self._wanted.discard(key)
            return self._reports.pop(key, None)

    def forget(self, prefix: str) -> None:
        """Stop expecting every key that starts with `prefix` (a run that ended).

        Parameters
        ----------
        prefix : str
            The run's key prefix.
        """
        with self._arrived:
            self._wanted = {k for k in self._wanted if not k.startswith(prefix)}
            self._reports = {k: r for k, r in self._reports.items() if not k.startswith(prefix)}

    def arrived(self, event: tuple[float, Any]) -> None:
        """The client's handler for `TOPIC`: keep a report some run expects.

        Parameters
        ----------
        event : tuple of (float, dict)
            Dask's event: its time, and ``{"key": ..., "report": ...}`` from the worker.
        """
        key, report = event[1].get("key"), event[1].get("report")
        with self._arrived:
            if isinstance(key, str) and isinstance(report, bytes) and key in self._wanted:
                self._reports[key] = report
                self._arrived.notify_all()


_INBOXES: weakref.WeakKeyDictionary[Any, Inbox] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def inbox(client: Any) -> Inbox | None:
    """The `Inbox` of `client`, subscribed to `TOPIC` the first time; None if it cannot be.

    Parameters
    ----------
    client : distributed.Client
        The run's client.

    Returns
    -------
    Inbox or None
        Its inbox; None when the client cannot subscribe (the engine then reads every report
        from the worker).
    """
    with _LOCK:
        if client not in _INBOXES:
            with contextlib.suppress(Exception):  # a client that cannot subscribe: no inbox
                found = Inbox()
                client.subscribe_topic(TOPIC, found.arrived)
                _INBOXES[client] = found
        return _INBOXES.get(client)
