"""A batch's small result, pushed to the kernel as a Dask event just before its task ends.

Reading a finished batch's result took the kernel a gather: a request to the scheduler, one
from it to the worker, and the replies. A cell's last batch paid that after its last item had
finished (3 to 5 ms of a 30 ms 8-item cell here), and a cell of one task per item (a chained
cell) paid it for each group of tasks that finished together.

So a task whose result is small sends it as well as returning it: `Worker.log_event`, on the
same ordered stream as the task-finished message that follows, which the scheduler forwards
to the client in that order. By the time the kernel sees the task done, the blob is in its
inbox (`distribute/reports.py`). Nothing depends on that: where it did not come (a kernel
that does not listen, a lost event, a blob over `LARGEST`), the task's result is gathered as
before, so a push can only save a round trip, never lose a result.

A `--persist` item pushes its report the same way (`held.py`): its value stays on the worker.
"""

from __future__ import annotations

from nbcluster._wire import PUSHED_TOPIC, Pushed

#: Blobs larger than this (bytes) are not pushed, only fetched: the scheduler keeps a topic's
#: last events (`distributed.admin.low-level-log-length`), and these must stay small there.
LARGEST = 8_192


def push(blob: bytes) -> None:
    """Send `blob` to the kernel as the current task's event, if it is small enough.

    Parameters
    ----------
    blob : bytes
        The task's result blob, or a persisted item's report.
    """
    if len(blob) > LARGEST:
        return
    try:
        from distributed import get_worker

        dask_worker = get_worker()
    except ValueError:  # not in a Dask worker's task (a test calling the task directly)
        return
    key = dask_worker.get_current_task()
    if key is not None:
        dask_worker.log_event(PUSHED_TOPIC, Pushed(key=str(key), report=blob))
