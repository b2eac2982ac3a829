"""Supervisor start logs: kept only when a start fails, and only the last few.

A supervisor's stdout and stderr (which its workers inherit) go to ``.start-<id>.log`` in
the registry folder from the moment it is launched. Then:

- the start succeeds: the file becomes the running cluster's ``<name>.log``, removed with
  its registry entry when the cluster stops;
- the name is taken, or the launcher goes away before asking for a cluster: nothing went
  wrong worth reading, the file is deleted;
- anything else (an error, the start timeout, a crash): the file is renamed
  ``failed-start-<time>-<id>.log`` and the error names it; the oldest such files beyond
  `nbcluster.logs.failed-starts` are deleted, so they never pile up.

A supervisor killed before it could do any of this (SIGKILL, or a signal while it is still
importing) leaves its ``.start-`` file behind. The launcher therefore takes an exclusive
`flock` on the log's open file, which the supervisor and its workers inherit as their
stdout: the lock lasts exactly as long as some process of that cluster lives. A ``.start-``
file nobody holds the lock on is stale, and `prune_stale` (run at each launch) deletes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from pathlib import Path

from nbcluster import config
from nbcluster.cluster import registry

STARTING = ".start-"
FAILED = "failed-start-"


def new_path(directory: Path) -> Path:
    """Where a supervisor being launched writes until its cluster is up.

    Parameters
    ----------
    directory : Path
        The registry folder.

    Returns
    -------
    Path
        A new ``.start-XXXXXXXX.log`` path in it.
    """
    return directory / f"{STARTING}{uuid.uuid4().hex[:8]}.log"


def keep_failed(log: Path) -> Path | None:
    """Keep a failed start's log under a name that says so; None if there is none.

    Both the supervisor and the process that launched it may call this for the same start
    (whichever notices first); the second gets the name the first chose.

    Parameters
    ----------
    log : Path
        The start's log.

    Returns
    -------
    Path or None
        The kept log's new path.
    """
    ident = log.name.removeprefix(STARTING).removesuffix(".log")
    kept = log.with_name(f"{FAILED}{time.strftime('%Y%m%d-%H%M%S')}-{ident}.log")
    try:
        log.rename(kept)
    except FileNotFoundError:
        return next(iter(log.parent.glob(f"{FAILED}*-{ident}.log")), None)
    prune(log.parent)
    return kept


def prune(directory: Path, keep: int | None = None) -> None:
    """Delete all but the newest `keep` failed-start logs.

    Parameters
    ----------
    directory : Path
        The registry folder.
    keep : int, optional
        How many to keep (default: ``nbcluster.logs.failed-starts``).
    """
    keep = int(config.get("logs.failed-starts")) if keep is None else keep
    logs = sorted(directory.glob(f"{FAILED}*.log"), key=_mtime, reverse=True)
    for old in logs[max(keep, 0) :]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def open_locked(log: Path) -> int:
    """Create `log` 0600 and return its descriptor, flock-ed for as long as it is inherited.

    Created under another name and renamed once locked, so that `prune_stale` in another
    process never sees it unlocked.

    Parameters
    ----------
    log : Path
        The log to create (it must not exist).

    Returns
    -------
    int
        The open, locked file descriptor.
    """
    making = log.with_name(f".making-{log.name}")
    fd = registry.open_private(making, exclusive=True, append=True)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(making, log)
    return fd


def prune_stale(directory: Path) -> None:
    """Delete ``.start-`` logs that no living process holds (see the module docstring).

    Parameters
    ----------
    directory : Path
        The registry folder.
    """
    for log in directory.glob(f"{STARTING}*.log"):
        try:
            fd = os.open(log, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a supervisor (or a spare) is alive and writing it
        else:
            with contextlib.suppress(FileNotFoundError):
                log.unlink()
        finally:
            os.close(fd)
