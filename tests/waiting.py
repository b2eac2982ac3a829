"""Waiting for a state the test cannot be told of by an event: a poll with a deadline.

Where a process, a file descriptor or a Dask event can be awaited, the tests await it; this
is for the rest (a scheduler's record, a cached answer going stale), polled briefly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_never = threading.Event()  # never set: a pause between polls that no signal handler cuts short


def until(
    condition: Callable[[], T],
    seconds: float = 30.0,
    interval: float = 0.01,
    ignore: tuple[type[Exception], ...] = (),
) -> T | None:
    """Poll `condition()` every `interval` seconds until it is true or `seconds` have passed.

    Returns its last value: true when the state came in time (a found value, for
    ``value = until(...)``), false when it did not, so ``assert until(...)`` fails then.
    A poll that raises one of `ignore` (a daemon not answering yet) counts as false (None).
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            value: T | None = condition()
        except ignore:
            value = None
        if value or time.monotonic() > deadline:
            return value
        _never.wait(interval)


def waited_for(
    condition: Callable[[], T], what: str, seconds: float = 30.0, ignore: tuple[type[Exception], ...] = ()
) -> T:
    """`until`, but a state that does not come fails the test with ``no WHAT within N s``."""
    value = until(condition, seconds, interval=0.1, ignore=ignore)
    if not value:
        raise AssertionError(f"no {what} within {seconds:g} s")
    return value
