"""How long a worker thread waited between two batches of one run.

A thread that ends a batch and then waits for the run's next one is idle for a task's
overhead: the result's way to the kernel, the kernel sizing and sending the next batch,
the scheduler handing it out. Pipelining (`in-flight` batches a thread) hides it when it
is shorter than a batch; when it is not (a scheduler serving a thousand threads, a busy
kernel), the thread waits, and bigger batches are the cure (`batching.py`). Measured on
the thread itself, with its own clock: no clocks of two machines compared.
"""

from __future__ import annotations

import threading
import time

_last = threading.local()  # (stop token, perf_counter at the end of the thread's last batch)


def since_last(token: str | None) -> float | None:
    """Seconds since this thread ended its last batch of the run with `token`.

    Parameters
    ----------
    token : str or None
        The run's stop token, which names the run; None: not known.

    Returns
    -------
    float or None
        The thread's idle time before this batch; None for its first batch of the run.
    """
    last: tuple[str | None, float] | None = getattr(_last, "ended", None)
    if token is None or last is None or last[0] != token:
        return None
    return time.perf_counter() - last[1]


def ended(token: str | None) -> None:
    """This thread has just ended a batch of the run with `token`.

    Parameters
    ----------
    token : str or None
        The run's stop token.
    """
    _last.ended = (token, time.perf_counter())
