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
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

from nbcluster import config

STARTING = ".start-"
FAILED = "failed-start-"


def new_path(directory: Path) -> Path:
    """Where a supervisor being launched writes until its cluster is up."""
    return directory / f"{STARTING}{uuid.uuid4().hex[:8]}.log"


def keep_failed(log: Path) -> Path | None:
    """Keep a failed start's log under a name that says so; None if there is none."""
    if not log.exists():
        return None
    ident = log.name.removeprefix(STARTING).removesuffix(".log")
    kept = log.with_name(f"{FAILED}{time.strftime('%Y%m%d-%H%M%S')}-{ident}.log")
    try:
        log.rename(kept)
    except FileNotFoundError:  # the supervisor got there first
        return None
    prune(log.parent)
    return kept


def prune(directory: Path, keep: int | None = None) -> None:
    """Delete all but the newest `keep` (default: the config's) failed-start logs."""
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
