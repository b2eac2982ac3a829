"""A worker's event loop runs on the core of the item it runs, on nbcluster's local workers.

Why. A Dask worker runs its items in a thread beside its event loop, and the two share the
GIL. Many items give the GIL up for a moment, thousands of times a second: numpy's random
numbers do, and so do PyTorch's operators and file and socket I/O. When the loop wants the
GIL then (a heartbeat, a message, any of Dask's timers), CPython wakes it at each of those
releases, and the item's thread, still running, takes the GIL back before the loop's thread
is even scheduled: each wake restarts the loop's wait (CPython's ``take_gil`` asks the
holder to drop the GIL only after a whole switch interval without a release), so the loop
is woken thousands of times and gets the GIL only when the item ends or blocks. Each of
those wakes is a context switch on the core the loop's thread was woken on; on a machine
whose cores the items fill, that is another worker's item, which is preempted each time
(bench/RESULTS.md, "simulation", has the counts for CartPole items on 2 cores).

What. While the worker's one item thread is running, `LoopFollowsItems` keeps the loop's
thread on the core that item thread last ran on (its affinity, re-read every `FOLLOW_S`),
and gives it the worker's whole set of cores back once the item thread waits for work.
On the item's own core, the scheduler runs the woken loop thread at once, in the item's
place, so the loop takes the GIL at the next release. The item's thread itself is never
pinned: the system still moves it, and the loop follows within `FOLLOW_S`.

Where it applies: Linux, a worker with one thread (a loop cannot follow several), and
more than one core allowed. Elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from nbcluster.cluster.worker_memory import Periodic

FOLLOW_S = 0.5  # how often the loop's thread looks where the item's thread runs


def _running_on(thread_id: int) -> int | None:
    """The core thread `thread_id` of this process last ran on, if it is running now."""
    try:
        with open(f"/proc/self/task/{thread_id}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:  # the thread ended
        return None
    # proc(5): the state is the 3rd field, the core the 39th; the name before ")" may hold spaces.
    return int(fields[36]) if fields[0] == "R" else None


class LoopFollowsItems(Periodic):
    """Keep a one-thread worker's event loop on its item's core while the item runs (module docstring)."""

    name = "nbcluster-loop-follows-items"
    idempotent = True

    def setup(self, worker: Any) -> None:
        """Dask's plugin hook, in the worker's event loop: follow, where this applies.

        Parameters
        ----------
        worker : distributed.Worker
            The worker the plugin was added to.
        """
        if not hasattr(os, "sched_setaffinity") or worker.state.nthreads != 1:
            return
        self.cores = os.sched_getaffinity(0)
        if len(self.cores) < 2:
            return
        self.executor, self.pinned = worker.executors["default"], False
        self.every(worker, FOLLOW_S)

    def tick(self) -> None:
        """Move the loop's thread to the item's core, or give it every core back (in the loop)."""
        threads = getattr(self.executor, "_threads", ())  # made at the first task
        core = next((c for t in threads if t.native_id and (c := _running_on(t.native_id)) is not None), None)
        if core is None and not self.pinned:
            return
        with contextlib.suppress(OSError):  # a core taken away meanwhile: stay as we are
            os.sched_setaffinity(0, self.cores if core is None else {core})
            self.pinned = core is not None

    def teardown(self, worker: Any) -> None:
        """Dask's plugin hook: stop following, and give the loop's thread every core back.

        Parameters
        ----------
        worker : distributed.Worker
            The worker.
        """
        super().teardown(worker)
        if getattr(self, "pinned", False):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.cores)
