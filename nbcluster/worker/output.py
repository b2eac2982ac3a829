"""Worker side: each item's output (prints, `display()`), kept apart per thread.

`sys.stdout`/`sys.stderr` are wrapped once per process (`install`) by a stream that sends
writes to the current item's buffer when the writing thread is running an item, and to the
real stream otherwise. With several threads per worker, each item sees only its own
prints. A batch runner brackets its items with `collect(outputs, values, indices)` ...
`collect(None)`: it appends each item's value in order (`items.py`), so the item running is
the one at ``len(values)``. `outputs` maps item index -> chunks `[stream, text]` (or
`["display", mimebundle]`).
"""

from __future__ import annotations

import builtins
import io
import sys
import threading
from typing import Any, TextIO

LIMIT = 64 * 1024  # characters kept per item and stream
CUT = "\n... (output truncated)\n"
_local = threading.local()


def collect(outputs: dict[int, list[list[Any]]] | None, values: list[Any] | None = None, indices: Any = None) -> None:
    """Send this thread's output to `outputs` from now on (None: to the real streams).

    Parameters
    ----------
    outputs : dict of int to list, or None
        Where this thread's prints and displays go from now on: item index -> chunks
        ``[stream, text]`` or ``["display", mimebundle]``, filled in place. None sends them to
        the real `sys.stdout`/`sys.stderr` again.
    values : list, optional
        The batch's values, appended in order as each item finishes: the item running is the
        next to append, so output is filed under ``indices[len(values)]``, read when
        something is written (naming the item costs nothing per item).
    indices : sequence of int, optional
        The run's index of each item in the batch.
    """
    _local.outputs = outputs
    _local.follow = (values, indices)


def current() -> dict[int, list[list[Any]]] | None:
    """Where this thread's output goes now (`collect`'s mapping), for a reader in another
    thread: a trial's reports send the running item's new output with them (`trial.py`).

    Returns
    -------
    dict of int to list, or None
        Item index -> chunks, filled in place; None when output goes to the real streams.
    """
    return getattr(_local, "outputs", None)


def _index() -> int:
    values, indices = _local.follow
    return int(indices[len(values)])


class _ItemStream(io.TextIOBase):
    """Writes go to the running item's buffer in this thread, else to the real stream."""

    def __init__(self, name: str, real: TextIO):
        self.name_ = name
        self.real = real

    def write(self, text: str) -> int:
        outputs = getattr(_local, "outputs", None)
        if outputs is None:
            return self.real.write(text)
        chunks = outputs.setdefault(_index(), [])
        if chunks and chunks[-1][0] == self.name_:
            if len(chunks[-1][1]) <= LIMIT:  # a longer one was cut already: it takes no more
                chunks[-1][1] += text
        else:
            chunks.append([self.name_, text])
        if len(chunks[-1][1]) > LIMIT:  # cut, and say so, whether one write or many got here
            chunks[-1][1] = chunks[-1][1][:LIMIT] + CUT
        return len(text)

    def flush(self) -> None:
        if getattr(_local, "outputs", None) is None:
            self.real.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    # TextIOBase declares `encoding` a plain attribute; this one is the real stream's, read
    # when asked.
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")

    def fileno(self) -> int:
        return self.real.fileno()


def install() -> None:
    """Wrap this process's `sys.stdout`/`sys.stderr` (once) and give it a `display`."""
    if not isinstance(sys.stdout, _ItemStream):
        sys.stdout = _ItemStream("stdout", sys.stdout)
    if not isinstance(sys.stderr, _ItemStream):
        sys.stderr = _ItemStream("stderr", sys.stderr)
    # In a notebook `display` is a builtin (IPython puts it there); cells and notebook
    # functions call it unqualified, so a worker needs one too.
    if not hasattr(builtins, "display"):
        # The builtins stub has no `display`: IPython adds one at run time, as this does (and
        # ruff's B010 asks for this form rather than setattr).
        builtins.display = display  # type: ignore[attr-defined]


def display(*objs: Any, raw: bool = False, **_ignored: Any) -> None:
    """`display()` for worker items: records each object's rich representation for the cell.

    Outside an item (no `collect` in this thread) the plain-text form is printed instead.

    Parameters
    ----------
    *objs : Any
        The objects to show; each becomes a mimebundle, as IPython's formatter makes it (else
        its ``repr``).
    raw : bool
        When True, an object that is a dict is taken as a ready mimebundle, as in IPython.
    **_ignored : Any
        IPython's other keywords (``display_id``, ``metadata``...), accepted so cells written
        for the notebook run unchanged, and ignored.

    Examples
    --------
    Outside an item, as here, the plain-text form is printed:

    >>> display({"text/plain": "done", "text/html": "<b>done</b>"}, raw=True)
    done
    """
    outputs = getattr(_local, "outputs", None)
    for obj in objs:
        bundle = obj if raw and isinstance(obj, dict) else _mimebundle(obj)
        if outputs is None:
            print(bundle.get("text/plain", ""))
        else:
            outputs.setdefault(_index(), []).append(["display", bundle])


def _mimebundle(obj: Any) -> dict[str, Any]:
    try:
        from IPython.core.formatters import DisplayFormatter

        data, _ = DisplayFormatter().format(obj)
        if data:
            return dict(data)
    except Exception:  # no IPython on the worker, or a failing _repr_*_: plain text will do
        pass
    try:
        return {"text/plain": repr(obj)}
    except Exception:
        return {"text/plain": f"<unprintable {type(obj).__name__}>"}
