"""Repeated `%%distribute` cells keep numpy arrays on the workers' heap (issue 21, defect 1).

Under Dask's `MALLOC_TRIM_THRESHOLD_` of 64 KiB, a worker's first `%%distribute` batch left
its heap so that every later free() gave the top back to the system: a numpy loop then
faulted every array's pages in afresh, 15,600 page faults an item instead of 96, and ran
25% slower for the rest of the worker's life. Page faults are counted here, not seconds
(bench/real_work.py has the timings): they do not depend on how busy the machine is.
"""

from __future__ import annotations

import statistics
from typing import Any

from nbcluster.run.api import distribute

# 100 rounds of four 400 KB arrays: about 40,000 pages if each were faulted in afresh.
NUMPY_LOOP = """
import resource
import numpy as np
before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
rng = np.random.default_rng(x)
for _ in range(100):
    a = rng.random(50_000)
    b = rng.random(50_000)
    int(np.count_nonzero(a * a + b * b <= 1.0))
resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
"""


def test_numpy_items_reuse_heap_memory_cell_after_cell(cluster: Any) -> None:
    distribute("x", over="x in range(4)", namespace={})  # a first, trivial cell
    faults = [statistics.median(distribute(NUMPY_LOOP, over="x in range(6)", namespace={})) for _ in range(3)]
    assert max(faults) < 2_000, faults
