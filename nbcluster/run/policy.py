"""The scheduling policy of one start of a run: events in, batches and verdicts out.

The driver (`engine.py`) owns the transport and the futures; this module owns the
decisions and touches neither Dask nor a thread, so it is tested by feeding it events
(`tests/test_policy.py`).

Policy
------
- **Backlog.** The items not yet submitted wait here, in order; an item put back (a retry,
  an item a stopped batch did not reach, a batch that came back unrun) goes back in front.
- **Batches in flight.** At most `per_thread` batches (the ``distribute.in-flight``
  setting, 2) per usable worker thread are out at once, so that a thread finds its next
  batch waiting when it finishes one; one a thread while they go to the workers directly
  (`transport.py`: none waits on a worker). `top_up` gives the batches to submit now.
- **Batch sizes** (`Batcher`). A task costs milliseconds however little it does, so small
  items travel in batches; but a batch's results come back only when it is done.

  1. *Probes.* Until an item time is measured, the first batch is one item alone, so the
     first result arrives one item's time after the start whatever the others do. (A batch
     sent to a worker directly sends its first item's result ahead of the rest,
     `worker.FirstAhead`, so the engine sets `Batcher.alone_first` off for it.) Then one probe
     per thread shares out the rest, at most `PROBE_ITEMS` each (a range's items cost
     nothing to send, so there the whole share); behind a first item sent alone, one share
     more waits in the backlog for the thread that ran that item, free first. A probe's
     budget is `PROBE_S`: its worker returns after the first item that ends past it, with
     what it finished, and the rest goes back in front of the backlog.
  2. *Measured sizes.* Then, from `t`, the mean time an item took on the workers,
     ``size = clamp(remaining / (4 * threads), min_batch / t, max_batch / t)``
     (``distribute.min-batch``, 50 ms, and ``distribute.max-batch``, 250 ms), but never
     more than one in-flight batch's share of what is left (`per_thread` batches a thread),
     down to `SPLIT_S` of work: the tail is shared out in ever smaller batches, so that a
     batch queued behind a thread's running one is small when another thread runs dry.
  3. *A budget, not trust.* Every sized batch has a budget of `max_batch` seconds (twice
     `Batcher.least`, if more): a wrong estimate costs one budget, not a batch of hours.
  4. *Threads that wait get bigger batches.* Each batch says how long its thread waited
     for it (`worker.run_batch`'s ``idle``). Sized batches carry at least 1 / `WAIT_SHARE`
     (50) times the median of the last `IDLE_SEEN` waits (`Batcher.waited`), up to
     `max_batch`: a direct batch's thread waits a round trip for each next one (2-3 ms
     while the other cores run items), which batches of `min_batch` made 5% of its time.
     And no batch carries less work than that median wait itself (`Batcher.least`): when
     a round trip is slower than a batch, as with a scheduler serving a thousand threads,
     fewer, bigger batches are the cure.

  ``--batch N`` bypasses sizing: N items a batch, no budget.
- **Retries.** A failed item runs again while it has attempts left (``--retries``): it is
  held back from delivery (`finished` returns it) and goes back in front.
- **Suspects.** A batch whose workers kept dying (Dask's ``KilledWorker``) is split in
  halves, the *suspects*, and a suspect runs *alone*: nothing else of the run is out while it
  runs, because Dask counts a death against every task a worker holds. A batch of one item
  killed while it ran alone is the culprit: `killed` returns it, to be failed.
- **Workers that come and go.** `resize` sets the usable threads, and so how many batches
  may be out.

State: `items` (the backlog: the items put back, in front of the plan's own sequence read
from a position on, so a million items are one range), `suspects` (lists of items),
`attempts` (used, by failed item only), `batcher` (the items measured, their seconds, the
probes left, the last waits).

Worked example: 2 threads, 2 in flight each, 13 items, one retry. The first top-up sends
the first item alone, then one probe per thread takes a third of the rest; the last third
waits for a batch to come back.

>>> policy = Policy(range(13), Batcher(2), retries=1, per_thread=2)
>>> policy.top_up(out=0)
[range(0, 1), range(1, 5), range(5, 9)]
>>> policy.top_up(out=3)
[]

Item 3 fails in the second batch, which ran every item in 4 ms: it gets its retry (held
back from delivery), and goes out again in the next top-up, in front of the kept items,
sized from the measured time.

>>> policy.finished(range(1, 5), reached=4, failed=[2], seconds=0.004)
[3]
>>> policy.top_up(out=2)
[[3, 9, 10, 11, 12]]

The third batch's workers kept dying: it is split into suspects, which run alone, one at a
time, once nothing else is out. A killed suspect is split again; a suspect of one item
killed alone is the culprit, to be failed.

>>> policy.killed(range(5, 9), alone=False)
[]
>>> policy.top_up(out=2), policy.top_up(out=0)
([], [[5, 6]])
>>> policy.killed([5, 6], alone=True)
[]
>>> policy.top_up(out=0), policy.finished([7, 8], reached=2)
([[7, 8]], [])
>>> policy.top_up(out=0), policy.killed([5], alone=True)
([[5]], [5])
>>> policy.top_up(out=0), policy.held()
([[6]], 0)
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence

PROBE_S = 0.05  # a probe returns after the first item that ends past this
PROBE_ITEMS = 10_000  # at most this many items in a probe: sent back unrun if the items are slow
SPLIT_S = 0.005  # the least work worth a task of its own when the tail is shared out
IDLE_SEEN = 16  # the threads' waits for a batch that `Batcher.waited` takes the median of
WAIT_SHARE = 0.02  # a thread's wait for its next batch, as a share of the work a batch carries


class Policy:
    """One start's backlog, batch sizes, suspects and retries; see the module docstring.

    Parameters
    ----------
    indices : sequence of int
        The items to run, in order (a `range` for consecutive ones).
    batcher : Batcher
        Sizes the batches; its ``threads`` are the usable worker threads.
    retries : int
        Attempts a failed item gets after its first (``--retries``).
    per_thread : int
        Batches kept out per usable thread (``distribute.in-flight``).
    """

    def __init__(self, indices: Sequence[int], batcher: Batcher, *, retries: int = 0, per_thread: int = 2):
        self.items = _Queue(indices)
        self.suspects: deque[list[int]] = deque()  # parts of killed batches, each to run alone
        self.attempts: dict[int, int] = {}  # by the failed items only (no dict of a million)
        self.retries, self.batcher, self.per_thread = retries, batcher, max(1, per_thread)

    def top_up(self, out: int, *, direct: bool = False) -> list[Sequence[int]]:
        """The batches to submit now, with `out` batches already out.

        While there are suspects, one of them, and only once nothing is out.

        Parameters
        ----------
        out : int
            Batches submitted and not yet finished.
        direct : bool
            Every worker takes the batches directly now: one a thread, none queued there.

        Returns
        -------
        list of sequence of int
            Each batch's items (a `range` when consecutive); empty when nothing goes now.
        """
        if self.suspects:
            return [self.suspects.popleft()] if out == 0 else []
        batches: list[Sequence[int]] = []
        limit = (1 if direct else self.per_thread) * self.batcher.threads  # batches out at once, at most
        while self.items and out + len(batches) < limit:
            size = self.batcher.next_size(len(self.items), limit - out - len(batches), slots=limit)
            if not size and (out or batches):
                break  # the share kept behind the first item waits for a batch to come back
            batches.append(self.items.take(max(size, 1)))
        return batches

    def finished(self, indices: Sequence[int], *, reached: int, failed: Iterable[int] = (),
                 seconds: float | None = None, idle: float | None = None) -> list[int]:  # fmt: skip
        """A batch came back; the failed items that get another attempt.

        Those, and the items the batch did not reach (its budget was spent), go back in
        front of the backlog. A batch that came back unrun (refused, sent again elsewhere,
        or its input was lost and sent again) reached none: not an attempt of its items.

        Parameters
        ----------
        indices : sequence of int
            The batch's items.
        reached : int
            How many of them it ran (the first `reached`); 0 for a batch that came back unrun.
        failed : iterable of int
            The positions in the batch of the items that failed.
        seconds : float or None
            Time the worker spent in the items it ran; None when not measured.
        idle : float or None
            How long its worker thread waited for it (`Batcher.observe`).

        Returns
        -------
        list of int
            The items to hold back from delivery: they run again.
        """
        if seconds is not None:
            self.batcher.observe(reached, seconds, idle=idle)
        elif not (reached or self.batcher.items):
            self.batcher.alone_first = True  # unrun, and no first item came yet: the next batch is one
        retry = [indices[j] for j in failed if self.attempts.get(indices[j], 0) < self.retries]
        self.attempts.update({i: self.attempts.get(i, 0) + 1 for i in retry})
        self.items.put_back(retry + list(indices[reached:]))
        return retry

    def killed(self, indices: Sequence[int], *, alone: bool) -> list[int]:
        """A batch whose workers kept dying; the items to fail (the culprit), if found.

        Not an attempt of its items: which item it was is not known yet.

        Parameters
        ----------
        indices : sequence of int
            The batch's items.
        alone : bool
            Whether nothing else of the run was out while it ran.

        Returns
        -------
        list of int
            The one item of a batch killed alone; empty when the batch was split into suspects.
        """
        if alone and len(indices) == 1:
            return list(indices)
        items, half = list(indices), (len(indices) + 1) // 2
        self.suspects.extend(part for part in (items[:half], items[half:]) if part)
        return []

    def resize(self, threads: int) -> None:
        """The cluster now has `threads` usable threads (workers joined or left).

        Parameters
        ----------
        threads : int
            Usable worker threads (at least 1).
        """
        self.batcher.threads = threads

    def drain(self) -> list[int]:
        """Every item not yet submitted, taken out: the run fails or gives them up.

        Returns
        -------
        list of int
            The suspects' items, then the backlog's.
        """
        taken = [i for part in self.suspects for i in part]
        self.suspects.clear()
        return [*taken, *self.items.take(len(self.items))]

    def held(self) -> int:
        """Items not submitted yet (the backlog's and the suspects'), for the adaptive target.

        Returns
        -------
        int
            Their count.
        """
        return len(self.items) + sum(len(part) for part in self.suspects)


class Batcher:
    """Sizes one start's batches from what the finished batches measured (module docstring).

    Parameters
    ----------
    threads : int
        Usable worker threads (at least 1 is assumed): sized batches aim at four per thread
        for the work that is left.
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
    Two threads, 400 items of 10 ms: one item first, a probe per thread takes a third of the
    rest, the last third waits (0) for a batch to come back; then sizes follow the measured
    time, 25 items (0.25 s) while plenty is left, 5 (0.05 s) at the end.

    >>> batcher = Batcher(2)
    >>> [batcher.next_size(n, free) for n, free in ((400, 4), (399, 3), (266, 2), (133, 1))]
    [1, 133, 133, 0]
    >>> batcher.observe(4, 0.04)
    >>> batcher.next_size(396), batcher.next_size(30), batcher.budget
    (25, 5, 0.25)
    >>> Batcher(2, fixed=8).next_size(5)
    5
    """

    def __init__(self, threads: int, *, fixed: int | None = None, min_batch: float = 0.05, max_batch: float = 0.25,
                 probe_items: int | None = PROBE_ITEMS):  # fmt: skip
        self.threads, self.fixed, self.probe_items = max(threads, 1), fixed, probe_items
        self.bounds = (min_batch, max_batch)
        self.items, self.seconds = 0, 0.0  # items measured, and their total time on the workers
        self.alone_first = True  # the next batch is one item (see the module docstring)
        self._probes = self.threads  # probes still to share out the items: one per thread
        self._kept = 0  # shares the probes leave in the backlog (one, behind a first item alone)
        self._idle: deque[float] = deque(maxlen=IDLE_SEEN)  # the threads' last waits for a batch

    @property
    def budget(self) -> float | None:
        """Seconds after which a batch returns what it finished (None: run it all)."""
        if self.fixed is not None:
            return None
        # Twice the least work a batch carries: one sized to it is not cut short by its budget.
        return max(self.bounds[1], 2 * self.least) if self.items else PROBE_S

    @property
    def waited(self) -> float:
        """The median of the threads' last `IDLE_SEEN` waits for a batch (0 before any)."""
        return statistics.median(self._idle) if self._idle else 0.0

    @property
    def least(self) -> float:
        """Seconds of work a batch must carry to be worth a task: `SPLIT_S`, or the threads'
        median wait for a batch (`waited`), where more."""
        return max(SPLIT_S, self.waited)

    @property
    def seconds_per_item(self) -> float | None:
        """Mean seconds an item took on the workers so far; None before any was measured."""
        return self.seconds / self.items if self.items else None

    def observe(self, count: int, seconds: float, idle: float | None = None) -> None:
        """A batch of `count` items finished, having spent `seconds` in its items.

        Parameters
        ----------
        count : int
            Items the batch ran (a batch that ran none is not measured).
        seconds : float
            Time the worker spent in those items, not in loading the cell.
        idle : float or None
            How long the worker's thread waited for this batch after its previous one of the
            run (`worker.run_batch`'s ``idle``); None for a thread's first.
        """
        if idle is not None:
            self._idle.append(idle)
        if count > 0:
            self.items, self.seconds = self.items + count, self.seconds + seconds

    def next_size(self, remaining: int, free: int = 1, slots: int | None = None) -> int:
        """How many of the `remaining` items the next batch takes.

        Parameters
        ----------
        remaining : int
            Items not yet sent.
        free : int
            Batches that may still be submitted now, the next among them; until an item time
            is measured they share out the items (a probe each).
        slots : int or None
            Batches that may be out at once (threads times ``in-flight``): the tail is shared
            among them. None: one a thread.

        Returns
        -------
        int
            Between 1 and `remaining`; 0 when nothing remains, or when the probes are out and
            the share kept behind the first item waits for a batch to come back.
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
                return 0
            probes = max(1, min(free, self._probes))
            self._probes = max(0 if self._kept else 1, self._probes - 1)
            share = math.ceil(remaining / (probes + self._kept))
            return max(1, share if self.probe_items is None else min(self.probe_items, share))
        t = max(t, 1e-9) * (1 + 1e-9)  # a mean of 0.00999999 s is 10 ms: no 6 where 5 fits
        least, (min_batch, max_batch) = self.least, self.bounds
        # A thread that waits for its next batch gets batches that make the wait a small
        # share of them (up to `max_batch`): direct batches, one a thread, each wait a round trip.
        lo = max(1, math.ceil(max(min_batch, least, min(max_batch, self.waited / WAIT_SHARE)) / t))
        size = max(lo, min(math.ceil(max_batch / t), math.ceil(remaining / (4 * self.threads))))
        share = max(math.ceil(remaining / (slots or self.threads)), math.ceil(least / t))  # the tail, shared out
        return max(1, min(size, share, remaining))


class _Queue:
    """Item indices in order: the plan's own sequence, read from a position on (a `range`
    stays one range however many items it holds), behind the indices put back in front."""

    def __init__(self, indices: Sequence[int]):
        self._front: deque[int] = deque()
        self._rest, self._at = indices, 0

    def __len__(self) -> int:
        return len(self._front) + len(self._rest) - self._at

    def take(self, n: int) -> Sequence[int]:
        """The first `n` indices (fewer if there are fewer), removed: a `range` when consecutive."""
        front = [self._front.popleft() for _ in range(min(n, len(self._front)))]
        more = self._rest[self._at : self._at + n - len(front)]  # a range's slice is a range
        self._at += len(more)
        if not front:
            return more
        # Consecutive ones as a range: it pickles in a few bytes, and so does its items' slice.
        taken, run = [*front, *more], range(front[0], front[0] + len(front) + len(more))
        return run if taken == list(run) else taken

    def put_back(self, indices: Sequence[int]) -> None:
        """`indices` go back in front, in their order."""
        self._front.extendleft(reversed(indices))
