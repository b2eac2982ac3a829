"""The scheduling policy of one start of a run: events in, batches and verdicts out.

The driver (`engine.py`) owns the transport and the futures; this module owns the
decisions, and touches neither Dask nor a thread, so it is tested by feeding it events
(`tests/test_policy.py`).

Policy
------
- **Backlog.** The items not yet submitted wait here, in order; an item put back (a retry,
  an item a stopped batch did not reach, a batch a worker refused) goes back in front.
- **Batches in flight.** At most `limit` batches are out at once: `per_thread` (the
  ``distribute.in-flight`` setting, 2) per usable worker thread, so a thread always has its
  next batch waiting on it. `top_up` gives the batches to submit now, sized by the
  `batching.Batcher` (probes first, then from measured item times); `finished` feeds the
  sizer the time a batch measured.
- **Retries.** A failed item runs again while it has attempts left (``--retries``); it is
  then held back from delivery (`finished` returns it) and goes back in front.
- **Suspects.** A batch whose workers kept dying (Dask's ``KilledWorker``) is split in
  halves, the *suspects*, and a suspect runs *alone*: nothing else of the run is out while it
  runs, because Dask counts a death against every task a worker holds. A batch of one item
  killed while it ran alone is the culprit: `killed` returns it, to be failed.
- **Workers that come and go.** `resize` sets the usable threads: `limit` grows and shrinks.

State: `items` (the backlog, as runs of consecutive indices), `suspects`, `attempts` (by
the failed items only), `batcher`, `limit`.

Worked example: 2 threads, 2 in flight each, 13 items, one retry. The first top-up sends
the first item alone (its result arrives after one item's time), then one probe per thread
takes a third of the rest; the last third waits for a batch to come back (`batching.py`).

>>> from nbcluster.run.batching import Batcher
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

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from nbcluster.run.batching import Batcher


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
        self.retries = retries
        self.attempts: dict[int, int] = {}  # attempts used, by the failed items only (no dict of a million)
        self.batcher = batcher
        self.per_thread = max(1, per_thread)
        self.limit = self.per_thread * batcher.threads  # batches out at once

    # -- events --------------------------------------------------------------------------------
    def top_up(self, out: int) -> list[Sequence[int]]:
        """The batches to submit now, with `out` batches already out.

        While there are suspects, one of them, and only once nothing is out.

        Parameters
        ----------
        out : int
            Batches submitted and not yet finished.

        Returns
        -------
        list of sequence of int
            Each batch's items (a `range` when consecutive); empty when nothing goes now.
        """
        if self.suspects:
            return [self.suspects.popleft()] if out == 0 else []
        batches: list[Sequence[int]] = []
        while self.items and out + len(batches) < self.limit:
            size = self.batcher.next_size(len(self.items), self.limit - out - len(batches))
            if not size and (out or batches):
                break  # the share kept behind the first item waits for a batch to come back
            batches.append(self.items.take(max(size, 1)))
        return batches

    def finished(
        self, indices: Sequence[int], *, reached: int, failed: Iterable[int] = (), seconds: float | None = None,
        idle: float | None = None,
    ) -> list[int]:  # fmt: skip
        """A batch came back; the failed items that get another attempt.

        Those, and the items the batch did not reach (its time budget was spent), go back in
        front of the backlog.

        Parameters
        ----------
        indices : sequence of int
            The batch's items.
        reached : int
            How many of them it ran (the first `reached`).
        failed : iterable of int
            The positions in the batch of the items that failed.
        seconds : float or None
            Time the worker spent in the items it ran; None when not measured.
        idle : float or None
            How long its worker thread waited for it (`batching.Batcher.observe`).

        Returns
        -------
        list of int
            The items to hold back from delivery: they run again.
        """
        if seconds is not None:
            self.batcher.observe(reached, seconds, idle=idle)
        retry = [indices[j] for j in failed if self._may_retry(indices[j])]
        self.put_back(retry + list(indices[reached:]))
        return retry

    def killed(self, indices: Sequence[int], *, alone: bool) -> list[int]:
        """A batch whose workers kept dying; the items to fail (the culprit), if found.

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
        items = list(indices)  # not an attempt: which item it was is not known yet
        half = (len(items) + 1) // 2
        self.suspects.extend(part for part in (items[:half], items[half:]) if part)
        return []

    def refused(self, indices: Sequence[int]) -> None:
        """A batch came back unrun (refused, or sent again elsewhere): not an attempt of its items.

        Parameters
        ----------
        indices : sequence of int
            The batch's items, back in front of the backlog.
        """
        self.put_back(list(indices))
        if not self.batcher.items:
            self.batcher.alone_first = True  # no first item came: the next batch is one

    def resize(self, threads: int) -> None:
        """The cluster now has `threads` usable threads (workers joined or left).

        Parameters
        ----------
        threads : int
            Usable worker threads (at least 1 is assumed).
        """
        self.batcher.threads = max(threads, 1)
        self.limit = self.per_thread * max(threads, 1)

    def drain(self) -> list[int]:
        """Every item not yet submitted, taken out: the run fails or gives them up.

        Returns
        -------
        list of int
            The suspects' items, then the backlog's.
        """
        taken = [*(i for part in self.suspects for i in part), *self.items]
        self.items.clear()
        self.suspects.clear()
        return taken

    # -- state -----------------------------------------------------------------------------------
    def held(self) -> int:
        """Items not submitted yet (the backlog's and the suspects').

        Returns
        -------
        int
            Their count, for the adaptive target's backlog report.
        """
        return len(self.items) + sum(len(part) for part in self.suspects)

    def put_back(self, indices: Sequence[int]) -> None:
        """`indices` go back in front of the backlog, in their order.

        Parameters
        ----------
        indices : sequence of int
            Items to submit again (not an attempt of theirs).
        """
        if indices:
            self.items.put_back(indices)

    def _may_retry(self, i: int) -> bool:
        used = self.attempts.get(i, 0)
        if used >= self.retries:
            return False
        self.attempts[i] = used + 1
        return True


