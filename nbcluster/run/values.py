"""A run's values in the kernel, each batch of builtin data kept as the bytes it came in.

A batch whose values are all builtin data arrives as one pickled list (`worker/plain.py`).
Unpickling a million ints costs ~30 ms and makes a million objects, and most runs of tiny
items are read once, in part, or not at all; so such a batch is kept as that blob, a
`Packed`, and unpickled the first time any of its items is read. Its bytes are also what
the journal writes, as they are.

`Values` is the run's list: one slot per item, plus the packed batches not read yet, as
sorted, non-overlapping segments ``[start, start + len)``. Reading an item inside a segment
unpickles the whole segment into the slots (a batch is read together far more often than
one item alone) and drops its blob. Writing over a segment unpacks it first, so an item
is never both in a slot and in a blob.

Writers are the run's engine (the `RunState` lock held); readers may be any thread, so
unpacking takes the lock of its own: a reader never sees a segment half-unpacked.
"""

from __future__ import annotations

import bisect
import pickle
import threading
from collections.abc import Iterator, Sequence
from typing import Any, overload


class Packed(Sequence[Any]):
    """One batch's values, as the pickled list a worker sent (`worker/plain.py`).

    A sequence: reading it unpickles the blob once (what code that needs the values does);
    `RunState` instead keeps `blob` as it is until an item is read.

    Parameters
    ----------
    blob : bytes
        The values pickled as one list of builtin data.
    count : int
        How many values it holds.

    Examples
    --------
    >>> import pickle
    >>> packed = Packed(pickle.dumps([1, 2, 3]), 3)
    >>> len(packed), packed[1], list(packed)
    (3, 2, [1, 2, 3])
    """

    __slots__ = ("_list", "_n", "blob")

    def __init__(self, blob: bytes, count: int):
        self.blob = blob
        self._n = count
        self._list: list[Any] | None = None

    def unpack(self) -> list[Any]:
        """The values, unpickled (once).

        Returns
        -------
        list
            One value per item.
        """
        if self._list is None:
            self._list = pickle.loads(self.blob)
        return self._list

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        return self.unpack()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.unpack())


class Values:
    """The values of a run's items: slots, and packed batches not read yet.

    Parameters
    ----------
    n : int
        Items in the run; each slot starts as None.

    Examples
    --------
    >>> import pickle
    >>> values = Values(5)
    >>> values.put(0, ["a", "b"])
    >>> values.put(2, Packed(pickle.dumps([10, 11, 12]), 3))
    >>> values.packed_items()
    3
    >>> values[3], values.packed_items()  # reading an item unpacks its batch
    (11, 0)
    >>> list(values)
    ['a', 'b', 10, 11, 12]
    """

    __slots__ = ("_lock", "_packed", "_slots", "_starts")

    def __init__(self, n: int):
        self._slots: list[Any] = [None] * n
        self._starts: list[int] = []  # sorted; _packed[k] holds items _starts[k] onwards
        self._packed: list[Packed] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, i: int) -> Any:
        if self._starts:  # only while some batch is still packed
            self._unpack_range(i, i + 1)
        return self._slots[i]

    def __iter__(self) -> Iterator[Any]:
        if self._starts:
            self._unpack_range(0, len(self._slots))
        return iter(self._slots)

    def tolist(self) -> list[Any]:
        """Every slot, unpacked, as a new list (a copy at C speed: ~3 ms a million items).

        Returns
        -------
        list
            One value per item (None where none was stored).
        """
        if self._starts:
            self._unpack_range(0, len(self._slots))
        return self._slots[:]

    def __repr__(self) -> str:
        return f"<Values of {len(self)} items, {self.packed_items()} of them packed>"

    def packed_items(self) -> int:
        """How many items are still held packed (not unpickled yet).

        Returns
        -------
        int
            Items in packed batches.
        """
        with self._lock:
            return sum(len(p) for p in self._packed)

    def put(self, start: int, values: Sequence[Any]) -> None:
        """Store consecutive items' values from `start` on: a `Packed` stays packed.

        Parameters
        ----------
        start : int
            The first item's index.
        values : sequence
            Their values; a `Packed` is kept as its blob until an item of it is read.
        """
        stop = start + len(values)
        self._unpack_range(start, stop)  # a retry's items over a batch not read yet
        if isinstance(values, Packed):
            with self._lock:
                k = bisect.bisect_left(self._starts, start)
                self._starts.insert(k, start)
                self._packed.insert(k, values)
        else:
            self._slots[start:stop] = values

    def writable(self, indices: Sequence[int]) -> list[Any]:
        """The slots, for storing `indices` one by one: no packed batch covers them any more.

        Parameters
        ----------
        indices : sequence of int
            The items about to be written.

        Returns
        -------
        list
            The slots themselves: write ``slots[i] = value``.
        """
        if self._starts and len(indices):
            self._unpack_range(min(indices), max(indices) + 1)
        return self._slots

    def _unpack_range(self, start: int, stop: int) -> None:
        """Unpickle every packed batch with an item in ``[start, stop)`` into the slots."""
        with self._lock:
            # The first candidate is the segment starting at or before `start`.
            k = max(bisect.bisect_right(self._starts, start) - 1, 0)
            while k < len(self._starts) and self._starts[k] < stop:
                first, packed = self._starts[k], self._packed[k]
                if first + len(packed) <= start:
                    k += 1
                    continue
                self._slots[first : first + len(packed)] = packed.unpack()
                del self._starts[k], self._packed[k]
