"""Live task and resource graphs in the notebook.

Entry points (what the distribute engine and ``%cluster status`` call)::

    from nbcluster import widgets

    # %%distribute / nbcluster.distribute(): one argument, nothing else to manage
    results = launch(cell, namespace=ns, progress=widgets.progress_hook(), **kwargs)

    # any other long-running work
    handle = widgets.live(progress, feed, label="cell 7")   # returns at once
    try:
        ...                        # submit and wait
    finally:
        handle.close()             # or handle.close("cancelled") after an interrupt

    widgets.status(handle)         # a cluster's live graphs for a while, then frozen

`progress_hook` starts the widget once the run has gone on for the view's delay (armed by
the engine's first progress call), with the run's own Dask client as the metrics feed; the
widget then reads ``results.counts()``, shows only that run's batches in the task stream,
and a table for ``--grid`` runs: in item order, or best first by the run's objective
(``--objective NAME:min|max``).

``progress`` is a distribute ``Results``, or a callable (or an object with a ``progress()``
method) returning a mapping::

    {"done": int, "running": int, "failed": int, "total": int,
     "cancelled": int, "pending": int,   # optional; "pending" = queued or running, for
                                         # sources that cannot tell the two apart
     "finished": bool,             # optional: True once nothing more will finish;
                                   # default: done + failed >= total > 0
     "grid": {"params": ["lr", "depth"],                          # optional, --grid runs
              "rows": [{"params": {"lr": 0.1, "depth": 3}, "value": 0.93, "status": "ok"}]}}

It is called from a background thread every ``nbcluster.widget.interval`` (4 times a second
by default), so it must be cheap and thread-safe (reading a few counters is). ``feed`` is a
callable ``since -> snapshot`` (`nbcluster.metrics.client_feed(client)`,
`ClusterHandle.metrics`; a `ClusterHandle` itself is taken to mean its client's feed), see
`nbcluster.metrics` for the format; None shows progress only. On a scheduler without
nbcluster's plugin (one someone else runs that refused it) the client's feed serves the
scheduler's own view: the worker charts, and in place of the task stream one line saying
that it needs the plugin there.

What a user sees: nothing for ``delay`` seconds (``nbcluster.widget.delay``: instant cells
stay clean); then, in a kernel (JupyterLab, Notebook 7, VS Code), the widget: a progress bar
with items/s and ETA, the grid table (best first by the run's objective, else in item
order), a task stream with one lane per worker, and per-worker CPU / memory / GPU charts (on
a large cluster: lanes by host or the busiest and "others", and distributions across
workers; departed workers share one lane). When the run ends (the source says so, or
``close()``), the output is replaced by a static HTML/SVG picture of the final state, which
is what a saved notebook and nbconvert show. In terminal IPython or plain Python: a one-line text bar.

The freeze happens in the cell itself when the run is over by the cell's end (an IPython
``post_run_cell`` hook), so even a client that records only the cell's own messages
(nbclient, ``nbconvert --execute``) keeps the final picture. A status view (``%cluster
status``) has no end of its own: it freezes when the next cell starts (a ``pre_run_cell``
hook, so the update travels with that cell's messages), when its cluster goes away, or
after ``live_for`` seconds, whichever comes first. A run that outlives its cell
(``--no-wait``) freezes later, from the poller, by display id. Only a notebook saved while
its last cell's view is still live holds the widget, which needs the kernel to draw.

The drawing code is ``static/graphs.js``, shared with the JupyterLab sidebar panel; the
frozen picture is drawn by ``_static.py`` from the same ``static/theme.json``. The timings
and bounds are Dask config keys under ``nbcluster.widget.`` (the docs' settings reference).

What lives where: this module holds the entry points and everything a run's cell calls
while its view has not started (a small cell's whole life): `progress_hook`, the report
of a run's counts to the sidebar (`reporter_for`), and where a view goes (`Output`: the
kernel's display, a terminal's `TextBar`, or a test's recorder). The poller that draws is
`Live` (``_live.py``), which is handed its `Output`; the arithmetic from counts to what a
person reads is ``_progress.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, cast

from nbcluster import _threads as threads
from nbcluster import config
from nbcluster._wire import PROGRESS_TOPIC, RunCounts
from nbcluster.metrics.feed import Feed, client_feed
from nbcluster.widgets._controls import controls_for
from nbcluster.widgets._live import Live
from nbcluster.widgets._options import LiveOptions
from nbcluster.widgets._progress import Best, ProgressSource, text_line
from nbcluster.widgets._theme import THEME

logger = logging.getLogger(__name__)

GRID_MAX_ITEMS = 5000
#: Seconds between two reports of one run's counts to the scheduler (`reporter_for`).
REPORT_GAP_S = 0.25
#: What of a view's counts the sidebar is told (`RunCounts`, besides the run's id).
REPORTED = ("label", "done", "failed", "total", "cancelled", "state", "elapsed")
_MISSING = object()

__all__ = ["Live", "live", "progress_hook", "status"]


def live(progress: Any, feed: Feed | None = None, *, label: str | None = None, delay: float | None = None,
         interval: float | None = None, best: Best = None, **kwargs: Any) -> Live:  # fmt: skip
    """Start showing the progress of one run; returns a `Live` to `close()` when it ends.

    `progress` may also be a distribute `Results` (its counts, grid and own tasks are
    read; `feed` defaults to the run's client). In a kernel the widget also freezes at
    the end of the cell if the run is over by then, so forgetting `close()` is harmless.

    Parameters
    ----------
    progress : Results, ProgressSource or None
        What to follow: a distribute `Results`; a callable returning counts (``done``,
        ``running``, ``failed``, ``total``, see above) or an object whose ``progress()``
        method does; None follows the feed alone, until ``close()``.
    feed : Feed, optional
        Where the task stream and worker charts come from (a `ClusterHandle`, a client's
        feed); None shows the progress bar alone (or, for `Results`, the run's client).
    label : str, optional
        Shown before the progress text.
    delay : float, optional
        Seconds before anything is shown, so instant cells stay clean (default: Dask
        config ``nbcluster.widget.delay``).
    interval : float, optional
        The poll period in seconds, 2-5 Hz is plenty (``nbcluster.widget.interval``).
    best : {"max", "min", None}
        Order of grid rows by their numeric value: "max" first, "min" first, or None (the
        default) to keep the source's order. A trial run's objective
        (``--objective NAME:min|max``) sets it; without one the table keeps item order,
        since no one has said which way is better.
    **kwargs
        ``refresh`` (while nothing finishes, the live time axis still moves this often,
        ``nbcluster.widget.refresh``); ``window`` (seconds of task stream shown; None shows
        the whole run); ``resource_window`` (seconds of worker charts,
        ``nbcluster.widget.resource-window``); ``task_filter`` (a function of a task record,
        see `nbcluster.metrics`: the task stream shows the records for which it is true;
        without one it shows tasks that started after this call); ``grid`` (True/False
        forces or suppresses the grid table of a `Results`; default: shown for ``--grid``
        runs).

    Returns
    -------
    Live
        The running view; ``close()`` freezes it into its final picture.

    Raises
    ------
    TypeError
        When `progress` is none of the above.

    Examples
    --------
    >>> import time
    >>> results = nbcluster.distribute(lambda x: time.sleep(0.05), over=range(40), wait=False)
    >>> view = nbcluster.widgets.live(results)
    >>> results.wait().ok
    True
    >>> view.close()
    """
    output = Output.pop_from(kwargs)
    started = kwargs.pop("_started", None)  # `ProgressHook`: when its run started (time.monotonic)
    grid = kwargs.pop("grid", None)
    feed = _as_feed(feed)
    report = controls = None
    source: ProgressSource | None
    if callable(getattr(progress, "counts", None)) and hasattr(progress, "run_id"):  # a distribute `Results`
        report = reporter_for(progress)
        # The run's own records: its batches' names, and its --persist items'.
        prefixes = (f"distribute-{progress.run_id}-", f"persist-{progress.run_id}-")
        kwargs.setdefault("task_filter", lambda t: str(t.get("key", "")).startswith(prefixes))
        if feed is None and progress.client is not None:
            feed = client_feed(progress.client, detail=THEME["stream"]["maxLanes"])
        label = progress.label if label is None else label
        source, controls = ResultsProgress(progress, grid=grid), controls_for(progress)
    elif progress is None or callable(progress):  # taken on trust: what it returns is checked as it is read
        source = progress
    elif callable(method := getattr(progress, "progress", None)):
        source = method
    else:
        raise TypeError(f"expected a callable returning progress counts, or an object with .progress(); "
                        f"got {progress!r}")  # fmt: skip
    options = LiveOptions(label=label, delay=delay, interval=interval, best=best, **kwargs)
    return Live(source, feed, options, output, report=report, started=started, controls=controls)


def progress_hook(feed: Feed | None = None, **kwargs: Any) -> ProgressHook:
    """A ``progress=`` callback for `nbcluster.distribute`: shows the run's live widget.

    The first call (the engine makes it before submitting anything) arms the view: once the
    run has gone on for ``delay`` seconds, ``live(results, feed, **kwargs)`` starts, kept as
    ``hook.live``. A run over by then shows nothing, as a `live` view's would not, and only
    reports its final counts to the cluster's sidebar; later calls cost next to nothing.

    Parameters
    ----------
    feed : Feed, optional
        As in `live`.
    **kwargs
        `live`'s keyword arguments (``grid=True/False`` forces or suppresses the table).

    Returns
    -------
    ProgressHook
        The callback to pass as ``progress=``; ``close()`` it to freeze the view at once.

    Examples
    --------
    >>> hook = nbcluster.widgets.progress_hook(label="sweep")
    >>> runs = nbcluster.distribute(lambda x: x * x, over=range(8), progress=hook)
    >>> hook.close()
    """

    return ProgressHook(feed, kwargs)


class ProgressHook:
    """The callback `progress_hook` returns; `live` is its `Live` once the view has started.

    Why the view starts late rather than waiting to show: a `Live` made at once, for a cell
    over in a few milliseconds (most small cells), would cost the cell its making (its
    options, its output, its IPython hooks, its timer), for a view it never showed. Made
    when the delay is up, in the context of the call that armed it (so a kernel attaches
    its output to the run's cell), it shows at its first tick, counting time from the run's
    start. The first call comes from the kernel's main thread; the later ones (each change
    of the run) from the engine's driver thread, so arming, starting and ending are locked.
    """

    def __init__(self, feed: Feed | None, kwargs: dict[str, Any]):
        self.feed, self.kwargs = feed, kwargs
        self.live: Live | None = None
        self._results: Any = None
        self._lock = threading.Lock()
        self._later: threads.Later | None = None
        self._over = False  # the run ended before its view started: it never will

    def __call__(self, results: Any) -> None:
        if self._results is None:
            self._arm(results)
        elif self.live is None and not self._over and results.done:
            self._end_unseen()

    def close(self, state: str | None = None) -> None:
        """Freeze the view now (see `Live.close`); a view not started yet never starts.

        Parameters
        ----------
        state : str, optional
            Overrides the view's end state (e.g. ``"cancelled"`` after an interrupt).
        """
        with self._lock:
            live, self._over = self.live, self.live is None or self._over
        if self._later is not None:
            self._later.cancel()
        if live is not None:
            live.close(state)

    def _arm(self, results: Any) -> None:
        self._results = results
        delay = self.kwargs.get("delay")
        delay = config.seconds("widget.delay") if delay is None else delay
        if delay <= 0:
            self.live = live(results, self.feed, **self.kwargs)
        elif results.done:
            self._end_unseen()
        else:
            run = contextvars.copy_context().run
            self._later = threads.later(delay, run, self._start, time.monotonic(), name="nbcluster-live")

    def _start(self, started: float) -> None:
        with self._lock:
            if not self._over:
                self.live = live(self._results, self.feed, **{**self.kwargs, "delay": 0, "_started": started})

    def _end_unseen(self) -> None:
        with self._lock:
            if self.live is not None or self._over:
                return
            self._over = True
        if self._later is not None:
            self._later.cancel()
        results, label = self._results, self.kwargs.get("label")
        if (report := reporter_for(results)) is not None:  # the sidebar hears of the run's end as from a frozen view
            c, elapsed = results.counts(), (results.ended or time.time()) - results.started
            report({**c, "state": "cancelled" if c["cancelled"] else "done", "elapsed": elapsed,
                    "label": results.label if label is None else label})  # fmt: skip


class ResultsProgress:
    """``source()`` for the live widget over a `Results`; the grid table for grid runs.

    The engine pushes changes (``Results.subscribe``); the widget polls, so it redraws at a
    fixed rate however fast batches land, and the engine's driver thread never waits on it.
    Read through the observation surface documented in ``run/results.py``: ``counts()`` and
    ``done`` every tick; for ``--grid`` runs ``params``, ``values()`` and ``errors`` when the
    counts change; and once the run is done, ``Results._direct_keys``, the batches whose
    task records the final picture waits for.
    """

    def __init__(self, results: Any, grid: bool | None = None) -> None:
        self.results, self.trials = results, results._trials  # a trial run's (`run/trials.py`), else None
        self.grid = (results.mode == "grid" if grid is None else grid) and len(results) <= GRID_MAX_ITEMS
        self._params: list[dict[str, Any]] | None = None
        self._grid_key: tuple[int, ...] | None = None
        self._grid: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        c: dict[str, Any] = dict(self.results.counts())
        # Results counts queued and executing items together as "running"; say "pending".
        c["pending"] = c.pop("running", 0)
        c["finished"] = bool(self.results.done)
        trials = self.trials
        if c["finished"] and (direct := self.results._direct_keys):
            c["awaited"] = direct  # their records come after their answers (`Live` waits)
        if self.grid:
            key = (c["done"], c["failed"], c["cancelled"])
            if key != self._grid_key:
                self._grid_key, self._grid = key, self._grid_rows()
            c["grid"] = self._grid  # the same object while nothing changed: no re-ranking
            if trials is not None:  # a trial run ranks by its objective, or claims no order
                c["best"] = trials.rules.objective.mode if trials.rules.objective is not None else None
        if trials is not None and trials.series.points and len(self.results) <= GRID_MAX_ITEMS:
            c["curves"] = trials.curves(self.results.states, self._best())
        return c

    def _best(self) -> int | None:
        """The best trial's index, None while there is none (or no objective)."""
        try:
            return int(self.results.best().item)
        except Exception:  # no objective, or no value for it yet
            return None

    def _grid_rows(self) -> dict[str, Any]:
        if self._params is None:
            self._params = self.results.params
        params, trials = self._params, self.trials  # a trial run: its objective is the value
        failed = {e.index for e in self.results.errors}
        rows = []
        for i, (p, value) in enumerate(zip(params, self.results.values(missing=_MISSING), strict=False)):
            row: dict[str, Any] = {"params": p}
            scored = None if trials is None else trials.objective_value(i, None if value is _MISSING else value)
            if i in failed:
                row.update(value="failed", status="error")
            elif scored is not None:
                row.update(value=scored, status="ok")
            elif value is not _MISSING:
                row.update(value=value, status="ok")
            rows.append(row)
        return {"params": list(params[0]) if params else [], "rows": rows}


def reporter_for(results: Any) -> Callable[[Mapping[str, Any]], None] | None:
    """Send the run's item counts to the scheduler as events on `PROGRESS_TOPIC`, so the
    sidebar shows items as the cell counts them (where nbcluster's plugin is there to read
    them; any other scheduler keeps the events as it keeps every topic's, a bounded number).

    Only `REPORTED` fields travel, and only when one of them other than ``elapsed`` changed:
    a view reports at every tick, the sidebar hears of changes. At most one report every
    `REPORT_GAP_S` seconds: counts that come faster wait, and only the newest is sent, so the
    last counts always arrive. Sent from the client's event loop, one at a time: the caller
    never waits for the scheduler, and a newer report never arrives before an older one.

    Parameters
    ----------
    results : Results
        The run.

    Returns
    -------
    callable or None
        ``report(counts)``, given a view's counts (`decorate`) or the run's own with
        ``state``, ``label`` and ``elapsed``; None where the run has no client (``--local``).
    """
    client = results.client
    if client is None:
        return None
    run = results.run_id
    waiting: list[RunCounts] = []  # the newest counts not sent yet; touched on the loop only
    last: dict[str, Any] = {}  # the latest report, but for its time

    async def send(counts: RunCounts) -> None:
        if waiting:  # a call is sending: it sends these counts next, in place of older ones
            waiting[0] = counts
            return
        waiting.append(counts)
        while waiting:
            message = waiting[0]
            try:
                await client.scheduler.log_event(topic=PROGRESS_TOPIC, msg=message)
            except Exception as e:  # the cluster went away: the sidebar has nothing to show
                logger.info("nbcluster: cannot report the run's progress (%s: %s)", type(e).__name__, e)
            await asyncio.sleep(REPORT_GAP_S)
            if waiting[0] is message:
                waiting.clear()

    def report(counts: Mapping[str, Any]) -> None:
        nonlocal last
        message = {k: counts[k] for k in REPORTED if counts.get(k) is not None}
        if {**message, "elapsed": None} == {**last, "elapsed": None}:
            return
        last = message
        try:
            client.loop.add_callback(send, cast(RunCounts, {**message, "run": run}))
        except RuntimeError as e:  # the client's loop has stopped: the cluster is gone
            logger.info("nbcluster: cannot report the run's progress (%s: %s)", type(e).__name__, e)

    return report


def status(cluster: Any, *, live_for: float | None = 300.0, window: float = 60.0, **kwargs: Any) -> Live:
    """Show a cluster's recent task stream and worker charts, live for `live_for` seconds.

    In a kernel the view also freezes when the next cell starts or the cluster goes away.

    `cluster` is a `ClusterHandle` (its Dask client's connection is reused, not a fresh
    connection per poll as `handle.metrics` makes) or any feed. After `live_for` seconds
    (None: until ``close()``) the picture freezes, so the notebook holds a readable snapshot
    rather than a widget that needs the kernel.

    Parameters
    ----------
    cluster : ClusterHandle or Feed
        The cluster to show.
    live_for : float, optional
        Seconds the view stays live; None keeps it live until ``close()``.
    window : float
        Seconds of recent history shown.
    **kwargs
        `live`'s other keyword arguments.

    Returns
    -------
    Live
        The view (what ``%cluster status`` shows under its table).

    Examples
    --------
    >>> cluster = nbcluster.start()
    >>> view = nbcluster.widgets.status(cluster, live_for=60)
    >>> view.close()
    """
    output = Output.pop_from(kwargs)
    options = LiveOptions(delay=0.0, live_for=live_for, window=window, history=True, **kwargs)
    return Live(None, _as_feed(cluster), options, output)


def _as_feed(obj: Any) -> Feed | None:
    if obj is not None and hasattr(obj, "client") and callable(getattr(obj, "metrics", None)):
        return client_feed(obj.client, detail=THEME["stream"]["maxLanes"])
    return cast("Feed | None", obj)  # already a feed, or None


# -- where a view goes ----------------------------------------------------------------------


class TextBar:
    """The one-line progress bar for terminal IPython and plain Python.

    On a terminal the line is redrawn in place (carriage return); elsewhere (a log file,
    a pipe) only the final line is written, so logs do not fill with partial bars. Redrawn
    in place, the bar leaves the cursor at the end of its line; item output or an
    `Interrupted:` line printed then would be glued onto it (`... ETA 3.0 s── item 2 ──`), so
    whatever prints first ends the line (`end_open_lines`).
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_len = 0

    def update(self, counts: Mapping[str, Any]) -> None:
        """Redraw the line in place, on a terminal only.

        Parameters
        ----------
        counts : Mapping
            Decorated counts (`decorate`).
        """
        if self.live:
            self._write(text_line(counts), end="")
            _OPEN.add(self)

    def finish(self, counts: Mapping[str, Any]) -> None:
        """Write the final line (also to a log or a pipe).

        Parameters
        ----------
        counts : Mapping
            Decorated final counts.
        """
        _OPEN.discard(self)
        self._write(text_line(counts), end="\n")

    def end_line(self) -> None:
        """Leave the bar's line: the next redraw starts on a line of its own."""
        _OPEN.discard(self)
        if self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0

    def _write(self, text: str, end: str) -> None:
        pad = " " * max(0, self._last_len - len(text))
        self.stream.write(("\r" if self.live else "") + text + pad + end)
        self.stream.flush()
        self._last_len = 0 if end else len(text)


_OPEN: weakref.WeakSet[TextBar] = weakref.WeakSet()  # bars whose line the cursor is still on


def end_open_lines() -> None:
    """End the line of every bar drawn in place, before other output is printed."""
    for bar in list(_OPEN):
        bar.end_line()


class Display(Protocol):
    """Where the widget goes: the kernel's display system, or a test's recorder."""

    def show(self, bundle: dict[str, Any]) -> None:
        """Put a MIME bundle into the output area.

        Parameters
        ----------
        bundle : dict
            MIME type to data (the widget view, and HTML and text fallbacks).
        """
        ...

    def update(self, bundle: dict[str, Any]) -> None:
        """Replace what `show` put there.

        Parameters
        ----------
        bundle : dict
            MIME type to data (the frozen picture).
        """
        ...


class KernelDisplay:
    """One output area of the current cell, addressed by a display id."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, bundle: dict[str, Any]) -> None:
        """Display `bundle` with a new display id.

        Parameters
        ----------
        bundle : dict
            MIME type to data.
        """
        from IPython.display import display

        global _last_shown
        self._handle = display(bundle, raw=True, display_id=True)
        _last_shown = time.monotonic()

    def update(self, bundle: dict[str, Any]) -> None:
        """Replace the displayed output in place (nothing before `show`).

        Parameters
        ----------
        bundle : dict
            MIME type to data.
        """
        if self._handle is not None:
            self._handle.update(bundle, raw=True)


_last_shown = float("-inf")  # when a live widget was last put into a cell (time.monotonic)


def widget_shown_since(t: float) -> bool:
    """Whether a live widget has been displayed since `t`.

    Parameters
    ----------
    t : float
        A `time.monotonic` reading.

    Returns
    -------
    bool
        True when one was shown at or after `t`.
    """
    return _last_shown >= t


def shell() -> Any:
    """The running IPython shell (kernel or terminal).

    Returns
    -------
    InteractiveShell or None
        None in plain Python.
    """
    from IPython import get_ipython  # a dependency, loaded in plain Python only when asked

    return get_ipython()


def in_kernel() -> bool:
    """Whether we run inside a Jupyter kernel (where widgets can show).

    Returns
    -------
    bool
        True in a kernel; False in terminal IPython and plain Python.
    """
    ip = shell()
    return ip is not None and getattr(ip, "kernel", None) is not None


@dataclass(frozen=True)
class Output:
    """Where one `Live` goes and what ends it: a widget display or a text bar (never both),
    the clock its delay is measured on, and the IPython shell whose cells freeze it.

    `pop_from` makes it from what the process offers: in a kernel the cell's display, else a
    text bar. The test seams among `live`'s keyword arguments replace parts of it:
    ``_display`` (a recorder), ``_text`` (a `TextBar` on a stream), ``_clock`` and
    ``_widgets`` (whether widgets can show). A test that sets ``_display`` or ``_text``
    closes the view itself: it gets no end-of-cell hook (`ipython` is None).
    """

    display: Display | None
    text: TextBar | None
    clock: Callable[[], float] = time.monotonic
    ipython: Any = None

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> Output:
        """The output for a view, its seams popped from `kwargs`.

        Parameters
        ----------
        kwargs : dict
            Keyword arguments of `nbcluster.widgets.live` or `status`; the seams are popped.

        Returns
        -------
        Output
            A display in a kernel, else a text bar; the seams given replace their parts.
        """
        display, text = kwargs.pop("_display", None), kwargs.pop("_text", None)
        clock, widgets = kwargs.pop("_clock", time.monotonic), kwargs.pop("_widgets", None)
        ipython = None if display is not None or text is not None else shell()
        if in_kernel() if widgets is None else widgets:
            return cls(KernelDisplay() if display is None else display, text, clock, ipython)
        return cls(display, TextBar() if text is None else text, clock, ipython)

    @property
    def widgets(self) -> bool:
        """Whether the output is a widget display (not a text bar)."""
        return self.text is None
