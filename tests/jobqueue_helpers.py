"""What the tests ask of the machine's real batch systems (SLURM, Grid Engine), said once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def jobqueue_options(queue: str, jobs_dir: Path, **more: Any) -> dict[str, Any]:
    """dask-jobqueue options for a test batch system's `queue`; `more` adds or replaces some.

    One core and 1 GB a job for ten minutes, this Python, the job logs in `jobs_dir`, and the
    test traffic on loopback (BUILD-NOTES: addresses in tests).
    """
    return {
        "queue": queue,
        "cores": 1,
        "memory": "1GB",
        "walltime": "00:10:00",
        "python": sys.executable,
        "scheduler_options": {"host": "127.0.0.1"},
        "worker_extra_args": ["--host", "127.0.0.1"],
        "log_directory": str(jobs_dir),
        **more,
    }
