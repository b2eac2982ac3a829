"""Blocking calls of the Python API, awaited from the Jupyter server's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call of the Python API in a daemon thread and await its result.

    Not the loop's default executor: Python joins those threads at exit, so a cluster
    start in progress (up to `nbcluster.timeouts.start`) would hold up the Jupyter
    server's shutdown. A daemon thread is abandoned at exit instead; the supervisor it
    was talking to watches the server's pid and stops by itself (`Lifeline`).

    Parameters
    ----------
    func : callable
        The blocking call.
    *args, **kwargs
        Its arguments.

    Returns
    -------
    T
        What `func` returned (what it raised is raised here).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def work() -> None:
        outcome: Callable[[], None]
        try:
            result = func(*args, **kwargs)
        except BaseException as error:
            outcome = functools.partial(future.set_exception, error)
        else:
            outcome = functools.partial(future.set_result, result)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=work, name=f"nbcluster-{getattr(func, '__name__', 'call')}", daemon=True).start()
    return await future
