"""Waiting for a state the test cannot be told of by an event: a poll with a deadline.

Where a process, a file descriptor or a Dask event can be awaited, the tests await it; this
is for the rest (a scheduler's record, a cached answer going stale), polled briefly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(condition: Callable[[], Any], seconds: float = 30.0) -> bool:
    """Whether `condition()` became true within `seconds` (polled every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
