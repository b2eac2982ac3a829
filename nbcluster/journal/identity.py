"""A run's identity: a fingerprint of what it computes, so that a new kernel finds its journal.

It is the BLAKE2 hash of, in order: the code (the cell's source, or a function's source),
the items after ``--over/--grid/--zip`` evaluation (and how they bind names), ``--seed``,
and the captured notebook values. It is deliberately not the kernel, the session or the
notebook's cell id: a new kernel running the same cell on the same inputs gets the same
identity.

How each part is fingerprinted:

- items: pickled with protocol 5, out-of-band buffers hashed in place (an array of items
  is not copied);
- captured values: the pickle `capture.py` already made to send them; a large value (over
  `capture.LARGE`) by the content digest that `capture.Shipments` sends it once per worker
  by; a module by its name;
- functions and classes defined in the notebook (module ``__main__``), captured or as the
  body: by their source text, because their pickle holds the kernel's own file name for the
  cell (``/tmp/ipykernel_<pid>/...``), which a new kernel does not share. What such a
  function reads as a global is not part of the identity.

`fingerprint` returns None when the items cannot be pickled at all (then the run is not
journaled): a journal must never stop a run.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
from types import CodeType, FunctionType, ModuleType
from typing import Any

import cloudpickle

from nbcluster.run.capture import Capture
from nbcluster.run.cell import Cell
from nbcluster.run.plan import Plan

VERSION = b"nbcluster-run-1"  # part of every identity: change it when what goes in changes


def fingerprint(plan: Plan, cell: Cell | None, fn: Any, seed: int | None, captured: Capture) -> str | None:
    """The run's identity as 32 hex digits; None if its items cannot be fingerprinted.

    Parameters
    ----------
    plan : Plan
        The run's items and how they bind names.
    cell : Cell or None
        The cell run, or None for a function.
    fn : callable or None
        The function run, when there is no cell.
    seed : int or None
        The run's ``--seed``.
    captured : Capture
        The notebook values the code takes with it.

    Returns
    -------
    str or None
        32 hex digits, the same for the same code, items, seed and captured values in any
        kernel; None when the items cannot be pickled (the run is then not journaled).
    """
    h = hashlib.blake2b(VERSION, digest_size=16)

    def part(tag: str, data: bytes) -> None:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)

    if cell is not None:
        part("cell", cell.source.lstrip("\n").encode())
    else:
        part("function", _code_of(fn))
    part("binding", repr((plan.mode, plan.names, plan.target, plan.positional, seed)).encode())
    if not _hash_pickle(h, plan.items):
        return None
    for name in sorted(captured.direct):
        value = captured.direct[name]
        if name in captured.modules:
            part(f"module {name}", captured.modules[name].encode())
        elif name in captured.large:
            part(f"large {name}", captured.large[name][1].encode())
        elif _from_notebook(value):
            part(f"source {name}", _code_of(value))
        elif name in captured.values:
            part(f"value {name}", captured.values[name])
        else:  # --local: nothing was pickled to send
            part(f"value {name}", b"")
            if not _hash_pickle(h, value):
                return None
    return h.hexdigest()


def _from_notebook(value: Any) -> bool:
    return isinstance(value, FunctionType | type) and getattr(value, "__module__", None) == "__main__"


def _code_of(fn: Any) -> bytes:
    """A function's (or class's) source; its pickle where there is no source to read."""
    try:
        return inspect.getsource(fn).encode()
    except (OSError, TypeError):
        pass
    code = getattr(fn, "__code__", None)
    if isinstance(code, CodeType):  # no source (a lambda typed at a prompt): its bytecode and constants
        return code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode()
    try:
        return bytes(cloudpickle.dumps(fn))
    except Exception:
        return repr(fn).encode()


def _hash_pickle(h: Any, value: Any) -> bool:
    buffers: list[pickle.PickleBuffer] = []
    try:
        header = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception:
        try:
            header = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        except Exception:
            return False
    h.update(len(header).to_bytes(8, "little"))
    h.update(header)
    for b in buffers:
        h.update(b.raw())
    return True


def first_line(cell: Cell | None, fn: Any) -> str:
    """What `runs` shows of the run: the cell's first line, or the function's name.

    Parameters
    ----------
    cell : Cell or None
        The cell run, or None for a function.
    fn : Any
        The function (or module) run, when there is no cell.

    Returns
    -------
    str
        The cell's first non-blank line (at most 80 characters), else ``name()`` of the
        function.
    """
    if cell is not None:
        for line in cell.source.splitlines():
            if line.strip():
                return line.strip()[:80]
        return ""
    if isinstance(fn, ModuleType):
        return fn.__name__
    return f"{getattr(fn, '__qualname__', type(fn).__name__)}()"
