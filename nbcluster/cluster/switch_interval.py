"""A one-thread worker's event loop gets the GIL soon after it asks, on nbcluster's local workers.

Why. A Dask worker runs its items in a thread beside its event loop, and the two share the
GIL. Many items give the GIL up for a moment, thousands of times a second: numpy's random
numbers do, and so do PyTorch's operators and file and socket I/O. When the loop wants the
GIL then (a heartbeat, a message, any of Dask's timers), CPython wakes it at each of those
releases, and the item's thread, still running, takes the GIL back before the loop's thread
is even scheduled. CPython's ``take_gil`` asks the holder to drop the GIL only once a
waiter's wait has lasted a whole switch interval without a release; each release restarts
that wait, so with Python's 5 ms interval the loop is woken thousands of times for nothing
and gets the GIL only when the item ends or blocks. Those wakes cost CPU on a machine whose
cores the items fill, and the item's thread pays a system call at each release.

What. `ShortSwitchInterval` sets a one-thread worker process's switch interval
(`sys.setswitchinterval`) to ``nbcluster.worker.switch-interval``, 10 us: once a gap between
an item's releases is longer than that (plus the thread's timer slack, 50 us by default), the
loop's wait runs out, CPython asks the item to hand the GIL over, and the loop gets it. An
item that releases the GIL more often still keeps the loop waiting, for milliseconds rather
than for the whole item (the measurements: bench/RESULTS.md, "simulation").

What it costs: Python threads that an item starts itself take turns that often too, which
slows threads of pure Python that run at once. That is why workers with several threads
(whose items would take turns so) keep Python's interval; ``switch-interval: null`` keeps it
everywhere.
"""

from __future__ import annotations

import sys
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin


class ShortSwitchInterval(WorkerPlugin):
    """Set a one-thread worker's GIL switch interval (module docstring).

    Parameters
    ----------
    seconds : float or None
        The interval; None leaves Python's.
    """

    name = "nbcluster-switch-interval"
    idempotent = True

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.before: float | None = None

    def setup(self, worker: Any) -> None:
        """Dask's plugin hook: shorten the interval on a worker with one thread.

        Parameters
        ----------
        worker : distributed.Worker
            The worker the plugin was added to.
        """
        if self.seconds is not None and worker.state.nthreads == 1:
            self.before = sys.getswitchinterval()
            sys.setswitchinterval(self.seconds)

    def teardown(self, worker: Any) -> None:
        """Dask's plugin hook: put Python's interval back.

        Parameters
        ----------
        worker : distributed.Worker
            The worker.
        """
        if self.before is not None:
            sys.setswitchinterval(self.before)
