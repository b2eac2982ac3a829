"""One background event loop for nbcluster's own control calls.

Control calls are coroutines (Dask's comms are async), but the API is synchronous and runs
in places that already own a running loop (an IPython kernel cell, the Jupyter server), where
`asyncio.run` is not allowed. A daemon thread with its own loop serves them all.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _ensure_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="nbcluster-control", daemon=True).start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run `coro` on the control loop and wait for it; Ctrl-C cancels it.

    Parameters
    ----------
    coro : Coroutine
        The coroutine to run on nbcluster's own event loop (a daemon thread).
    timeout : float, optional
        Seconds to wait; None waits as long as it takes.

    Returns
    -------
    T
        What the coroutine returned.

    Raises
    ------
    TimeoutError
        When `timeout` passed first (the coroutine is cancelled).
    """
    future = asyncio.run_coroutine_threadsafe(coro, _ensure_loop())
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise
