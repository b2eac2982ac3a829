"""Dask's batched streams, told to send each message as soon as they can.

Every long-lived connection between a Dask scheduler, its workers and its clients is a
`BatchedSend`: after each write it holds new messages back for an interval (5 ms from the
scheduler to a worker, 2 ms from a worker or to a client, 10 ms from a client), so that a
burst goes out as one write. A small cell crosses four of these streams (kernel to
scheduler, scheduler to worker, and back), and whenever one had written within its
interval, the cell waited out the rest of it: milliseconds of every small cell, for a
plain `client.map` + `gather` as well.

With an interval of 0 a stream still batches: what arrives while a write is under way goes
out in the next one. So a scheduler nbcluster runs (`SchedulerStreams`, installed by the
supervisor), the workers of a local cluster (`WorkerStream`) and a cluster handle's client
(`cluster/handle.py`) send at once. A scheduler or worker nbcluster did not start keeps
Dask's intervals, which only costs those milliseconds.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from nbcluster._compat import scheduler_streams, send_at_once, worker_stream


class SchedulerStreams(SchedulerPlugin):
    """On a scheduler: its streams to every worker and client send at once."""

    name = "nbcluster-streams"

    async def start(self, scheduler: Any) -> None:
        """Dask's plugin hook: the streams of those already connected.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        """
        for stream in scheduler_streams(scheduler):
            send_at_once(stream)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """Dask's plugin hook: a worker joined (its stream exists by now).

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        worker : str
            The worker's address.
        """
        for stream in scheduler_streams(scheduler, worker=worker):
            send_at_once(stream)

    def add_client(self, scheduler: Any, client: str) -> None:
        """Dask's plugin hook: a client connected (its stream is made just after this call).

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        client : str
            The client's id.
        """

        def later() -> None:
            for stream in scheduler_streams(scheduler, client=client):
                send_at_once(stream)

        scheduler.loop.add_callback(later)


class WorkerStream(WorkerPlugin):
    """On a worker: its stream to the scheduler sends at once."""

    name = "nbcluster-stream"
    idempotent = True

    def setup(self, worker: Any) -> None:
        """Dask's plugin hook.

        Parameters
        ----------
        worker : distributed.Worker
            The worker the plugin was added to.
        """
        send_at_once(worker_stream(worker))
