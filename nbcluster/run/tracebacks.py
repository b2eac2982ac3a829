"""Failed items: the exception, its remote traceback as text, and re-raising it.

A worker sends an error *record* per failed item (`worker.error_record`): the exception as the
standard library's `traceback.TracebackException` (its chain, `ExceptionGroup` members
and notes, nbcluster's own frames already removed, classes by name), and the exception
pickled if it could be rebuilt. Here, in the kernel, `ItemError` readies it once:

- frames of notebook functions come back named "<dynamic-code>" (cloudpickle renames the
  file of every function it ships by value); `capture.Job.sources` maps them back to the
  notebook cell that defined the function;
- the traceback is formatted (once, on first use) from a copy whose parts' classes are
  stand-ins of the same name, so the standard formatting prints
  `mymodule.MyError: ...` without importing anything; the record itself keeps no stand-in
  (it stays picklable);
- `traceback` formats it as Python would, with the cell's own lines: "Cell line 3" for the
  distributed cell (its source is in `linecache`), "Cell In[5], line 2" for a function
  from notebook cell 5 (`_CellStack`);
- `reraise` raises the original exception object with real traceback objects rebuilt
  from the frames (tblib), so IPython, pdb and `except ZeroDivisionError:` see it as the
  user's own error; nbcluster's raising frames carry `__tracebackhide__`, which IPython
  honours.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import traceback
from typing import Any

import cloudpickle
from tblib import Traceback

from nbcluster._compat import ipython_cell_number
from nbcluster.errors import RemoteError
from nbcluster.run.cell import describe
from nbcluster.worker import ErrorRecord, parts


class ItemError:
    """One failed item: its index, parameters, the original exception and its traceback."""

    def __init__(self, index: int, params: dict[str, Any], record: ErrorRecord, where: str,
                 code_index: dict[str, list[tuple[str, int, int]]]):  # fmt: skip
        for part in parts(record["traceback"]):  # made printable here (see the module docstring)
            for frame in part.stack:
                if frame.filename == "<dynamic-code>":
                    found = {f for f, first, last in code_index.get(frame.name, []) if first <= (frame.lineno or 0) <= last}
                    if len(found) == 1:
                        frame.filename = found.pop()
            part.stack = _CellStack(part.stack)  # not from_list: it makes a plain StackSummary
        self.index, self.params, self.where = index, params, where  # where: "the cluster" or "the kernel"
        self.type_name, self.message = record["type"], record["message"]
        self._record = record

    @functools.cached_property
    def exception(self) -> BaseException:
        """The item's exception, of its original type where it could be rebuilt."""
        with contextlib.suppress(Exception):
            if self._record["exception"]:
                return cloudpickle.loads(self._record["exception"])  # type: ignore[no-any-return]
        return RemoteError(f"{self.type_name}: {self.message}")

    @functools.cached_property
    def traceback(self) -> str:
        """The remote traceback as text: the cell's lines with cell line numbers."""
        tb = copy.deepcopy(self._record["traceback"])  # the record itself keeps no stand-in
        for part, name in zip(parts(tb), self._record["types"], strict=True):
            # A stand-in named as the remote class, for printing (a SyntaxError prints its caret).
            base = SyntaxError if name["syntax"] else Exception
            names = {"__module__": name["module"], "__qualname__": name["qualname"]}
            part.exc_type = type(name["qualname"].rpartition(".")[2], (base,), names)
        return "".join(tb.format())

    def __repr__(self) -> str:
        return f"<ItemError item {self.index} ({describe(self.params)}): {self.type_name}: {self.message}>"


def reraise(error: ItemError) -> None:
    """Raise the item's own exception with its remote frames (see module docstring).

    Parameters
    ----------
    error : ItemError
        The failed item.

    Raises
    ------
    Exception
        Always: the item's own exception, with a note naming the item, its parameters and
        where it ran.
    """
    __tracebackhide__ = True
    exc = error.exception
    tb: dict[str, Any] | None = None  # tblib's form of the remote frames, innermost last
    for f in reversed(error._record["traceback"].stack):
        code = {"co_filename": f.filename, "co_name": f.name}
        frame = {"f_code": code, "f_globals": {"__name__": "__main__"}, "f_lineno": f.lineno or 0}
        tb = {"tb_frame": frame, "tb_lineno": f.lineno or 0, "tb_next": tb}
    rebuilt = None
    with contextlib.suppress(Exception):
        rebuilt = Traceback.from_dict(tb).as_traceback() if tb else None
    where = f"item {error.index}{', ' + describe(error.params) if error.params else ''}, run on {error.where}"
    # With the frames rebuilt the traceback shows the cell's lines itself; otherwise the
    # note carries the remote traceback as text.
    note = f"({where})" if rebuilt is not None else f"({where}; remote traceback:)\n{error.traceback}"
    if hasattr(exc, "add_note") and note not in (getattr(exc, "__notes__", None) or ()):
        exc.add_note(note)
    raise exc.with_traceback(rebuilt)


class _CellStack(traceback.StackSummary):
    """Frames printed with cell names: "Cell line 3", "Cell In[5], line 2, in f"."""

    def format_frame_summary(self, frame_summary: traceback.FrameSummary) -> str:
        f, in_name = frame_summary, "" if frame_summary.name == "<module>" else f", in {frame_summary.name}"
        if f.filename.startswith("<distribute-"):
            where = f"Cell line {f.lineno}{in_name}"
        elif (cell := ipython_cell_number(f.filename)) is not None:
            where = f"Cell In[{cell}], line {f.lineno}{in_name}"
        else:
            where = f'File "{f.filename}", line {f.lineno}, in {f.name}'
        # `line` is read here, in the kernel, from linecache (once: the frame keeps it)
        return f"  {where}\n" + (f"    {f.line}\n" if f.line else "")
