"""`Live`: the background poller behind the live widget, from first paint to frozen picture.

Lifecycle of one run::

    live = Live(progress, feed)   # nothing shown yet; a daemon thread starts polling
      ... every `interval` s: read progress, fetch metrics since the cursor ...
      ... after `delay` s, if the run is still going: display the widget ...
      ... each tick: push the counts, and only the new task records and samples ...
    the source reports finished, or the caller calls live.close(state)
      -> one last poll; the widget's output is replaced by static HTML of the final state
         and the widget is closed.                          (never shown: nothing at all)

Why replace the widget instead of adding HTML beside it: a saved notebook keeps an output's
mimebundle, and JupyterLab prefers the widget mimetype whenever it is present -- reopened
without the kernel, it would say "model not found" and ignore the HTML. Replacing it with
HTML (drawn like the live view by `_static`) reads the same in the live session, after
reopening, in nbconvert HTML and on GitHub.

Threads: the poller must not wait for the kernel's main thread (busy running the cell), so
it displays and syncs from its own thread. It runs in a copy of the caller's context, so
ipykernel (which keeps the current cell's parent header in a context variable) attaches its
output to the cell that started it, even if the user has moved on to another cell.

Outside a kernel (terminal IPython, plain Python) there is no widget: `TextBar` prints one
progress line instead, and metrics are not fetched. Where the view goes, its clock and the
shell whose cells freeze it are handed in by its maker (`nbcluster.widgets.Output`), and so
is the report to the sidebar (`nbcluster.widgets.reporter_for`); the arithmetic from counts
to what a person reads is ``_progress.py``.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from nbcluster import _compat
from nbcluster import _threads as threads
from nbcluster.metrics.feed import Feed, MetricsWindow
from nbcluster.widgets import _static
from nbcluster.widgets._controls import TrialControls
from nbcluster.widgets._options import LiveOptions
from nbcluster.widgets._progress import ProgressSource, RateMeter, decorate, is_finished, rank_grid, text_line
from nbcluster.widgets._theme import THEME

if TYPE_CHECKING:
    from nbcluster.widgets import Output

logger = logging.getLogger(__name__)

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# The comm to the browser stays bounded however busy the cluster: an update carries at
# most this many task records (the newest), without the fields the drawing does not use.
# At 4 updates a second that is about 45 kB/s; the stream draws at most
# THEME.stream.maxBars bars in any case.
MAX_TASKS_PER_UPDATE = 100
_TASK_FIELDS = ("prefix", "worker", "start", "stop", "status")
# Tasks that started before a run began belong to earlier work. The slack absorbs clock
# differences between this machine and the workers; a caller that can name its tasks
# passes a task_filter instead (distribute runs do, by key).
CLOCK_SLACK_S = 0.1
# A finished run's source may name task records still on their way (``awaited``: batches a
# worker ran directly, reported after their answers). The final picture waits this long at
# most for them, reading the feed every `AWAIT_POLL_S`: a record lost with its worker must
# not hold the cell's end.
AWAIT_S = 0.5
AWAIT_POLL_S = 0.02
#: What a delta always carries; anything more is news for the front end.
_DELTA_BASE = {"seq", "now", "cursor", "basic"}


class Live:
    """Polls a progress source and a metrics feed; shows, updates and finally freezes.

    Use `nbcluster.widgets.live` / `nbcluster.widgets.status` rather than this class; the
    options are documented there (`LiveOptions`), and `output` says where the view goes.

    Attributes
    ----------
    ended : threading.Event
        Set once the view polls no more: its poller has ended (after drawing its frozen
        picture, unless the caller's `close` draws it), or never started.
    frozen : bool
        Whether the final picture has replaced the live view.
    """

    def __init__(self, progress: ProgressSource | None, feed: Feed | None, options: LiveOptions, output: Output, *,
                 report: Callable[[Mapping[str, Any]], None] | None = None, started: float | None = None,
                 controls: TrialControls | None = None) -> None:  # fmt: skip
        self.progress_source = progress
        self._controls = controls  # a trial run's stop buttons (`_controls.py`), None for other runs
        self._report = report  # where the counts go as they change (the sidebar: `reporter_for`), or None
        self.options = o = options.resolved()
        self._output, self._clock = output, output.clock
        self.feed = feed if output.widgets else None  # no graphs to draw in a terminal
        self.metrics = MetricsWindow(max_tasks=o.limits["maxTasks"], max_samples=o.limits["maxSamples"])
        self._since_wall = None if o.history else time.time() - CLOCK_SLACK_S
        self.widget: Any = None
        self.shown = self.frozen = False
        self.final_html: str | None = None
        self.counts: dict[str, Any] = {}
        self.grid: dict[str, Any] = {}
        self._raw_grid: Any = None
        self.curves: dict[str, Any] = {}  # a trial run's: one curve per trial (`_curves.py`)
        self._rate = RateMeter()
        # A view started after its run (`ProgressHook`) counts the run's time from its start.
        self._t0 = self._last_delta = self._clock() if started is None else started
        self._seq = 0
        self._sent_workers: Any = None
        self._sent_summary: Any = None
        self._pending = self._nothing_pending()  # what the next delta carries, by its key
        self._seen_keys: set[str] = set()  # of the records kept, for `_await_tasks`
        self._awaited: frozenset[str] = frozenset()
        self._end_state: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._closing = False  # the caller closes (and freezes): the poller ticks no more
        self._busy = False  # the poller is in a tick
        if progress is None and o.delay == 0:
            # A status view shows at once, in its own cell's messages: a client that
            # records only those (nbclient) would miss a display sent a moment later.
            self._tick()
        # A copy of the caller's context: ipykernel keeps the cell's parent header there. A
        # spare thread: starting a new one waited for a GIL hand-off, 0.5-1 ms of every cell.
        # A run's view shows nothing before `delay`: its poller starts an interval in (or at
        # `delay`, if sooner), so a cell over by then, most small ones, never starts it.
        run, wait = contextvars.copy_context().run, min(o.interval, o.delay) if progress is not None else 0.0
        self._poller: int | None = None  # the poller's thread, once it runs
        self._later = threads.later(wait, run, self._run, name="nbcluster-live") if wait > 0 else None
        self.ended = self._later.finished if self._later else threads.spawn(run, self._run, name="nbcluster-live")
        # A run's view freezes at the end of its cell if the run is over. A status view has no
        # end of its own: it is live while its cell is the latest one, and freezes as the next
        # cell starts (in that cell's messages, which every client records), so a saved
        # notebook holds the picture, never a widget that needs this kernel to draw.
        self._hook = ("pre_run_cell", self._on_next_cell) if progress is None else ("post_run_cell", self._on_cell_end)
        self._ipython = output.ipython
        if self._ipython is not None:
            self._ipython.events.register(*self._hook)

    # -- public ---------------------------------------------------------------------------

    def close(self, state: str | None = None, timeout: float = 10.0) -> None:
        """Stop polling and freeze the final state. Safe to call more than once.

        Parameters
        ----------
        state : str, optional
            Overrides the computed end state (e.g. ``"cancelled"`` after an interrupt).
        timeout : float
            Seconds to wait for the polling thread to stop.
        """
        self._end_state = self._end_state or state
        if threading.get_ident() != self._poller:
            # The caller ticks a last time and freezes, in its own context: the picture is
            # then part of the cell that closes the view (ipykernel takes a message's parent
            # from the context), which is the next cell for a status view. The poller ticks
            # no more; it is waited for only if it is in a tick now (waiting for an idle one
            # to wake and end took 2.5-4 ms of every small cell).
            with self._lock:
                self._closing, busy = True, self._busy
            if self._later is not None:
                self._later.cancel()  # not started yet: it never will
            self._stop.set()
            if not busy or self.ended.wait(timeout):
                try:
                    self._tick()
                except Exception:
                    logger.exception("nbcluster live widget failed; freezing it")
        self._stop.set()
        self._freeze()

    def __enter__(self) -> Live:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close("cancelled" if exc_type is KeyboardInterrupt else None)

    def _unhook(self) -> None:
        ip, self._ipython = self._ipython, None
        if ip is not None:
            ip.events.unregister(*self._hook)

    def _on_cell_end(self, result: Any = None) -> None:
        # The cell's last chance to change its own outputs: a frontend-less client such as
        # nbclient (and so nbconvert --execute) records only messages that arrive before
        # the cell's reply, and a terminal's final bar belongs before the next prompt. If
        # the run is over, freeze now, synchronously, in the main thread; a run that goes
        # on (--no-wait) freezes later from the poller.
        self._unhook()
        source = self.progress_source
        try:
            finished = source is not None and not self.frozen and is_finished(source())
        except Exception:
            finished = False
        if finished:
            self.close()

    def _on_next_cell(self, info: Any = None) -> None:
        self._unhook()
        self.close()

    # -- the poller thread ----------------------------------------------------------------

    def _run(self) -> None:
        self._poller = threading.get_ident()
        live_for = self.options.live_for
        try:
            while not self._poll() and not self._stop.is_set():
                lived_out = live_for is not None and self._clock() - self._t0 >= live_for
                if lived_out or self._stop.wait(self.options.interval):
                    break
            self._poll()
        except Exception:
            logger.exception("nbcluster live widget failed; freezing it")
        finally:
            if not self._closing:
                self._freeze()

    def _poll(self) -> bool:
        """The poller's tick, unless the caller is closing the view (it ticks itself then)."""
        with self._lock:
            if self._closing:
                return True
            self._busy = True
        try:
            return self._tick()
        finally:
            with self._lock:
                self._busy = False

    def _tick(self) -> bool:
        """One poll: read, maybe show, push. Returns whether the run has finished."""
        finished = self._read_progress()
        if self._report is not None and self.counts:
            self._report(self.counts)
        if not self.shown and (finished or self._clock() - self._t0 < self.options.delay):
            # Instant runs stay clean: nothing is ever shown. Nor are the metrics read (a
            # round trip to the scheduler, 2.5 ms of every small cell): the first read, once
            # the view shows, brings the scheduler's history since the cell started.
            return finished
        self._read_metrics()
        if finished:
            self._await_tasks()
        if not self.shown:
            self._show()
        self._push()
        return finished

    def _await_tasks(self) -> None:
        """Read the feed again until the records the source said were coming came (`AWAIT_S`)."""
        deadline = time.monotonic() + AWAIT_S
        while self.feed is not None and not self._awaited <= self._seen_keys and time.monotonic() < deadline:
            time.sleep(AWAIT_POLL_S)
            self._read_metrics()

    def _read_progress(self) -> bool:
        if self.progress_source is None:
            return False
        raw = dict(self.progress_source())
        self._awaited = frozenset(raw.pop("awaited", ()))
        # A trial run says which way its objective ranks, or that none does (`ResultsProgress`).
        order = raw.pop("best", self.options.best)
        self.curves = raw.pop("curves", None) or self.curves
        finished, now = is_finished(raw), self._clock()
        rate = self._rate.add(now, int(raw.get("done") or 0) + int(raw.get("failed") or 0))
        state = self._end_state or (("cancelled" if raw.get("cancelled") else "done") if finished else "running")
        self.counts = decorate(raw, elapsed=now - self._t0, rate=rate, state=state, label=self.options.label)
        if (grid := raw.get("grid")) is not self._raw_grid or finished:
            self._raw_grid, self.grid = grid, rank_grid(grid, order)
        return finished

    def _read_metrics(self) -> None:
        if self.feed is None:
            return
        try:
            snap = self.feed(self.metrics.cursor)
        except Exception as e:
            # A cluster that went away (or a feed that breaks): keep the progress bar,
            # drop the graphs. A scheduler without the plugin is not this: its client
            # feed falls back to the scheduler's own view.
            logger.info("nbcluster live widget: no metrics (%s: %s)", type(e).__name__, e)
            self.feed = None
            if self.progress_source is None:
                self._stop.set()  # a status view of a cluster that is gone: freeze it
            return
        # The first answer holds the scheduler's whole history (up to its ring sizes); keep
        # only what can be drawn, so the first message to the front end stays small.
        o, now = self.options, snap.get("now") or time.time()
        tasks = list(snap.get("tasks") or ())
        if o.task_filter is not None:  # the run's own (a run's batches: few), never the cluster's
            tasks = [t for t in tasks if o.task_filter(t)]
            self._seen_keys.update(str(t.get("key")) for t in tasks)
        elif self._since_wall is not None:
            tasks = [t for t in tasks if t["start"] >= self._since_wall]
        if o.window is not None:
            tasks = [t for t in tasks if t["stop"] >= now - o.window]
        samples = [r for r in snap.get("resources") or () if r["time"] >= now - o.resource_window]
        self.metrics.apply({**snap, "tasks": tasks, "resources": samples})
        for key, new in (("tasks", tasks), ("resources", samples), ("bands", snap.get("bands") or ())):
            self._pending[key].extend(new)

    def _nothing_pending(self) -> dict[str, list[Any]]:
        return {"tasks": [], "resources": [], "bands": []}

    def _show(self) -> None:
        from nbcluster.widgets.widget import LiveWidget

        if not self._output.widgets:
            self.shown = True
            return
        o = self.options
        self.widget = LiveWidget(window=o.window, resource_window=o.resource_window, limits=o.limits,
                                 controls=self._controls_state())  # fmt: skip
        if self._controls is not None:
            self.widget.on_msg(self._on_message)
            _compat.comm_replies_on_senders_subshell(self.widget.comm)
        # The first delta carries everything gathered before the widget appeared.
        m = self.metrics
        self._pending = {"tasks": list(m.tasks)[-THEME["stream"]["maxBars"] :], "bands": list(m.bands),
                         "resources": [r for series in m.samples.values() for r in series]}  # fmt: skip
        self._push(reset=True)
        assert self._output.display is not None  # a widget's output is a display (`Output.widgets`)
        view = {"version_major": 2, "version_minor": 1, "model_id": self.widget.model_id}
        self._output.display.show({WIDGET_MIME: view, "text/plain": self._text_line()})
        self.shown = True

    def _push(self, reset: bool = False) -> None:
        if self._output.text is not None:
            if self.counts:
                self._output.text.update(self.counts)
            return
        w = self.widget
        if w is None:
            return
        self._seq += 1
        m = self.metrics
        delta: dict[str, Any] = {"seq": self._seq, "now": m.now, "cursor": m.cursor, "basic": m.basic}
        if reset:
            delta["reset"] = True
        if reset or m.workers != self._sent_workers:
            delta["workers"] = self._sent_workers = m.workers
        if m.summary is not None and (reset or m.summary != self._sent_summary):
            delta["summary"] = self._sent_summary = m.summary
        pending, self._pending = self._pending, self._nothing_pending()
        delta.update({key: new for key, new in pending.items() if new})
        if "tasks" in delta:
            tasks = delta["tasks"] if reset else delta["tasks"][-MAX_TASKS_PER_UPDATE:]
            delta["tasks"] = [{k: v for k, v in t.items() if k in _TASK_FIELDS} for t in tasks]
        with w.hold_sync():
            if self.counts and self.counts != w.progress:
                w.progress = self.counts
            if self.grid != w.grid:
                w.grid = self.grid
            if self.curves != w.curves:
                w.curves = self.curves
            if self._controls is not None and (controls := self._controls_state()) != w.controls:
                w.controls = controls
            # Send a delta when something is new, or every `refresh` seconds so the
            # live time axis keeps moving while nothing finishes.
            now = self._clock()
            if delta.keys() - _DELTA_BASE or now - self._last_delta >= self.options.refresh:
                w.delta = delta
                self._last_delta = now

    def _controls_state(self) -> dict[str, Any]:
        if self._controls is None or self.frozen:
            return {}
        try:
            return dict(self._controls.state())
        except Exception as e:  # the buttons are not worth the view
            logger.info("nbcluster live widget: no stop buttons (%s: %s)", type(e).__name__, e)
            self._controls = None
            return {}

    def _on_message(self, widget: Any, content: Any, buffers: Any) -> None:
        # On the thread that handles the front end's comm messages: a kernel subshell's
        # while the cell runs (JupyterLab >= 4.4, ipykernel >= 7), else the main one after it.
        if self._controls is None or self.frozen:
            return
        try:
            self._controls.handle(content, widget.send)
        except Exception:
            logger.exception("nbcluster live widget: a stop button failed")

    # -- the end --------------------------------------------------------------------------

    def _text_line(self) -> str:
        return text_line(self.counts) if self.counts else f"nbcluster: {len(self.metrics.workers)} workers"

    def _freeze(self) -> None:
        with self._lock:
            if self.frozen:
                return
            self.frozen = True
        if self.counts and (self._end_state is not None or self.counts.get("state") == "running"):
            # Closed before the source said it had finished (an error in the caller):
            # a frozen "running" with an ETA would be a lie.
            self.counts = {**self.counts, "state": self._end_state or "stopped"}
            self.counts.pop("eta", None)
        if self._report is not None and self.counts:
            self._report(self.counts)
        if not self.shown:
            return
        if self._output.text is not None:
            if self.counts:
                self._output.text.finish(self.counts)
            return
        if self.widget is not None:
            # Sync the final counts first: a front end that ignores display updates keeps
            # the widget's view, which then shows the end state, not the last tick.
            self._push()
        self.final_html = _static.render_html(self.counts or None, self.metrics.to_view(), self.grid or None,
                                              window=self.options.window, resource_window=self.options.resource_window,
                                              curves=self.curves or None)  # fmt: skip
        assert self._output.display is not None
        self._output.display.update({"text/html": self.final_html, "text/plain": self._text_line()})
        if self.widget is not None:
            self.widget.close()
