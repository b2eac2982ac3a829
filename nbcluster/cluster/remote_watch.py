"""Preloads that end nbcluster's processes on other hosts once what they serve is gone.

- **A nanny** (`dask_setup` on a `Nanny`) ends once its scheduler has been out of reach for its
  death timeout. Dask's ``death_timeout`` bounds a nanny's start only. Once running, a nanny
  lives as long as its worker, and a worker cut off from its scheduler with messages
  unacknowledged keeps its connection through TCP's retransmissions (about 15 minutes on
  Linux), or, with a task still running, waits for it; the nanny meanwhile restarts a worker
  that exits for any other reason. Five nannies on SSH hosts outlived their scheduler by 25
  minutes that way. The nanny asks the scheduler for an ``echo`` every ``death_timeout / 10``
  seconds (at least 0.5 s, at most 5 s, each answer awaited as long) through its own
  connection pool and TLS; once no answer has come for ``death_timeout``, it closes (which
  stops its worker) and its process exits.
- **A scheduler** (on a `Scheduler`, SSH only: the supervisor runs elsewhere) ends once the
  supervisor's client (named `SUPERVISOR_CLIENT`) has been gone for `SUPERVISOR_TIMEOUT`
  seconds: a supervisor killed with its kernel left the scheduler and every worker running.
  Its nannies then end by their own watch.

A close that hangs is cut short by a timer thread that kills the worker process and exits.

nbcluster ships this file's source, packed into one line of Python, as the preload
(`preload_text`), not its module name: Dask writes such a text to a file on the host and
imports that, so the watch runs on hosts where nbcluster itself is not installed. It
therefore imports only the standard library (and uses `distributed` through the server).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
import threading
import time
import zlib
from pathlib import Path
from typing import Any

logger = logging.getLogger("distributed.nanny")

#: Seconds the nanny's close may take before the process is ended regardless.
CLOSE_GRACE_S = 5.0


#: The name the supervisor gives its client (`distributed.Client(name=...)`).
SUPERVISOR_CLIENT = "nbcluster-supervisor"


def preload_text(supervisor_timeout: float | None = None) -> str:
    """This module's source as one line of Python: the preload entry nbcluster ships.

    One line, because Dask logs a preload's text as the nanny starts, and SSHCluster reads
    that log for the worker's address: a blank line there reads as a failed start.

    Parameters
    ----------
    supervisor_timeout : float, optional
        Arms the scheduler's watch: a scheduler running this preload closes once the
        supervisor's client has been gone this many seconds. None for a nanny's preload.

    Returns
    -------
    str
        One line of Python, free of single quotes, that defines this module's hooks.
    """
    packed = base64.b64encode(zlib.compress(Path(__file__).read_bytes(), 9)).decode()
    # No single quote in it: a job script passes it single-quoted (`shlex.quote`) as it is.
    armed = "" if supervisor_timeout is None else f"SUPERVISOR_TIMEOUT = {float(supervisor_timeout)!r}; "
    return f'{armed}import base64, zlib; exec(zlib.decompress(base64.b64decode("{packed}")))'


def dask_setup(server: Any) -> None:
    """Start the watch (Dask calls this in the server's event loop as it starts).

    Parameters
    ----------
    server : distributed.Nanny or distributed.Scheduler
        The process's server. A nanny watches its scheduler; a scheduler (with
        ``SUPERVISOR_TIMEOUT`` set) watches nbcluster's supervisor client.
    """
    if hasattr(server, "clients") and hasattr(server, "workers"):  # a scheduler
        timeout = globals().get("SUPERVISOR_TIMEOUT")
        if timeout:
            server._nbcluster_watch = asyncio.ensure_future(_watch_supervisor(server, float(timeout)))
        return
    nanny = server
    timeout = nanny.death_timeout
    if not timeout or not str(nanny.scheduler_addr).startswith(("tcp://", "tls://")):
        return
    # Held on the nanny: a task only the loop references may be garbage-collected.
    nanny._nbcluster_watch = asyncio.ensure_future(_watch(nanny, float(timeout)))


async def _watch(nanny: Any, timeout: float) -> None:
    interval = min(max(timeout / 10, 0.5), 5.0)
    last_answer = time.monotonic()
    while nanny.status.name not in ("closing", "closed", "failed"):
        left = last_answer + timeout - time.monotonic()
        await asyncio.sleep(max(min(interval, left), 0))
        try:
            await asyncio.wait_for(nanny.scheduler.echo(), interval)
            last_answer = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception:
            if time.monotonic() - last_answer >= timeout:
                logger.error(
                    "No answer from the scheduler at %s for %g s (the death timeout): closing the nanny",
                    nanny.scheduler_addr, timeout,
                )  # fmt: skip
                await _end(nanny)
                return


async def _watch_supervisor(scheduler: Any, timeout: float) -> None:
    from distributed.diagnostics.plugin import SchedulerPlugin

    interval = min(max(timeout / 10, 0.5), 5.0)
    prefix = f"Client-{SUPERVISOR_CLIENT}-"
    seen: list[float] = []  # armed once the supervisor has connected

    class Arm(SchedulerPlugin):
        # A hook, not the poll below: a supervisor gone within one interval of connecting
        # would never be seen.
        name = "nbcluster-supervisor-watch"

        def add_client(self, scheduler: Any, client: str) -> None:
            if str(client).startswith(prefix):
                seen[:] = [time.monotonic()]

    scheduler.add_plugin(Arm())
    if any(str(c).startswith(prefix) for c in scheduler.clients):
        seen[:] = [time.monotonic()]
    while scheduler.status.name not in ("closing", "closed", "failed"):
        await asyncio.sleep(interval)
        if any(str(c).startswith(prefix) for c in scheduler.clients):
            seen[:] = [time.monotonic()]
        elif seen and time.monotonic() - seen[0] >= timeout:
            logger.error("nbcluster's supervisor has been gone for %g s: closing the scheduler", timeout)
            await scheduler.close(reason="nbcluster-supervisor-gone")
            return


async def _end(nanny: Any) -> None:
    worker_pid = nanny.pid
    # A daemon timer, not the loop: it must fire even if the close blocks the loop.
    timer = threading.Timer(CLOSE_GRACE_S * 2, _exit_now, args=(worker_pid,))
    timer.daemon = True
    timer.start()
    try:
        await asyncio.wait_for(
            nanny.close(timeout=CLOSE_GRACE_S, reason="nbcluster-scheduler-unreachable"), CLOSE_GRACE_S * 2
        )
    except Exception:
        _exit_now(worker_pid)


def _exit_now(worker_pid: int | None) -> None:
    if worker_pid:
        with contextlib.suppress(OSError):  # already gone
            os.kill(worker_pid, signal.SIGKILL)
    os._exit(1)
