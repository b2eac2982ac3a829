"""The start-up of nbcluster's own processes (a supervisor, the forkserver of its workers).

They spend most of their start-up importing Dask, with the cyclic garbage collector finding
nothing to collect in the new modules (a tenth of that time). So each starts with
`START_UP_VARIABLE` in its environment, and its entry point calls `begin` before its heavy
imports: the collector stays off until the process has loaded what it runs, then is on
again with those objects frozen (`gc.freeze`: no collection scans them again). `import
nbcluster` itself does none of this.
"""

from __future__ import annotations

import gc
import os

START_UP_VARIABLE = "NBCLUSTER_START_UP"


def begin() -> None:
    """Turn the collector off for this process's imports, if it was started as one of ours.

    A process forked from this one has the collector on whatever happens (a worker, should
    the forkserver's imports fail).
    """
    if os.environ.pop(START_UP_VARIABLE, None) is not None:
        gc.disable()
        os.register_at_fork(after_in_child=gc.enable)
