"""How many items go in each batch: probes first, then sized from measured item times.

A Dask task costs about 2 ms here however little it does, so small items travel in
batches. But a batch's results come back only when the whole batch is done, so a big
first batch delays the first result, and a big last batch leaves one thread working
alone at the end. The policy:

1. **Probe cheaply.** Until an item time has been measured, the very first batch is one
   item, so the first result arrives one item's duration after the start whatever the
   other items do (an item that blocks, or takes an hour, right behind it). Not so where
   that batch goes to a worker directly (every run's first half-second, `direct.py`): it
   can send its first item's result ahead of the rest when it goes on past 5 ms
   (`worker/direct.py`), so the engine sets `alone_first` off and the first batch is a
   probe like the others, one round trip fewer (0.5 to 0.9 ms of a small cell). Then one probe
   per thread shares the rest of the items out, up to `PROBE_ITEMS` each (a range's items
   travel in a few bytes however many there are, so for a range, its whole share). Behind a
   first item sent alone, one share more stays in the backlog until a batch comes back, for
   the thread that ran that item, which is free first: Dask places tasks it has no times
   for by how many each worker holds, and may put both probes of two threads on one
   worker, leaving the first item's worker nothing to do until a probe comes back. Each
   probe has a budget of `PROBE_S`: a worker stops after the first item that ends past the
   budget, so an item slower than 50 ms comes back alone; tiny items come back by the
   thousand from the same round trip. Sent directly, an 8-item cell of tiny items is one
   round of tasks, not two (one item per task, then the rest), and 20,000 tiny items on 2
   threads need no second round either; through the scheduler, the kept share follows the
   first item's result.
   (With 5 ms they did, on this loaded 2-core machine where such an item takes 2 us: a
   round trip of 15 to 40 ms more; 20,000 tiny items took 84 ms with 5 ms, 66 ms with 20 ms
   and 59 ms with 50 ms, medians of 15 in turns. And a probe for each free slot, two per
   thread, gave the thread that did not run the first item two probes, twice the other's
   work.)
2. **Size from measurements.** After that a batch is sized from the mean time per item
   measured on the workers so far, `t` (the time spent in the items only, not in loading
   the cell), like guided self-scheduling:

       size = clamp(remaining / (4 * threads), min_batch / t, max_batch / t)

   big batches while plenty of work is left (per-task cost well under a microsecond per
   tiny item), short ones (`min_batch`, 50 ms of work) at the end, `max_batch` (250 ms)
   of work at most. But never more than a thread's share of what is left (down to
   `SPLIT_S`, 5 ms of work): 20,000 tiny items used to end in one batch of 24 ms on one
   worker while the other waited, since all that was left came to less than `min_batch`.
3. **A time budget, not trust.** An estimate from a single item can be wrong (a first
   call that was quick, a cache that was warm). So every sized batch also carries a
   budget of `max_batch` seconds: the worker stops between items once it is spent and
   sends back what it finished, and the kernel sends the rest again. A wrong estimate
   costs one budget, not a batch of hours, and tiny items need only two round trips
   (one item, then everything), which matters on a loaded machine where a round trip
   takes tens of milliseconds.

4. **Threads that wait get bigger batches.** Each batch says how long its worker thread
   waited for it since the thread's previous batch of the run (`worker.since_last`). While
   the `in-flight` batches a thread keep its next one ready, that is about nothing. When
   a round (result to the kernel, next batch to the scheduler, to the worker) takes
   longer than a batch works, as with a scheduler serving a thousand threads, the
   threads idle between batches, and small ones only add to the scheduler's queue: no
   batch then carries less work than the threads lately waited (`least`, the median of
   the last 16 waits), and its budget is twice that. 100,000 items of 1 ms on 1,000
   simulated workers made 11,971 tasks, most of 5 ms, each waited for for seconds.

Worked example, 2 threads, 400 items of 10 ms, through the scheduler: item 0 alone, and
two probes of 133 items, each returning after its fifth item (50 ms, the probe budget),
the third share of 133 kept until item 0 is back; then 25 (0.25 s) while more than 200
items are left, shrinking to 5 (0.05 s) at the end. Sent directly, two probes of 200
items, the first sending item 0 ahead. 20,000 tiny items (1 us), directly: two probes of 10,000 items, each done in 1 to 25 ms: one
round. A million tiny items over a range, the same: two probes of 500,000 (40 to 50 ms
each). Four probes of `PROBE_ITEMS` and sized batches after them took longer: through
`distribute(fn)` 90 and 94 ms against 81 and 77 ms, through the magic 100 against 82 ms
(and once 71 against 77 ms), medians of 15 to 21 runs in turns. Their probe's budget still
applies: a probe whose items are slower than they looked comes back after 50 ms with what
it finished.

A fixed `--batch N` bypasses all of this: N items a batch, and no budget.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from nbcluster import config

PROBE_S = 0.05  # a probe returns after the first item that ends past this: the smallest sized batch's work
PROBE_ITEMS = 10_000  # at most this many items in a probe: sent back unrun if the items are slow
SPLIT_S = 0.005  # the least work worth a task of its own when the tail is shared out
IDLE_SEEN = 16  # the threads' waits for a batch that `least` takes the median of


class Batcher:
    """Sizes batches for one run from what the finished batches measured.

    One per run, kept by the engine: it asks `next_size` before each batch it submits, sends
    `budget` with it, and tells `observe` what each finished batch measured.

    Parameters
    ----------
    threads : int
        Worker threads the run has (at least 1 is assumed): sized batches aim at four per
        thread for the work that is left.
    fixed : int or None
        ``--batch N``: every batch takes N items and runs them all (no budget); None sizes
        them from measurements.
    min_batch, max_batch : float
        Seconds of work in the smallest and the largest sized batch; `max_batch` is also the
        budget of every sized batch.
    probe_items : int or None
        The most items a probe takes (`PROBE_ITEMS`); None for items that cost nothing to
        send (a range's), which the probes share out whole.

    Examples
    --------
    Two threads, 400 items of 10 ms (the module docstring's worked example): one item first,
    a probe per thread takes a third of the rest, the last third waits (0) for a batch to
    come back, then batches are sized from the measured time.

    >>> batcher = Batcher(2)
    >>> [batcher.next_size(n, free) for n, free in ((400, 4), (399, 3), (266, 2), (133, 1))]
    [1, 133, 133, 0]
    >>> batcher.observe(4, 0.04)
    >>> batcher.next_size(396), batcher.next_size(30)
    (25, 5)
    >>> Batcher(2, fixed=8).next_size(5)
    5
    """

    def __init__(
        self,
        threads: int,
        *,
        fixed: int | None = None,
        min_batch: float = 0.05,
        max_batch: float = 0.25,
        probe_items: int | None = PROBE_ITEMS,
    ):
        self.threads = max(threads, 1)
        self.fixed = fixed
        self.probe_items = probe_items
        self.min_batch, self.max_batch = min_batch, max_batch
        self.items = 0  # items measured
        self.seconds = 0.0  # their total time on the workers
        #: The next batch is one item: the run's first, unless it sends its first item ahead
        #: of the rest (a direct batch, `worker/direct.py`), which the engine says here.
        self.alone_first = True
        self._probes = self.threads  # probes still to share out the items: one per thread
        self._kept = 0  # shares the probes leave in the backlog (one, behind a first item alone)
        self._idle: deque[float] = deque(maxlen=IDLE_SEEN)  # the threads' last waits for a batch, s

    @classmethod
    def from_config(cls, threads: int, fixed: int | None = None, probe_items: int | None = PROBE_ITEMS) -> Batcher:
        """A batcher with the smallest and largest batch of the settings.

        Parameters
        ----------
        threads : int
            Worker threads the run has.
        fixed : int or None
            ``--batch N``, or None to size batches from measurements.
        probe_items : int or None
            The most items a probe takes; None for items that cost nothing to send.

        Returns
        -------
        Batcher
            Sized by ``distribute.min-batch`` and ``distribute.max-batch``.
        """
        return cls(
            threads,
            fixed=fixed,
            min_batch=config.seconds("distribute.min-batch"),
            max_batch=config.seconds("distribute.max-batch"),
            probe_items=probe_items,
        )

    @property
    def budget(self) -> float | None:
        """Seconds after which a batch returns what it finished (None: run it all)."""
        if self.fixed is not None:
            return None
        # Twice the least work a batch carries: one sized to it is not cut short by its budget.
        return max(self.max_batch, 2 * self.least) if self.items else PROBE_S

    @property
    def least(self) -> float:
        """Seconds of work a batch must carry to be worth a task: `SPLIT_S`, or more.

        As much as the workers' threads waited between batches lately (the median of the
        last `IDLE_SEEN`), where that is more: a thread that waits as long as it works is
        half idle. That happens when a round (result to the kernel, next batch to the
        worker) takes longer than a batch works: a scheduler serving a thousand threads, a
        busy kernel. Fewer, bigger batches are then the cure, and in turn shorten the
        wait, so batches shrink again; while pipelining hides the round, the threads do
        not wait and nothing changes.
        """
        if not self._idle:
            return SPLIT_S
        return max(SPLIT_S, statistics.median(self._idle))

    @property
    def seconds_per_item(self) -> float | None:
        """Mean seconds an item took on the workers so far; None before any was measured."""
        return self.seconds / self.items if self.items else None

    def observe(self, count: int, seconds: float, idle: float | None = None) -> None:
        """A batch of `count` items finished, having spent `seconds` in its items.

        Parameters
        ----------
        count : int
            Items the batch ran (a batch that ran none, stopped or sent back, is ignored).
        seconds : float
            Time the worker spent in those items, not in loading the cell.
        idle : float or None
            How long the worker's thread waited for this batch after its previous one of the
            run (`worker.since_last`); None for a thread's first.
        """
        if idle is not None:
            self._idle.append(idle)
        if count <= 0:
            return
        self.items += count
        self.seconds += seconds

    def next_size(self, remaining: int, free: int = 1) -> int:
        """How many of the `remaining` items the next batch takes (at least 1).

        Parameters
        ----------
        remaining : int
            Items not yet sent.
        free : int
            Batches that may still be submitted now, the next among them; until an item time
            is measured they share out the items (a probe each, see the module docstring).

        Returns
        -------
        int
            The next batch's size: between 1 and `remaining`; 0 when nothing remains, or
            when the probes are out and the share kept behind the first item waits for a
            batch to come back.
        """
        if remaining <= 0:
            return 0
        if self.fixed is not None:
            return min(self.fixed, remaining)
        t = self.seconds_per_item
        if t is None:
            if self.alone_first:
                self.alone_first = False
                self._kept = 1  # a share waits for the thread that ran it: it is free first
                return 1
            if not self._probes:
                return 0  # every probe is out: the kept share waits for a batch to come back
            probes = max(1, min(free, self._probes))
            self._probes = max(0 if self._kept else 1, self._probes - 1)
            share = math.ceil(remaining / (probes + self._kept))
            return max(1, share if self.probe_items is None else min(self.probe_items, share))
        t = max(t, 1e-9) * (1 + 1e-9)  # a mean of 0.00999999 s is 10 ms: no 6 where 5 fits
        least = self.least
        lo = max(1, math.ceil(max(self.min_batch, least) / t))
        hi = max(lo, math.ceil(self.max_batch / t))
        size = max(lo, min(hi, math.ceil(remaining / (4 * self.threads))))
        # The tail: where `min_batch` would give one thread all that is left while the others
        # wait, share it out, as long as each share is still worth a task (`least`).
        share = max(math.ceil(remaining / self.threads), math.ceil(least / t))
        return max(1, min(size, share, remaining))
