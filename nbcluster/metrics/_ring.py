"""A bounded ring of records stamped with sequence numbers, read back "since a cursor".

Several rings share one sequence counter (the plugin owns it), so a single integer cursor
covers all of them. Reading walks from the newest record backwards and stops at the first
one older than the cursor: a poll that asks for the last half second of records costs in
proportion to what it returns, not to the ring's size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class SeqRing(Generic[T]):
    """At most `capacity` `(seq, record)` pairs; appending to a full ring drops the oldest."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self._items: deque[tuple[int, T]] = deque(maxlen=capacity)
        # Highest sequence number pushed out of the ring; -1 while nothing has been lost.
        self.dropped = -1

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return (record for _, record in self._items)

    @property
    def capacity(self) -> int:
        """The most records the ring holds before it drops the oldest."""
        assert self._items.maxlen is not None
        return self._items.maxlen

    def append(self, seq: int, record: T) -> None:
        """Add `record`, dropping the oldest when the ring is full.

        Parameters
        ----------
        seq : int
            Its sequence number: larger than every one already here.
        record : T
            The record.
        """
        if len(self._items) == self._items.maxlen:
            self.dropped = self._items[0][0]
        self._items.append((seq, record))

    def since(self, cursor: int | None) -> list[T]:
        """Records with ``seq >= cursor``, oldest first.

        Parameters
        ----------
        cursor : int or None
            The first sequence number wanted; None for everything held.

        Returns
        -------
        list
            The records.
        """
        if cursor is None:
            return [record for _, record in self._items]
        out = []
        for seq, record in reversed(self._items):
            if seq < cursor:
                break
            out.append(record)
        out.reverse()
        return out

    def lost_since(self, cursor: int | None) -> bool:
        """Whether records a reader at `cursor` has not seen were already dropped.

        Parameters
        ----------
        cursor : int or None
            The reader's cursor; None (a first read) has lost nothing.

        Returns
        -------
        bool
            True when the reader missed records.
        """
        return cursor is not None and cursor <= self.dropped
