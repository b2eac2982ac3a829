"""Worker side: telling a run's batches to stop, and noticing a cancelled Dask task.

A batch carries its run's *stop token*; `stop(token)` (run on every worker by
`worker.stop_run`) adds it to `_STOPPED`, which a batch looks up before each chunk of
items, a few ms of work (`items.py`). A batch whose Dask task was cancelled outright also
stops: `cancelled()` asks the worker's task state, which the batch does every `CHECK_S`
seconds.
"""

from __future__ import annotations

from collections import OrderedDict

CHECK_S = 0.05  # how often a running batch asks whether its Dask task was cancelled
_STOPPED: OrderedDict[str, None] = OrderedDict()  # stop tokens of runs told to stop, newest last
_KEEP_STOPPED = 256


def stop(token: str) -> None:
    """Remember that the run with this stop token must stop (the oldest tokens are forgotten).

    Called in the worker's event loop; batches read `_STOPPED` from their threads, which a
    dict under the GIL allows.

    Parameters
    ----------
    token : str
        The run's stop token, as its batches carry it.
    """
    _STOPPED[token] = None
    while len(_STOPPED) > _KEEP_STOPPED:
        _STOPPED.popitem(last=False)


def stopped(token: str | None) -> bool:
    """True when the run with this token was told to stop.

    Parameters
    ----------
    token : str or None
        The batch's stop token; None (a batch without one) is never stopped.

    Returns
    -------
    bool
        Whether `stop` was called with `token` (among the last 256 tokens).
    """
    return token in _STOPPED


def cancelled() -> bool:
    """True when this thread's Dask task was cancelled (best effort; False outside Dask).

    Returns
    -------
    bool
        True when the worker no longer has the running task, or has it cancelled, released or
        forgotten; False when it runs on, outside a Dask task, or when asking fails.
    """
    try:
        from nbcluster._compat import running_task_key, worker_task

        key = running_task_key()
        if key is None:
            return False
        ts = worker_task(key)
        return ts is None or ts.state in ("cancelled", "released", "forgotten")
    except Exception:
        return False
