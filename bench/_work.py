"""The benchmarks' fixed CPU work: an item of about 10 ms, calibrated on this machine.

A loop of integer arithmetic (no allocation, no I/O) so that a busy machine shows as lost
efficiency rather than hiding in a wall-clock sleep. Workers cannot import this module (it is
not installed), so cloudpickle sends these functions by value, as it does a notebook's own.
"""

from __future__ import annotations

import sys
import time

import cloudpickle


def work(n: int) -> int:
    """Fixed CPU work: `n` iterations of integer arithmetic."""
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def calibrate(seconds: float = 0.01) -> int:
    """The `n` for which `work(n)` takes about `seconds` here, now."""
    n = 10_000
    while True:
        t = time.perf_counter()
        work(n)
        elapsed = time.perf_counter() - t
        if elapsed > 0.05:
            return int(n * seconds / elapsed)
        n *= 2


cloudpickle.register_pickle_by_value(sys.modules[__name__])
