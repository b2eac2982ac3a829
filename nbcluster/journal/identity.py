"""A run's identity: a fingerprint of what it computes, so that a new kernel finds its journal.

It is the BLAKE2 hash of, in order: the code (the cell's source, or the function run), the
items after ``--over/--grid/--zip`` evaluation (and how they bind names), ``--seed``, and
every captured notebook value. It is deliberately not the kernel, the session or the
notebook's cell id: a new kernel running the same cell on the same inputs gets the same
identity, and a change to any input gives another one, so ``--resume`` never mixes results
computed from different inputs.

Each value is hashed through one pickler (`_Hasher`), the same way wherever it sits (a
captured name, an item, a global a function reads):

- plain data by its pickle (protocol 5; the bytes of large arrays hashed in place, not
  copied);
- a module by its name; a function or class imported from a module by its module and name;
- a function defined in the notebook (module ``__main__``) by its source text (its code,
  where there is no source), its defaults, its closure's values, and the value of every
  global its code reads (recursively: a notebook function it calls is hashed the same way);
  never its pickle, which holds the kernel's own file name for the cell
  (``/tmp/ipykernel_<pid>/...``) that a new kernel does not share;
- a class defined in the notebook by its name, its bases and its attributes (methods as
  functions above); an instance of it by its class so hashed and its state.

`fingerprint` returns None when something cannot be hashed at all (then the run is not
journaled): a journal must never stop a run.
"""

from __future__ import annotations

import dis
import hashlib
import inspect
import io
import pickle
from types import CodeType, FunctionType, ModuleType
from typing import Any

import cloudpickle

from nbcluster.run.capture import Capture, read_only_array
from nbcluster.run.cell import Cell, Plan

VERSION = b"nbcluster-run-3"  # part of every identity: change it when what goes in changes
# A class's attributes that say where it was defined, or hold no content of its own.
_NOT_CLASS_CONTENT = frozenset({"__dict__", "__weakref__", "__module__", "__firstlineno__", "__static_attributes__"})


def fingerprint(plan: Plan, cell: Cell | None, fn: Any, seed: int | None, captured: Capture) -> str | None:
    """The run's identity as 32 hex digits; None if an input cannot be fingerprinted.

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
        32 hex digits, the same for the same code, items, seed and captured values (and
        what the notebook functions among them read) in any kernel; None when something
        cannot be pickled to hash (the run is then not journaled).
    """
    h = hashlib.blake2b(VERSION, digest_size=16)

    def part(tag: str, data: bytes) -> None:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)

    try:
        if cell is not None:
            part("cell", cell.source.lstrip("\n").encode())
        else:
            part("function", value_hash(fn))
        part("binding", repr((plan.mode, plan.names, plan.target, plan.positional, seed)).encode())
        part("items", value_hash(plan.items))
        for name in sorted(captured.direct):
            if name in captured.modules:
                part(f"module {name}", captured.modules[name].encode())
            elif name in captured.large and read_only_array(captured.direct[name]):
                # A plain array's pickle holds nothing of the kernel's: the digest it is
                # shipped by is its content's, already computed.
                part(f"value {name}", bytes.fromhex(captured.large[name][1]))
            else:
                part(f"value {name}", value_hash(captured.direct[name]))
    except Unhashable:
        return None
    return h.hexdigest()


class Unhashable(Exception):
    """A value that no pickler can take: the run has no identity."""


def value_hash(value: Any) -> bytes:
    """The stable hash of one value, as the identity takes it (see the module docstring).

    Parameters
    ----------
    value : Any
        A captured value, a function, or the items.

    Returns
    -------
    bytes
        16 bytes, the same in any kernel for the same value.

    Raises
    ------
    Unhashable
        When the value cannot be pickled.

    Examples
    --------
    >>> value_hash([1, 2]) == value_hash([1, 2]) != value_hash([1, 3])
    True
    """
    return _Hasher.digest(value, {})


class _Hasher(cloudpickle.Pickler):
    """cloudpickle, with notebook functions and classes replaced by their stable hash."""

    def __init__(self, file: Any, seen: dict[int, bytes], buffers: list[pickle.PickleBuffer]):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.seen = seen  # id -> hash of the notebook functions and classes hashed so far

    @classmethod
    def digest(cls, value: Any, seen: dict[int, bytes]) -> bytes:
        """16 bytes: the hash of `value`'s pickle (its length first) and of its out-of-band buffers."""
        out, buffers = io.BytesIO(), list[pickle.PickleBuffer]()
        try:
            cls(out, seen, buffers).dump(value)
        except Exception as e:
            raise Unhashable(f"{type(e).__name__}: {e}") from None
        h = hashlib.blake2b(len(out.getbuffer()).to_bytes(8, "little") + out.getbuffer(), digest_size=16)
        for b in buffers:
            h.update(b.raw())
        return h.digest()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, ModuleType):
            return str, (f"module {obj.__name__}",)
        if getattr(obj, "__module__", None) == "__main__" and isinstance(obj, FunctionType | type):
            return str, (self._notebook(obj).hex(),)
        return super().reducer_override(obj)

    def _notebook(self, obj: Any) -> bytes:
        """The hash of a notebook function or class: what it is, not where its kernel keeps it."""
        key = id(obj)
        if key in self.seen:
            return self.seen[key]
        self.seen[key] = f"recursive {obj.__qualname__}".encode()  # a function that calls itself
        if isinstance(obj, type):
            members = {k: v for k, v in vars(obj).items() if k not in _NOT_CLASS_CONTENT}
            parts: Any = ("class", obj.__qualname__, obj.__bases__, sorted(members.items()))
        else:
            fn: FunctionType = obj
            reads = sorted((n, fn.__globals__[n]) for n in _globals_read(fn.__code__) if n in fn.__globals__)
            closure = [_contents(c) for c in fn.__closure__ or ()]
            parts = ("function", _source(fn), fn.__defaults__, fn.__kwdefaults__, closure, reads)
        self.seen[key] = _Hasher.digest(parts, self.seen)
        return self.seen[key]


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


def _globals_read(code: CodeType) -> set[str]:
    """The names `code` (and the code nested in it) loads as globals, and nothing else.

    Not ``co_names``, which also holds attribute names and the names a function imports
    for itself (``import os`` inside it): a kernel that happens to have a global ``os`` (or
    ``write``) would then hash differently from one that has not, and a new kernel would
    not find the journal of the same run.
    """
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    return names.union(*(_globals_read(c) for c in code.co_consts if isinstance(c, CodeType)))


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell: a name the enclosing function binds later
        return None


def _source(fn: FunctionType) -> bytes:
    """A notebook function's source; its code where there is none (a lambda typed at a prompt)."""
    try:
        return inspect.getsource(fn).encode()
    except (OSError, TypeError):
        return _code(fn.__code__)


def _code(code: CodeType) -> bytes:
    """Bytecode, names and constants, nested code included, without file names or positions."""
    consts = b"".join(_code(c) if isinstance(c, CodeType) else repr(c).encode() for c in code.co_consts)
    return code.co_code + repr((code.co_names, code.co_varnames)).encode() + consts


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
        return next((line.strip()[:80] for line in cell.source.splitlines() if line.strip()), "")
    return fn.__name__ if isinstance(fn, ModuleType) else f"{getattr(fn, '__qualname__', type(fn).__name__)}()"