class _Queue:
    """Item indices in order, held as runs of consecutive ones (ranges), not one int each.

    A backlog of 1,000,000 items is then one range, not a deque of a million ints (~36 MB
    in the kernel); a batch's indices exist as a list only while it is made.
    """

    def __init__(self, indices: Sequence[int]):
        self._runs: deque[range] = deque(_runs(indices))
        self._count = len(indices)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self._runs)

    def take(self, n: int) -> Sequence[int]:
        """The first `n` indices (fewer if there are fewer), removed: a `range` when consecutive."""
        runs = self._runs
        if runs and len(runs[0]) >= n:
            run = runs[0]
            taken, runs[0] = run[:n], run[n:]
            if not runs[0]:
                runs.popleft()
            self._count -= len(taken)
            return taken
        out: list[int] = []
        while runs and len(out) < n:
            run = runs[0]
            want = n - len(out)
            if len(run) <= want:
                out.extend(runs.popleft())
            else:
                out.extend(run[:want])
                runs[0] = run[want:]
        self._count -= len(out)
        return out

    def put_back(self, indices: Sequence[int]) -> None:
        """`indices` go back in front, in their order."""
        self._runs.extendleft(reversed(_runs(indices)))
        self._count += len(indices)

    def clear(self) -> None:
        self._runs.clear()
        self._count = 0


def _runs(indices: Sequence[int]) -> list[range]:
    """`indices` as ranges of consecutive ones, in order."""
    if isinstance(indices, range):
        return [indices] if len(indices) else []
    runs: list[range] = []
    start = previous = None
    for i in indices:
        if previous is not None and i == previous + 1:
            previous = i
            continue
        if start is not None and previous is not None:
            runs.append(range(start, previous + 1))
        start = previous = i
    if start is not None and previous is not None:
        runs.append(range(start, previous + 1))
    return runs
