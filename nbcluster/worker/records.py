"""Worker side: an item's exception as a record the kernel can show and re-raise.

The traceback is the standard library's `traceback.TracebackException`, which walks the
chain (`raise ... from`, an exception raised while handling another), `ExceptionGroup`
members and `__notes__`, and guards against cycles. Made wire-safe here, once:

- nbcluster's own frames (the batch runner's `exec`) are dropped from every part;
- source lines are not read here: the kernel reads them (`lookup_lines=False`), from the
  notebook's cells and functions, which a worker does not have;
- exception classes do not travel (a class the kernel cannot import would make the whole
  record unloadable): each part's class goes by name in `types`, in `parts()` order, and
  the kernel puts a stand-in class of that name back (`tracebacks.py`); notes travel as
  strings.

The exception object itself travels pickled, where it can be rebuilt, so the kernel can
raise the item's own exception (`tracebacks.reraise`).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from typing import TypedDict

import cloudpickle

_PACKAGE = os.path.dirname(os.path.dirname(os.path.normcase(os.path.abspath(__file__))))


class TypeName(TypedDict):
    """An exception class by name: as Python prints it (`module.Qualname`, bare for builtins)."""

    module: str
    qualname: str
    syntax: bool  # a SyntaxError: printed with its file, line and caret


class ErrorRecord(TypedDict):
    """One failed item, as it crosses from worker to kernel (inside a batch's result blob)."""

    type: str  # "ZeroDivisionError", "mymodule.MyError"
    message: str
    traceback: traceback.TracebackException  # classes removed: see `types`
    types: list[TypeName]  # the class of each part of `traceback`, in `parts()` order
    exception: bytes | None  # the exception, cloudpickled, if it could be rebuilt


def error_record(e: BaseException, *, frames: bool = True) -> ErrorRecord:
    """Everything the kernel needs to show and re-raise `e`, nbcluster's frames gone.

    Parameters
    ----------
    e : BaseException
        The exception an item raised (or one the kernel made for it).
    frames : bool
        False drops every frame: for failures the kernel makes itself (a worker that died, a
        batch Dask refused), whose frames are nbcluster's or Dask's, nothing the user can act
        on.

    Returns
    -------
    ErrorRecord
        Safe to pickle and to load in a kernel that cannot import the exception's class:
        the traceback with its classes replaced by names, and the exception itself
        cloudpickled, or None where it cannot be rebuilt.

    Examples
    --------
    >>> try:
    ...     1 / 0
    ... except ZeroDivisionError as e:
    ...     record = error_record(e)
    >>> record["type"], record["message"]
    ('ZeroDivisionError', 'division by zero')
    >>> record["types"]
    [{'module': 'builtins', 'qualname': 'ZeroDivisionError', 'syntax': False}]
    """
    tb = traceback.TracebackException.from_exception(e, lookup_lines=False)
    types: list[TypeName] = []
    for part in parts(tb):
        cls = part.exc_type  # always a class: each part is an exception that was raised
        types.append({"module": cls.__module__, "qualname": cls.__qualname__, "syntax": issubclass(cls, SyntaxError)})
        part.exc_type = BaseException  # a builtin stand-in; the class travels by name in `types`
        part.stack = traceback.StackSummary.from_list([f for f in part.stack if frames and not _internal(f.filename)])
        notes = getattr(part, "__notes__", None)
        if notes is not None:  # strings only, so the record loads anywhere
            # vars(): Python 3.10's TracebackException has no `__notes__` to type-check against.
            vars(part)["__notes__"] = [str(n) for n in (notes if isinstance(notes, list | tuple) else [notes])]
    exception: bytes | None
    try:
        exception = cloudpickle.dumps(e)
        cloudpickle.loads(exception)  # an exception that cannot be rebuilt is useless later
    except Exception:
        exception = None
    module, qualname = types[0]["module"], types[0]["qualname"]  # as Python prints it: bare for builtins, __main__
    name = qualname if module in ("builtins", "__main__") else f"{module}.{qualname}"
    return {"type": name, "message": str(tb), "traceback": tb, "types": types, "exception": exception}


def parts(tb: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """`tb` and every exception it holds: causes, contexts, exception group members.

    Parameters
    ----------
    tb : traceback.TracebackException
        The outermost exception.

    Yields
    ------
    traceback.TracebackException
        `tb` first, then depth first what it links to, each link's cause before its context
        and group members after both: the order of `ErrorRecord`'s ``types``.
    """
    todo = [tb]
    while todo:
        part = todo.pop()
        yield part
        # `exceptions` (group members) exists from Python 3.11.
        linked = [part.__cause__, part.__context__, *(getattr(part, "exceptions", None) or ())]
        todo.extend(reversed([p for p in linked if p is not None]))


def _internal(filename: str) -> bool:
    # "<...>": a cell's code ("<distribute-...>"), or one compiled by the user
    return not filename.startswith("<") and os.path.normcase(os.path.abspath(filename)).startswith(_PACKAGE)
