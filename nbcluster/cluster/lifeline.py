"""`Lifeline`: a supervisor leaves within 2 s of being told to, whatever it is doing.

A supervisor must stop, and take its workers with it, when it gets SIGTERM, SIGINT or SIGHUP
or when its owner process dies - in every phase: waiting for its request, claiming a name,
building the cluster, starting workers, running. Two things make that hard with asyncio
alone: ``loop.add_signal_handler`` callbacks run only when the event loop gets control, and
an owner watch written as a task runs only then too. Start-up code that keeps the loop busy
(a huge worker plan, a slow preload, a stuck handshake) would make both wait.

So the lifeline works beside the loop, not in it:

- signals go to a plain `signal.signal` handler, which Python runs in the main thread
  between two bytecodes (so also inside a busy loop) and which calls `trigger`;
- the owner is polled by a daemon thread, which calls `trigger` when it is gone;
- `trigger` asks the loop for a graceful stop (``on_stop``, thread-safe) and starts a
  watchdog thread: if the supervisor has not called `done` within `GRACE_S`, the watchdog
  kills every process below it, removes its registry entry and credentials, keeps the
  log of an unfinished start (`startlog.keep_failed`), and ends the process with
  ``os._exit``. Threads get the GIL every few milliseconds even from a busy
  main thread, so the deadline holds.

Before a loop is attached (the supervisor is still waiting for its request) there is
nothing to stop gracefully: `trigger` deletes the start log and exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from nbcluster.cluster import registry, startlog

#: Seconds a graceful stop may take before the watchdog ends the process.
GRACE_S = 1.0
OWNER_POLL_S = 0.5
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Lifeline:
    """How a supervisor ends: on a signal, or when its owner exits, gracefully if it can.

    Parameters
    ----------
    log : Path
        The supervisor's start log (removed when it ends before starting anything).
    """

    def __init__(self, log: Path):
        self.log = log
        self.reason: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_stop: Callable[[], None] | None = None
        self._claimed: tuple[Path, str] | None = None
        self._done = threading.Event()
        # Re-entrant: the signal handler runs in the main thread, possibly while `attach`
        # there holds the lock.
        self._lock = threading.RLock()

    def install_signals(self) -> None:
        """Stop on SIGTERM, SIGINT and SIGHUP (from the main thread)."""
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.trigger(f"signal {signal.Signals(signum).name}")

    def attach(self, loop: asyncio.AbstractEventLoop, on_stop: Callable[[], None]) -> None:
        """From now on a stop is first asked of `on_stop`, run on `loop`.

        Parameters
        ----------
        loop : asyncio.AbstractEventLoop
            The loop the cluster runs on.
        on_stop : callable
            Closes the cluster (called once, on `loop`); a stop already pending calls it now.
        """
        with self._lock:
            self._loop, self._on_stop = loop, on_stop
            pending = self.reason is not None
        if pending:
            loop.call_soon_threadsafe(on_stop)

    def claimed(self, directory: Path, name: str) -> None:
        """The registry entry the watchdog removes if it has to end the process.

        Parameters
        ----------
        directory : Path
            The registry folder.
        name : str
            The cluster's name.
        """
        self._claimed = (directory, name)

    def watch_owner(self, pid: int, started: float | None) -> None:
        """Stop when process `pid` exits (a thread polls it).

        Parameters
        ----------
        pid : int
            The owner's pid.
        started : float or None
            Its start time, so that a reused pid is not taken for it.
        """

        def poll() -> None:
            while not self._done.wait(OWNER_POLL_S):
                if not registry.process_alive(pid, started):
                    self.trigger(f"its owner (pid {pid}) exited")
                    return

        threading.Thread(target=poll, name="nbcluster-owner-watch", daemon=True).start()

    def trigger(self, reason: str) -> None:
        """Stop: gracefully if the loop manages within `GRACE_S`, else by force.

        Parameters
        ----------
        reason : str
            Why, for the log (``its owner (pid 123) exited``). Only the first call counts.
        """
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            loop, on_stop = self._loop, self._on_stop
        if loop is None or on_stop is None:
            # Still waiting for a request: nothing started, nothing to clean up but the log.
            with contextlib.suppress(OSError):
                self.log.unlink()
            os._exit(0)
        _note(f"stopping: {reason}")
        threading.Thread(target=self._watchdog, name="nbcluster-watchdog", daemon=True).start()
        with contextlib.suppress(RuntimeError):  # the loop already closed: the watchdog ends it
            loop.call_soon_threadsafe(on_stop)

    def done(self) -> None:
        """The supervisor has cleaned up and is returning: the watchdog stands down."""
        self._done.set()

    def _watchdog(self) -> None:
        if self._done.wait(GRACE_S):
            return
        # From here on the main thread may be spinning: every system call releases the GIL
        # and waits a switch interval (5 ms, more on a loaded machine) to get it back, so
        # the work is a handful of calls, and the main thread is asked to yield sooner.
        sys.setswitchinterval(1e-4)
        _note(f"not stopped within {GRACE_S:g} s: killing the workers and exiting")
        if self._claimed is not None:
            registry.remove(*self._claimed)
        # Still named .start-*: the start never finished, so its log is a failure's.
        startlog.keep_failed(self.log)
        if os.getpgid(0) == os.getpid():
            # Launched by `nbcluster.start` in a session of its own: the process group is
            # this process and its workers, and one call ends them all, this one included.
            os.killpg(os.getpid(), signal.SIGKILL)
        kill_descendants()
        os._exit(1)


def _note(text: str) -> None:
    # Stderr is the supervisor's log: a line there says why a cluster went away.
    with contextlib.suppress(OSError, ValueError):
        print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} - nbcluster.lifeline - {text}", file=sys.stderr, flush=True
        )


def kill_descendants() -> None:
    """SIGKILL every process below this one (the workers and their helpers).

    psutil walks all of /proc to find them: fine from the event loop, slow from a thread
    competing with a busy main thread (see `Lifeline._watchdog`).
    """
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=0.2)
