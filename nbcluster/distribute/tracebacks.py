"""Failed items: the exception, its remote traceback as text, and re-raising it.

A worker sends an error *record* per failed item (`worker.error_record`): the exception's
chain, each link's type, message and frames `(filename, line, function)` with nbcluster's
own frames already removed, and the exception pickled if it could be rebuilt. Here, in
the kernel:

- frames of notebook functions come back named "<dynamic-code>" (cloudpickle renames the
  file of every function it ships by value); `capture.code_index` maps them back to the
  notebook cell that defined the function (`_restore_filenames`);
- `format_chain` writes the traceback as Python would, with the cell's own lines: "Cell
  line 3" for the distributed cell (its source is in `linecache`), "Cell In[5], line 2"
  for a function from notebook cell 5;
- `reraise` raises the original exception object with real traceback objects rebuilt
  from the frames (tblib), so IPython, pdb and `except ZeroDivisionError:` see it as the
  user's own error; nbcluster's raising frames carry `__tracebackhide__`, which IPython
  honours.
"""

from __future__ import annotations

import linecache
import sys
from typing import Any

import cloudpickle

from nbcluster.distribute.plan import describe


class RemoteError(Exception):
    """Stands in for an exception that could not be brought back from the worker."""


class ItemError:
    """One failed item: its index, parameters, the original exception and its traceback."""

    def __init__(
        self,
        index: int,
        params: dict[str, Any],
        record: dict[str, Any],
        where: str,
        code_index: dict[str, list[tuple[str, int, int]]] | None = None,
    ):
        if code_index:
            _restore_filenames(record["chain"], code_index)
        self.index = index
        self.params = params
        self.type_name: str = record["type"]
        self.message: str = record["message"]
        self._record = record
        self.where = where  # "the cluster" or "the kernel"
        self._exception: BaseException | None = None

    @property
    def exception(self) -> BaseException:
        """The item's exception, of its original type where it could be rebuilt."""
        if self._exception is None:
            exc: BaseException | None = None
            if self._record.get("exception"):
                try:
                    exc = cloudpickle.loads(self._record["exception"])
                except Exception:
                    exc = None
            if exc is None:
                exc = RemoteError(f"{self.type_name}: {self.message}")
            self._exception = exc
        return self._exception

    @property
    def traceback(self) -> str:
        """The remote traceback as text: the cell's lines with cell line numbers."""
        return format_chain(self._record["chain"])

    def __repr__(self) -> str:
        return f"<ItemError item {self.index} ({describe(self.params)}): {self.type_name}: {self.message}>"


def reraise(error: ItemError) -> None:
    """Raise the item's own exception with its remote frames (see module docstring)."""
    __tracebackhide__ = True
    exc = error.exception
    tb = _rebuilt_traceback(error._record["chain"][0]["frames"])
    where = f"item {error.index}{', ' + describe(error.params) if error.params else ''}, run on {error.where}"
    # With the frames rebuilt the traceback shows the cell's lines itself; otherwise the
    # note carries the remote traceback as text.
    note = f"({where})" if tb is not None else f"({where}; remote traceback:)\n{error.traceback}"
    notes = getattr(exc, "__notes__", None)
    if hasattr(exc, "add_note") and (not notes or note not in notes):
        exc.add_note(note)
    raise exc.with_traceback(tb)


def _rebuilt_traceback(frames: list[tuple[str, int, str]]) -> Any:
    """Real traceback objects for the remote frames (tblib), so debuggers and IPython show them."""
    if not frames:
        return None
    try:
        from tblib import Traceback
    except ImportError:
        return None
    tb: dict[str, Any] | None = None
    for filename, lineno, name in reversed(frames):
        tb = {
            "tb_frame": {
                "f_code": {"co_filename": filename, "co_name": name},
                "f_globals": {"__name__": "__main__"},
                "f_lineno": lineno,
            },
            "tb_lineno": lineno,
            "tb_next": tb,
        }
    try:
        return Traceback.from_dict(tb).as_traceback()
    except Exception:
        return None


def _restore_filenames(chain: list[dict[str, Any]], index: dict[str, list[tuple[str, int, int]]]) -> None:
    for link in chain:
        frames = []
        for filename, lineno, name in link["frames"]:
            if filename == "<dynamic-code>":
                found = {f for f, first, last in index.get(name, []) if first <= lineno <= last}
                if len(found) == 1:
                    filename = found.pop()
            frames.append((filename, lineno, name))
        link["frames"] = frames


def format_chain(chain: list[dict[str, Any]]) -> str:
    """A Python-style traceback for a remote exception chain, causes first."""
    parts: list[str] = []
    for k in range(len(chain) - 1, -1, -1):
        link = chain[k]
        parts.append(_format_one(link))
        if k > 0:
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if link["relation"] == "cause"
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
    return "".join(parts)


def _format_one(link: dict[str, Any]) -> str:
    lines = []
    if link["frames"]:
        lines.append("Traceback (most recent call last):\n")
    for filename, lineno, name in link["frames"]:
        lines.append(f"  {_where(filename, lineno, name)}\n")
        source = linecache.getline(filename, lineno).strip()
        if source:
            lines.append(f"    {source}\n")
    message = link["message"]
    lines.append(f"{link['type']}: {message}\n" if message else f"{link['type']}\n")
    return "".join(lines)


def _where(filename: str, lineno: int, name: str) -> str:
    in_name = "" if name == "<module>" else f", in {name}"
    if filename.startswith("<distribute-"):
        return f"Cell line {lineno}{in_name}"
    cell = _notebook_cell(filename)
    if cell is not None:
        return f"Cell In[{cell}], line {lineno}{in_name}"
    return f'File "{filename}", line {lineno}, in {name}'


def _notebook_cell(filename: str) -> int | None:
    """The execution count of the notebook cell a function was defined in, if IPython knows."""
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is None or not shell_module.InteractiveShell.initialized():
        return None
    compiler = getattr(shell_module.InteractiveShell.instance(), "compile", None)
    mapping = getattr(compiler, "_filename_map", {}) or {}
    count = mapping.get(filename)
    return count if isinstance(count, int) else None
