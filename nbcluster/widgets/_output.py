"""Where the live widget goes: a kernel's output area, a terminal's text bar, or a test's
recorder (the `Seams`)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nbcluster.widgets._progress import TextBar


class LineBar(TextBar):
    """A `TextBar` that ends its line before anything else is printed (`end_open_lines`).

    Redrawn in place, the bar leaves the cursor at the end of its line; item output or an
    `Interrupted:` line printed then would be glued onto it (`... ETA 3.0 s── item 2 ──`).
    """

    def update(self, counts: Mapping[str, Any]) -> None:
        """Redraw the bar (see `TextBar.update`), and remember its line is open.

        Parameters
        ----------
        counts : Mapping
            The run's counts.
        """
        super().update(counts)
        if self.live:
            _OPEN.add(self)

    def finish(self, counts: Mapping[str, Any]) -> None:
        """Write the final line (see `TextBar.finish`).

        Parameters
        ----------
        counts : Mapping
            The run's final counts.
        """
        _OPEN.discard(self)
        super().finish(counts)

    def end_line(self) -> None:
        """Leave the bar's line: the next redraw starts on a line of its own."""
        _OPEN.discard(self)
        if self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0


_OPEN: weakref.WeakSet[LineBar] = weakref.WeakSet()  # bars whose line the cursor is still on


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
    try:
        from IPython import get_ipython
    except ImportError:
        return None
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
class Seams:
    """Test seams of `Live`: a display, a clock, a text bar, and whether widgets can show.

    Left at None, each is what the running process offers. A test that sets `display` or
    `text` closes the widget itself: no end-of-cell hook is registered.
    """

    display: Display | None = None
    clock: Callable[[], float] = time.monotonic
    text: TextBar | None = None
    widgets: bool | None = None

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> Seams:
        """The seams among keyword arguments (``_display``, ``_clock``, ...), removed from them.

        Parameters
        ----------
        kwargs : dict
            Keyword arguments of `nbcluster.widgets.live`; the seams are popped from it.

        Returns
        -------
        Seams
            The seams given, the rest at their defaults.
        """
        given = {
            name: kwargs.pop(f"_{name}")
            for name in ("display", "clock", "text", "widgets")
            if f"_{name}" in kwargs
        }
        return cls(**given)

    @property
    def replaced(self) -> bool:
        """Whether a test replaced the display or the text bar (then it closes the view)."""
        return self.display is not None or self.text is not None


@dataclass
class Output:
    """The resolved output of one `Live`: a widget display, or a text bar, never both."""

    display: Display | None
    text: TextBar | None

    @classmethod
    def for_seams(cls, seams: Seams) -> Output:
        """The output for these seams: the kernel's display in a kernel, else a text bar.

        Parameters
        ----------
        seams : Seams
            What a test replaced, if anything.

        Returns
        -------
        Output
            A display, or a text bar.
        """
        widgets = in_kernel() if seams.widgets is None else seams.widgets
        if widgets:
            return cls(seams.display if seams.display is not None else KernelDisplay(), seams.text)
        return cls(seams.display, seams.text if seams.text is not None else LineBar())

    @property
    def widgets(self) -> bool:
        """Whether the output is a widget display (not a text bar)."""
        return self.text is None
