"""Daemon threads kept for the next run: `spawn(fn, *args, name=...)` runs `fn` in one.

Every run has a driver and a watch thread (`engine.py`). `threading.Thread.start` waits
until the new thread has run its first lines, and in a kernel whose Dask client's event
loop is busy that wait is a GIL hand-off or two: 1-2 ms each, measured with py-spy over
a loop of 8-item cells (3.1 ms a cell for the two). A thread that has finished a run waits
here for the next one instead, and handing it the call is a queue put.

A spare thread ends after `IDLE_S` without work, so a kernel that stopped running cells
keeps no threads; there is no cap on how many run at once (runs started with ``--no-wait``
each have their own pair), so a call never waits for another to end.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

IDLE_S = 60.0  # a spare thread ends after this long without work
SPARE = "nbcluster-spare"  # the name of a thread waiting for work

_Call = tuple[Callable[..., Any], tuple[Any, ...], str, threading.Event]

_lock = threading.Lock()
_idle: list[queue.SimpleQueue[_Call]] = []  # each spare thread's inbox, newest last


def spawn(fn: Callable[..., Any], *args: Any, name: str) -> threading.Event:
    """Run ``fn(*args)`` in a daemon thread named `name`, a spare one if there is one.

    Parameters
    ----------
    fn : callable
        What to run. An exception it raises is printed to stderr, as a thread's would be.
    *args : Any
        Its arguments.
    name : str
        The thread's name while `fn` runs (what py-spy and ``threading.enumerate`` show).

    Returns
    -------
    threading.Event
        Set once `fn` has returned (or raised).

    Examples
    --------
    >>> from nbcluster.distribute.threads import spawn
    >>> done = spawn(print, "hello from a thread", name="example")
    >>> done.wait(5)
    hello from a thread
    True
    """
    done = threading.Event()
    call: _Call = (fn, args, name, done)
    with _lock:
        inbox = _idle.pop() if _idle else None
    if inbox is not None:
        inbox.put(call)
    else:
        # The call goes through the inbox, not the thread's arguments, which the thread would
        # keep as long as it lives.
        inbox = queue.SimpleQueue()
        inbox.put(call)
        threading.Thread(target=_serve, args=(inbox,), name=name, daemon=True).start()
    return done


def _serve(inbox: queue.SimpleQueue[_Call]) -> None:
    """Run the calls `inbox` is handed until none comes for `IDLE_S`; then end."""
    me = threading.current_thread()
    call = inbox.get()
    while True:
        fn, args, name, done = call
        me.name = name
        try:
            fn(*args)
        except BaseException:  # an nbcluster bug: shown, as an uncaught one in a thread is
            traceback.print_exc()
        finally:
            # Nothing of the call may stay referenced while this thread waits: a run's driver is
            # its engine's method, and the engine holds the run's results, and so a --persist
            # run's values on the workers, which `del` of the results must free.
            del fn, args, call
            me.name = SPARE
            with _lock:  # spare before done: a run that starts as this one ends finds it
                _idle.append(inbox)
            done.set()
            del done
        try:
            call = inbox.get(timeout=IDLE_S)
        except queue.Empty:
            with _lock:
                if inbox in _idle:
                    _idle.remove(inbox)
                    return
            call = inbox.get()  # handed a call as the wait ran out: it is in the inbox
