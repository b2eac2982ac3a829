"""A run's values held as the bytes they came in until read (`values.py`, issue 22 point 2).

What a user notices: every value reads back right, whichever item is read first, from
whichever thread, and after a retry over part of a batch (a resumed journal of such
batches: `test_journal.py`); a run of tiny items holds its finished
batches packed, not as a million Python objects, until read.
"""

from __future__ import annotations

import pickle
import threading
from fractions import Fraction
from typing import Any

import nbcluster
from nbcluster.run.state import RunState
from nbcluster.run.values import Packed, Values


def packed(values: list[Any]) -> Packed:
    return Packed(pickle.dumps(values, protocol=5), len(values))


def test_a_packed_batch_unpacks_only_when_one_of_its_items_is_read() -> None:
    values = Values(9)
    values.put(0, packed([0, 1, 2]))
    values.put(3, packed([3, 4, 5]))
    values.put(6, [6, 7, 8])
    assert values.packed_items() == 6
    assert values[4] == 4
    assert values.packed_items() == 3  # the batch of item 4 only
    assert list(values) == list(range(9)) and values.packed_items() == 0


def test_a_retry_over_part_of_a_packed_batch_keeps_the_rest_of_it() -> None:
    state = RunState(6)
    state.deliver(range(2), packed(["a", "b"]), {}, {})
    state.deliver(range(2, 6), packed(["c", "d", "e", "f"]), {}, {})
    state.begin([1, 2])  # a retry runs items 1 and 2 again: one batch across two
    state.deliver(range(1, 3), packed(["B", "C"]), {}, {})
    state.end()
    assert list(state.values) == ["a", "B", "C", "d", "e", "f"]
    state.begin([4])
    state.deliver([4], ["E"], {}, {})  # item by item: a batch that is not a range
    state.end()
    assert list(state.values) == ["a", "B", "C", "d", "E", "f"]


def test_readers_on_many_threads_all_see_every_value() -> None:
    n, size = 40_000, 1_000
    values = Values(n)
    for start in range(0, n, size):
        values.put(start, packed(list(range(start, start + size))))
    seen: list[bool] = []
    go = threading.Barrier(8)

    def read(offset: int) -> None:
        go.wait()
        seen.append(all(values[i] == i for i in range(offset, n, 7)))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [True] * 8


def test_a_run_of_tiny_items_holds_its_values_packed_until_read(cluster: Any) -> None:
    res = nbcluster.distribute("x + 1", over="x in range(20_000)", namespace={})
    assert res.ok
    state = res._state
    assert state.values.packed_items() == 20_000  # every batch as the bytes it came in
    assert res[12_345] == 12_346 and res[-1] == 20_000
    assert 0 < state.values.packed_items() < 20_000
    assert res.values() == list(range(1, 20_001)) and state.values.packed_items() == 0


def test_values_that_are_not_builtin_data_travel_as_objects(cluster: Any) -> None:
    res = nbcluster.distribute("Fraction(x, 3) if x % 2 else x", over="x in range(50)",
                               namespace={"Fraction": Fraction})  # fmt: skip
    assert res.values() == [Fraction(x, 3) if x % 2 else x for x in range(50)]
    assert res._state.values.packed_items() == 0
    failing = nbcluster.distribute("10 // x", over="x in range(5)", namespace={})
    assert failing.values() == [None, 10, 5, 3, 2] and [e.index for e in failing.errors] == [0]
