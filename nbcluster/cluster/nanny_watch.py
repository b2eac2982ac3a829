"""A nanny preload that ends the nanny once its scheduler has been out of reach for its death timeout.

Dask's ``death_timeout`` bounds a nanny's start only. Once running, a nanny lives as long
as its worker, and a worker cut off from its scheduler with messages unacknowledged keeps
its connection through TCP's retransmissions (about 15 minutes on Linux), or, with a task
still running, waits for it; the nanny meanwhile restarts a worker that exits for any other
reason. Five nannies on SSH hosts outlived their scheduler by 25 minutes that way.

This module asks the scheduler for an ``echo`` every ``death_timeout / 10`` seconds (at
least 0.5 s, at most 5 s, each answer awaited as long) through the nanny's own connection
pool, with the nanny's TLS. Once no answer has come for ``death_timeout``, the nanny closes
(which stops its worker) and its process exits; a close that hangs is cut short by a timer
thread that kills the worker process and exits.

nbcluster ships this file's source, packed into one line of Python, as the preload
(`preload_text`), not its module name: Dask writes such a text to a file on the host and
imports that, so the watch runs on hosts where nbcluster itself is not installed. It
therefore imports only the standard library (and uses `distributed` through the nanny).
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


def preload_text() -> str:
    """This module's source as one line of Python: the ``distributed.nanny.preload`` entry nbcluster ships.

    One line, because Dask logs a preload's text as the nanny starts, and SSHCluster reads
    that log for the worker's address: a blank line there reads as a failed start.
    """
    packed = base64.b64encode(zlib.compress(Path(__file__).read_bytes(), 9)).decode()
    # No single quote in it: a job script passes it single-quoted (`shlex.quote`) as it is.
    return f'import base64, zlib; exec(zlib.decompress(base64.b64decode("{packed}")))'


def dask_setup(nanny: Any) -> None:
    """Start the watch (Dask calls this in the nanny's event loop as it starts)."""
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
