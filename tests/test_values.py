"""A run's values read back right, whichever way they travelled (`worker/__init__.py`, `run/engine.py`).

What a user notices: every value reads back right, whichever item is read first, from
whichever thread, and after a retry over part of a batch (a resumed journal of such
batches: `test_journal.py`); values that are builtin data and values that are not
(objects) alike.
"""

from __future__ import annotations

import threading
from fractions import Fraction
from typing import Any

import nbcluster
from nbcluster.run.state import RunState


def test_a_retry_over_part_of_a_batch_keeps_the_rest_of_it() -> None:
    state = RunState(6)
    state.deliver(range(2), ["a", "b"], {}, {})
    state.deliver(range(2, 6), ["c", "d", "e", "f"], {}, {})
    state.begin([1, 2])  # a retry runs items 1 and 2 again: one batch across two
    state.deliver(range(1, 3), ["B", "C"], {}, {})
    state.end()
    assert list(state.values) == ["a", "B", "C", "d", "e", "f"]
    state.begin([4])
    state.deliver([4], ["E"], {}, {})  # item by item: a batch that is not a range
    state.end()
    assert list(state.values) == ["a", "B", "C", "d", "E", "f"]


def test_a_run_of_tiny_items_reads_back_from_many_threads(cluster: Any) -> None:
    res = nbcluster.distribute("x + 1", over="x in range(20_000)", namespace={})
    assert res.ok
    seen: list[bool] = []
    go = threading.Barrier(8)

    def read(offset: int) -> None:
        go.wait()
        seen.append(all(res[i] == i + 1 for i in range(offset, 20_000, 7)))

    threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [True] * 8
    assert res[12_345] == 12_346 and res[-1] == 20_000
    assert res.values() == list(res) == list(range(1, 20_001))


def test_values_that_are_not_builtin_data_travel_as_objects(cluster: Any) -> None:
    res = nbcluster.distribute("Fraction(x, 3) if x % 2 else x", over="x in range(50)",
                               namespace={"Fraction": Fraction})  # fmt: skip
    assert res.values() == [Fraction(x, 3) if x % 2 else x for x in range(50)]
    failing = nbcluster.distribute("10 // x", over="x in range(5)", namespace={})
    assert failing.values() == [None, 10, 5, 3, 2] and [e.index for e in failing.errors] == [0]
