"""Live task and resource graphs in the notebook.

Entry points (what the distribute engine and ``%cluster status`` call)::

    from nbcluster import widgets

    handle = widgets.live(progress, feed, label="cell 7")   # returns at once
    try:
        ...                        # submit and wait, as before
    finally:
        handle.close()             # or handle.close("cancelled") after an interrupt

    widgets.status(feed)           # a cluster's live graphs for a while, then frozen

``progress`` is a callable (or an object with a ``progress()`` method, e.g. ``Results``)
returning a mapping::

    {"done": int, "running": int, "failed": int, "total": int,
     "finished": bool,             # optional: True once nothing more will finish;
                                   # default: done + failed >= total > 0
     "grid": {"params": ["lr", "depth"],                          # optional, --grid runs
              "rows": [{"params": {"lr": 0.1, "depth": 3}, "value": 0.93, "status": "ok"}]}}

It is called from a background thread 4 times a second, so it must be cheap and
thread-safe (reading a few counters is). ``feed`` is a callable ``since -> snapshot``
(`ClusterHandle.metrics`, or `nbcluster.metrics.client_feed(client)`), see
`nbcluster.metrics` for the format; None shows progress only.

What a user sees: nothing for ``delay`` seconds (instant cells stay clean); then, in a
kernel (JupyterLab, Notebook 7, VS Code), the widget: a progress bar with items/s and ETA,
the grid table best first, a task stream with one lane per worker, and per-worker CPU /
memory / GPU charts. When the run ends (the source says so, or ``close()``), the output
is replaced by a static HTML/SVG picture of the final state, which is what a saved
notebook and nbconvert show. In terminal IPython or plain Python: a one-line text bar.

The drawing code is ``static/graphs.js``, shared with the JupyterLab sidebar panel.
"""

from __future__ import annotations

from typing import Any

from nbcluster.metrics.feed import Feed
from nbcluster.widgets._live import Live, as_progress_source
from nbcluster.widgets._progress import Best

__all__ = ["Live", "live", "status"]


def live(
    progress: Any,
    feed: Feed | None = None,
    *,
    label: str | None = None,
    delay: float = 0.75,
    interval: float = 0.25,
    best: Best = "max",
    **kwargs: Any,
) -> Live:
    """Start showing the progress of one run; returns a `Live` to `close()` when it ends.

    `best` orders grid rows by their numeric value ("max" first, "min" first, or None to
    keep the source's order). `interval` is the poll period in seconds (2-5 Hz is plenty).
    """
    return Live(
        as_progress_source(progress), feed, label=label, delay=delay, interval=interval, best=best, **kwargs
    )


def status(feed: Feed, *, live_for: float | None = 300.0, window: float = 60.0, **kwargs: Any) -> Live:
    """Show a cluster's recent task stream and worker charts, live for `live_for` seconds.

    After `live_for` seconds (None: until ``close()``) the picture freezes, so the notebook
    holds a readable snapshot rather than a widget that needs the kernel.
    """
    return Live(None, feed, delay=0.0, live_for=live_for, window=window, history=True, **kwargs)
