"""Freed memory goes back to the operating system on nbcluster's workers.

nbcluster's workers start with `MALLOC_MMAP_THRESHOLD_` raised (see `nbcluster.yaml`), so
arrays up to 64 MiB come from the heap and are reused, not mmapped and faulted in afresh
each time: that is what makes numpy code run as fast on a worker as in a fresh process.
They also raise `MALLOC_TRIM_THRESHOLD_` from Dask's 64 KiB to 128 MiB: with 64 KiB,
every free() that left more than that at the top of a heap gave it back to the system, and
the next array faulted its pages in again (which arrays end up at the top depends on what
was allocated after them: after a worker's first `%%distribute` batch, a numpy loop took
15,600 page faults an item instead of 96, for the rest of the worker's life).
The price is that glibc keeps freed heap memory for reuse: after a task that allocated and
freed 2 GB in 1-50 MB arrays, a worker held 226 MiB where Dask's default leaves 76 MiB.

`MemoryTrim` gives that memory back: once a task (or a direct batch, which marks it
`dirty` itself: `worker.serve`) has finished since the last trim, it calls glibc's
`malloc_trim(0)` from the worker's event loop, at most once per
`nbcluster.worker.trim-interval`. A trim that frees ~200 MiB takes about 1 ms; one with
nothing to free costs microseconds. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from nbcluster._wire import MEMORY_TRIM_PLUGIN


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


class MemoryTrim(WorkerPlugin):
    """Trim the heap once after work, at most every `interval` seconds.

    Parameters
    ----------
    interval : float
        Seconds between two trims, at the least.
    trim : callable, optional
        Called with 0 to trim; by default glibc's ``malloc_trim``, found on the worker (none
        elsewhere than glibc: then nothing trims).
    """

    name = MEMORY_TRIM_PLUGIN
    idempotent = True

    def __init__(self, interval: float = 1.0, trim: Callable[[int], Any] | None = None):
        self.interval, self.trim = interval, trim
        self.dirty = False
        self.trims = 0

    def setup(self, worker: Any) -> None:
        """Dask's plugin hook: trim the worker's heap periodically (where glibc can).

        Parameters
        ----------
        worker : distributed.Worker
            The worker the plugin was added to.
        """
        from tornado.ioloop import PeriodicCallback

        self.trim = self.trim or _malloc_trim()
        if self.trim is None:
            return
        self.callback = PeriodicCallback(self.tick, self.interval * 1000)
        worker.periodic_callbacks[self.name] = self.callback
        self.callback.start()

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Dask's plugin hook: a task that ran may have left memory to give back.

        Parameters
        ----------
        key : Key
            The task's key.
        start, finish : str
            The states it moved between.
        *args, **kwargs
            Dask's other arguments (unused).
        """
        if start == "executing":
            self.dirty = True

    def tick(self) -> None:
        """Trim, if a task has run since the last trim (every `interval`, in the event loop)."""
        if self.dirty and self.trim is not None:
            self.dirty = False
            self.trim(0)
            self.trims += 1

    def teardown(self, worker: Any) -> None:
        """Dask's plugin hook: stop trimming.

        Parameters
        ----------
        worker : distributed.Worker
            The worker.
        """
        callback = getattr(self, "callback", None)
        if callback is not None:
            callback.stop()
            worker.periodic_callbacks.pop(self.name, None)
