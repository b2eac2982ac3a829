"""What a fresh run pays to ask whether the previous journal of the same run is unfinished.

`store._hint` asks it before every run that is not `--resume`. It compares reading the
whole journal (`journal.load(..., values=False)`, as before) with reading its last record
only (`journal.ended_complete`), on a complete journal of 20,000 tiny items in 100 batches.

Run: ``python bench/journal_hint.py``. It writes its journal into a temporary folder.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable

import dask.config

from nbcluster.journal import store as journal

ITEMS, BATCH, CALLS = 20_000, 200, 30


def median_ms(call: Callable[[], object]) -> float:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    with tempfile.TemporaryDirectory() as folder, dask.config.set({"nbcluster.journal.path": folder}):
        writer = journal.create("ab" * 16, ITEMS, "x + 1")
        assert writer is not None
        for b in range(0, ITEMS, BATCH):
            writer.write(range(b, b + BATCH), [i + 1 for i in range(b, b + BATCH)], {}, {}, "the cluster", None, None)
        writer.end(ITEMS, ITEMS)
        (path,) = journal.journals("ab" * 16)
        whole = median_ms(lambda: journal.load(path, values=False))
        last = median_ms(lambda: journal.ended_complete(path))
    print(f"{ITEMS:,} items in {ITEMS // BATCH} batches, median of {CALLS}:")
    print(f"  journal.load(values=False)  {whole:.2f} ms")
    print(f"  journal.ended_complete      {last:.3f} ms  ({whole / last:.0f}x less)")


if __name__ == "__main__":
    main()
