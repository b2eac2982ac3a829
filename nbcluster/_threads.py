"""The package's threads: `spawn` and `later` for runs and live views, `in_thread` for the server.

`spawn(fn, *args, name=...)` runs `fn` in a daemon thread kept for the next run.

Every run has a driver and a watch thread (`engine.py`). `threading.Thread.start` waits
until the new thread has run its first lines, and in a kernel whose Dask client's event
loop is busy that wait is a GIL hand-off or two, on the path of every small cell. A thread
that has finished a run waits here for the next one instead, and handing it the call is a
queue put.

A spare thread ends after a minute without work (`Spares`), so a kernel that stopped running
cells keeps no threads; there is no cap on how many run at once (runs started with ``--no-wait``
each have their own pair), so a call never waits for another to end.

`later(seconds, fn, ...)` runs the call once `seconds` have passed, unless it was cancelled
by then: a run's watch thread and its live view's poller have nothing to do in their first
half-second or quarter, and most small cells are over by then. A spare thread waits on the
call's cancel event with that timeout, so a cancel ends the wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

SPARE = "nbcluster-spare"  # the name of a thread waiting for work

_Call = tuple[Callable[..., Any], tuple[Any, ...], str, threading.Event]


class Spares:
    """Daemon threads that, having run a call, wait for the next one (the module's `spawn` and `later`).

    A caller that wants threads apart from the process's own (a test) makes its own.

    Parameters
    ----------
    idle : float
        Seconds a spare thread waits for its next call; it ends when none came.
    """

    def __init__(self, idle: float = 60.0) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Call]] = []  # each spare thread's inbox, newest last

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str) -> threading.Event:
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
        >>> from nbcluster._threads import spawn
        >>> done = spawn(print, "hello from a thread", name="example")
        >>> done.wait(5)
        hello from a thread
        True
        """
        done = threading.Event()
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            # The call goes through the inbox, not the thread's arguments, which the thread
            # would keep as long as it lives.
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True).start()
        inbox.put((fn, args, name, done))
        return done

    def later(self, seconds: float, fn: Callable[..., Any], *args: Any, name: str) -> Later:
        """``fn(*args)`` in a spare thread once `seconds` have passed, unless cancelled by then.

        The thread waits on the call's cancel event, so a cancel frees it at once.

        Parameters
        ----------
        seconds : float
            How long from now.
        fn : callable
            What to run (in a spare thread, as `spawn` runs it).
        *args : Any
            Its arguments.
        name : str
            The thread's name while it waits and while `fn` runs.

        Returns
        -------
        Later
            ``cancel()`` it to drop the call; its ``finished`` is set once the call has run
            (or was cancelled).

        Examples
        --------
        >>> from nbcluster._threads import later
        >>> call = later(60, print, "never printed", name="example")
        >>> call.cancel()
        True
        """
        entry = Later(fn, args)
        self.spawn(entry._when_due, seconds, name=name)
        return entry

    def _serve(self, inbox: queue.SimpleQueue[_Call]) -> None:
        """Run the calls `inbox` is handed until none comes for `idle` seconds; then end."""
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
                # Nothing of the call may stay referenced while this thread waits: a run's driver
                # is its engine's method, and the engine holds the run's results, and so a
                # --persist run's values on the workers, which `del` of the results must free.
                del fn, args, call
                me.name = SPARE
                with self._lock:  # spare before done: a run that starts as this one ends finds it
                    self._idle.append(inbox)
                done.set()
                del done
            try:
                call = inbox.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                call = inbox.get()  # handed a call as the wait ran out: it is in the inbox


class Later:
    """A call `later` will run when it is due, unless `cancel` comes first.

    Attributes
    ----------
    finished : threading.Event
        Set once the call has run, or was cancelled before it started.
    """

    __slots__ = ("_lock", "call", "cancelled", "finished")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]):
        self._lock = threading.Lock()
        self.call: tuple[Callable[..., Any], tuple[Any, ...]] | None = (fn, args)
        self.cancelled = threading.Event()
        self.finished = threading.Event()

    def cancel(self) -> bool:
        """Do not run the call; False if it started already.

        Returns
        -------
        bool
            True when the call will not run (now or ever).
        """
        with self._lock:
            if self.call is None and not self.cancelled.is_set():
                return False
            self.call = None  # let go of what the call holds at once
            self.cancelled.set()
        self.finished.set()
        return True

    def _when_due(self, seconds: float) -> None:
        """Run the call once `seconds` have passed, unless it was cancelled by then."""
        if self.cancelled.wait(seconds):
            return
        with self._lock:
            call, self.call = self.call, None  # None: cancelled (`cancel` clears it)
        if call is None:
            return
        try:
            call[0](*call[1])
        finally:
            del call
            self.finished.set()


_spares = Spares()
spawn = _spares.spawn
later = _spares.later


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
        try:
            outcome = functools.partial(future.set_result, func(*args, **kwargs))
        except BaseException as error:
            outcome = functools.partial(future.set_exception, error)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=work, name=f"nbcluster-{getattr(func, '__name__', 'call')}", daemon=True).start()
    return await future
