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
        super().update(counts)
        if self.live:
            _OPEN.add(self)

    def finish(self, counts: Mapping[str, Any]) -> None:
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

    def show(self, bundle: dict[str, Any]) -> None: ...
    def update(self, bundle: dict[str, Any]) -> None: ...


class KernelDisplay:
    """One output area of the current cell, addressed by a display id."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, bundle: dict[str, Any]) -> None:
        from IPython.display import display

        global _last_shown
        self._handle = display(bundle, raw=True, display_id=True)
        _last_shown = time.monotonic()

    def update(self, bundle: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.update(bundle, raw=True)


_last_shown = float("-inf")  # when a live widget was last put into a cell (time.monotonic)


def widget_shown_since(t: float) -> bool:
    """Whether a live widget has been displayed since `t` (a `time.monotonic()` reading)."""
    return _last_shown >= t


def shell() -> Any:
    """The running IPython shell (kernel or terminal), or None in plain Python."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def in_kernel() -> bool:
    """Whether we run inside a Jupyter kernel (where widgets can show)."""
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
        """The seams among keyword arguments (``_display``, ``_clock``, ...), removed from them."""
        given = {
            name: kwargs.pop(f"_{name}")
            for name in ("display", "clock", "text", "widgets")
            if f"_{name}" in kwargs
        }
        return cls(**given)

    @property
    def replaced(self) -> bool:
        return self.display is not None or self.text is not None


@dataclass
class Output:
    """The resolved output of one `Live`: a widget display, or a text bar, never both."""

    display: Display | None
    text: TextBar | None

    @classmethod
    def for_seams(cls, seams: Seams) -> Output:
        widgets = in_kernel() if seams.widgets is None else seams.widgets
        if widgets:
            return cls(seams.display if seams.display is not None else KernelDisplay(), seams.text)
        return cls(seams.display, seams.text if seams.text is not None else LineBar())

    @property
    def widgets(self) -> bool:
        return self.text is None
