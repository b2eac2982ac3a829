"""What a run takes with it: the notebook variables its cell reads (`capture`), how each
travels, and the `Job` made of them, once, in the kernel, before anything is sent.

For every free name of the cell (see `cell.py`) found in the user's namespace:

- a module (`np`, `pd`) travels as its name and is imported on the worker;
- anything else is pickled with cloudpickle, here in the kernel, one name at a time, so
  a value that cannot travel (an open file, a lock, a database connection) is reported
  by name before anything is sent. Functions and classes defined in the notebook
  (module `__main__`) travel by value; imported ones by reference.
- a value whose pickle is over `LARGE` bytes (arrays, DataFrames) is *scattered* to
  every worker once and cached by the hash of its pickled content (`Shipments`): the
  next cell that uses the same, unchanged object sends nothing. Pickling uses protocol 5
  with out-of-band buffers, so sizing and hashing a 200 MB array copies nothing.
  Rebinding the name to different content releases the old copy on the workers.

**Each item starts from the notebook's state.** A worker loads the values once per run,
but the items must not share what one of them changes (as `client.map`, `Pool` and
joblib give every task its own copy). So each value is sorted by `shareable`:

- known-immutable values (numbers, strings, bytes, None, tuples and frozensets of them,
  modules, classes, imported functions, and notebook functions whose globals, closure and
  defaults are all of these) are loaded once per worker and shared, at no cost per item;
- a large plain numpy array (over `LARGE`) is shared too, but read-only: writing to it
  raises an error naming the variable (`worker.context`); so is a notebook function that
  reads such an array as a global (the worker makes the array read-only);
- anything else (a list, a dict, an object, a small array, a function that reads one) is
  pickled together into one blob (`Job.for_workers`) that the worker unpickles again for
  every item, so shared references among them stay shared within the item; a large one
  is copied for every item on the worker, around read-only views of the arrays it holds
  (`worker.context.copier`): a write to one of those raises an error naming the variable.

A name the cell reads before binding it, that is neither in the namespace nor a builtin,
is an error here ("`y` is not defined"); a name read only inside a function the cell
defines is left for Python to resolve when it runs, as in the kernel.

"""

from __future__ import annotations

import builtins
import contextlib
import enum
import functools
import hashlib
import io
import marshal
import pickle
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import BuiltinFunctionType, CodeType, FunctionType, ModuleType
from typing import Any

import cloudpickle

from nbcluster import _compat, worker
from nbcluster import _threads as threads
from nbcluster._wire import TrialSpec
from nbcluster.errors import BadArgument
from nbcluster.persist import handles
from nbcluster.run.cell import Cell, Plan, code_names, human
from nbcluster.run.tracebacks import ItemError
from nbcluster.worker.context import cell_value, function_copy, pin

LARGE = 1_000_000  # bytes of pickle above which a value is shipped once per worker
PIN_WAIT_S = 5.0


@dataclass
class Capture:
    """The notebook variables one cell run takes with it, sorted by how each travels.

    Attributes
    ----------
    values : dict of str to bytes
        Small values, pickled here (one name at a time).
    modules : dict of str to str
        Modules, by the name the cell uses -> the module to import on the worker.
    large : dict of str to (Any, str, int)
        Values over `LARGE` bytes of pickle -> (value, content digest, size): scattered once per
        worker by `Shipments`.
    direct : dict of str to Any
        Every captured value as it is, for ``--local``, where nothing is pickled.
    held : dict of str to Any
        Handles of ``--persist`` values, by name: resolved on the worker, never fetched here.
    copied : list of str
        The small values each item gets a fresh copy of (not `shareable`); they are in
        `values` too, for the report line, and travel pickled together (`Job.for_workers`).
    read_only : list of str
        The large values shared read-only: plain numpy arrays, and notebook functions that
        read such arrays (the worker makes the arrays read-only); every other large value is
        copied for every item.
    """

    values: dict[str, bytes] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    large: dict[str, tuple[Any, str, int]] = field(default_factory=dict)
    direct: dict[str, Any] = field(default_factory=dict)
    held: dict[str, Any] = field(default_factory=dict)
    copied: list[str] = field(default_factory=list)
    read_only: list[str] = field(default_factory=list)



def capture(free: dict[str, int | None], namespace: Any, *, pickle_values: bool = True) -> Capture:
    """Collect the free names' values; `pickle_values=False` when nothing leaves the kernel.

    Parameters
    ----------
    free : dict of str to int or None
        The cell's free names (`cell.Cell.free_names`) -> the cell line that reads one before
        binding it, or None for a name read only inside a function the cell defines.
    namespace : Mapping
        The user's namespace (IPython's ``user_ns``).
    pickle_values : bool
        False for ``--local``: the values are kept in `Capture.direct` only, unpickled.

    Returns
    -------
    Capture
        The modules, small and large values found, and the persisted handles (`held`),
        which are not pickled: each batch takes their futures as Dask dependencies, so the
        value goes worker to worker (`worker/held.py`). Builtins (and ``display``, which
        workers provide) and names left for Python to resolve at run time are skipped.

    Raises
    ------
    nbcluster.errors.BadArgument
        When a name the cell reads is not defined, or a value cannot travel (an open file,
        something cloudpickle refuses, a structure nested too deeply): the message names it
        and says what to do instead.
    """
    result = Capture()
    for name, line in free.items():
        if name not in namespace:
            if line is None or name in _BUILTINS:
                continue
            raise BadArgument(f"`{name}` (cell line {line}) is not defined in the notebook: define it in an earlier "
                              "cell or in this one before it is used")  # fmt: skip
        value = namespace[name]
        if isinstance(value, handles.Handle):  # a Dask dependency of each batch: never pickled
            result.held[name] = value
            continue
        result.direct[name] = value
        if isinstance(value, ModuleType):
            result.modules[name] = value.__name__
            continue
        large = pickle_values and _add(result, name, value)
        if read_only_array(value) or (large and shareable(value, arrays=True)):
            result.read_only.append(name)  # shared: a function's large arrays made read-only there
        elif not large and not shareable(value):
            result.copied.append(name)  # a large one is copied for every item on the worker
    return result


# `display` is a builtin in IPython only while a cell runs, and workers provide their own.
_BUILTINS = frozenset([*dir(builtins), "display"])
_ATOMS = (int, float, complex, str, bytes, type(None), type(Ellipsis), type(NotImplemented), range, slice,
          ModuleType, type, BuiltinFunctionType, enum.Enum)  # fmt: skip


def shareable(value: Any, *, arrays: bool = False) -> bool:
    """Whether items may share `value`: nothing an item does to it can be seen by the next.

    Numbers, strings, bytes, None, ranges, modules, classes, builtin functions, enum
    members, numpy scalars and dtypes; tuples (named ones too) and frozensets of shareable
    values; functions (and ufuncs) imported from a module (they travel by reference); and
    notebook functions (module ``__main__``) whose globals that their code reads, closure
    cells and defaults are all shareable, recursively. Anything else (lists, dicts, sets,
    arrays, instances, bound methods) is not. Classes count as shareable although their
    attributes could be changed: an item that changes a class changes it for the worker,
    as in the kernel. A value nested too deeply to tell is not shareable (copied, which is
    always correct).

    Parameters
    ----------
    value : Any
        A captured value.
    arrays : bool
        True when the value is loaded on a worker, which makes the large plain arrays
        (`read_only_array`) that a notebook function reads as a global or in its closure
        read-only (`worker.context.freeze`): such a function is shareable then.

    Returns
    -------
    bool
        True when `value` can be loaded once per worker and shared by its items.

    Examples
    --------
    >>> shareable((1, "a", None)), shareable([1]), shareable((1, [2]))
    (True, False, False)
    >>> K = 3
    >>> def f(x):
    ...     return x * K
    >>> shareable(f)
    True
    """
    try:
        return _shareable(value, set(), arrays)
    except RecursionError:
        return False


def _shareable(value: Any, seen: set[int], arrays: bool, read: bool = False) -> bool:
    """`shareable`; `read`: `value` is what a notebook function reads (a global, a closure cell)."""
    if isinstance(value, _ATOMS) or (arrays and read and read_only_array(value)):
        return True
    # A named tuple too, unless its class gave it a __dict__ (attributes one could set).
    if (isinstance(value, tuple) and not hasattr(value, "__dict__")) or type(value) is frozenset:
        return all(_shareable(v, seen, arrays) for v in value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic | numpy.dtype) and not isinstance(value, numpy.void):
        return True
    if _by_reference(value):
        return True  # a function (or ufunc) the worker imports: nothing of the notebook's travels
    if type(value) is not FunctionType:
        return False
    if id(value) in seen:
        return True  # a recursive function: the rest of it is being checked
    seen.add(id(value))
    cells = [cell_value(c) for c in value.__closure__ or ()]
    defaults = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
    reads = [value.__globals__[n] for n in code_names(value.__code__) if n in value.__globals__]
    return all(_shareable(v, seen, arrays) for v in defaults) and all(
        _shareable(v, seen, arrays, read=True) for v in (*cells, *reads)
    )


def read_only_array(value: Any) -> bool:
    """Whether `value` is a large plain numpy array, which items share read-only.

    Parameters
    ----------
    value : Any
        A captured value.

    Returns
    -------
    bool
        True for a `numpy.ndarray` (not a subclass, not of objects) of over `LARGE` bytes.
    """
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(value) is numpy.ndarray and not value.dtype.hasobject and value.nbytes > LARGE


def _by_reference(value: Any) -> bool:
    """Whether pickle sends `value` by reference: it is its module's attribute of its name."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    module = getattr(value, "__module__", None)
    if not isinstance(name, str) or not isinstance(module, str) or module == "__main__":
        return False
    return functools.reduce(lambda found, part: getattr(found, part, None), name.split("."), sys.modules.get(module)) is value


def _add(result: Capture, name: str, value: Any) -> bool:
    """Pickle `value` into `result.values`, or `result.large` (then True): one line if it cannot travel."""
    buffers: list[pickle.PickleBuffer] = []
    header = _dumps(lambda: f"`{name}`", value, protocol=5, buffer_callback=buffers.append)
    size = len(header) + sum(b.raw().nbytes for b in buffers)
    if size > LARGE:
        digest = hashlib.blake2b(header, digest_size=16)
        for b in buffers:
            digest.update(b.raw())
        result.large[name] = (value, digest.hexdigest(), size)
        return True
    result.values[name] = cloudpickle.dumps(value, protocol=5) if buffers else header
    return False


def _dumps(what: Callable[[], str], value: Any, **kwargs: Any) -> bytes:
    """`value` cloudpickled to travel to the workers; one line naming `what()` (a name, an item) if it cannot.

    `what` is called only then: describing an item costs more than pickling a small one.
    """
    if isinstance(value, io.IOBase) and hasattr(value, "name"):  # a file, not a BytesIO/StringIO
        # cloudpickle would send a snapshot of a read-mode file's contents, not the file.
        raise BadArgument(f"{what()} is an open file and cannot be sent to the workers: open it inside the cell instead")
    try:
        return cloudpickle.dumps(value, **kwargs)
    except RecursionError:
        raise BadArgument(f"{what()} cannot be sent to the workers: it is nested too deeply to pickle") from None
    except Exception as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
        raise BadArgument(f"{what()} cannot be sent to the workers: {why}. Create it inside the cell instead, "
                          "or pass what it is made from") from None  # fmt: skip


def copyable(what: str, value: Any) -> bytes | None:
    """`value` pickled, for ``--local`` items to load a copy each; None, with a line, if it cannot be.

    Parameters
    ----------
    what : str
        What it is, for the line: "the function", "`xs`".
    value : Any
        The value.

    Returns
    -------
    bytes or None
        Its pickle; None when it cannot be pickled, and the items in the kernel then share the
        notebook's own object (the line says so).
    """
    try:
        return cloudpickle.dumps(value, protocol=5)
    except Exception as e:
        print(f"nbcluster: --local: {what} cannot be copied for each item ({type(e).__name__}: {e}); "
              "the items in the kernel share the notebook's own object")  # fmt: skip
        return None


def code_index(values: Any) -> dict[str, list[tuple[str, int, int]]]:
    """co_name -> [(filename, first line, last line)] for the notebook functions in `values`.

    cloudpickle renames the file of every code object it ships by value to
    "<dynamic-code>"; names and line numbers survive, so a worker's frame can be mapped
    back to the notebook cell the function was defined in (`tracebacks.py`). Functions,
    and the methods and properties of classes, are indexed, with every function nested in
    them.

    Parameters
    ----------
    values : iterable
        The captured values and the run's function.

    Returns
    -------
    dict of str to list of (str, int, int)
        Each code object's name -> where each code object of that name is.
    """
    index: dict[str, list[tuple[str, int, int]]] = {}
    todo: list[Any] = []
    for value in values:
        for member in vars(value).values() if isinstance(value, type) else [value]:
            member = getattr(member, "__func__", member)
            todo.append(getattr(getattr(member, "fget", member), "__code__", None))
    while todo:  # code objects nest as a tree (co_consts): each is met once per value holding it
        code = todo.pop()
        if not isinstance(code, CodeType):
            continue
        last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
        index.setdefault(code.co_name, []).append((code.co_filename, code.co_firstlineno, last))
        todo.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return index


class Shipments:
    """Large values on one client's workers, by content digest (see module docstring)."""

    def __init__(self) -> None:
        self.futures: dict[str, Any] = {}  # digest -> Future holding the value on the cluster
        self.by_name: dict[str, str] = {}
        self.lock = threading.Lock()

    def ship(
        self, client: Any, large: dict[str, tuple[Any, str, int]]
    ) -> tuple[list[tuple[str, str, int]], list[str]]:
        """Put each large value on the workers, unless the same content is already there.

        A value is scattered to every worker at most once per content; a name now bound to
        other content releases the old copy (once no other name uses it).

        Parameters
        ----------
        client : distributed.Client
            The cluster's client.
        large : dict of str to (Any, str, int)
            `Capture.large`: name -> (value, digest, size).

        Returns
        -------
        shipped : list of (str, str, int)
            (name, Dask key, size) of each large value, for the run's context.
        notes : list of str
            What the report line should say of each ("sent x (200.0 MB) once to each of 4
            workers", or "already on the workers").
        """
        shipped, notes = [], []
        with self.lock:
            for name, (value, digest, size) in large.items():
                future = self.futures.get(digest)
                if future is not None and future.status == "finished":
                    notes.append(f"{name} ({human(size)}) already on the workers")
                else:
                    future = self.futures[digest] = scatter(client, f"nbcluster-capture-{digest}", value, size)
                    notes.append(f"sent {name} ({human(size)}) once to each of {len(_compat.workers(client))} workers")
                old, self.by_name[name] = self.by_name.get(name), digest
                if old is not None and old != digest and old not in self.by_name.values():
                    self.futures.pop(old, None)  # dropping the future frees the workers' copies
                shipped.append((name, future.key, size))
        return shipped, notes

    def future(self, key: str) -> Any:
        """The Future that holds a shipped value on the cluster, by its Dask key.

        Parameters
        ----------
        key : str
            The value's Dask key (``nbcluster-capture-<digest>``).

        Returns
        -------
        distributed.Future or None
            Its Future, or None when this client shipped no such value.
        """
        return self.futures.get(key.removeprefix("nbcluster-capture-"))

    def reship(self, client: Any, key: str, large: dict[str, tuple[Any, str, int]], workers: list[str] | None) -> bool:
        """Scatter again a value whose every holder died; False if it is not one of `large`.

        Parameters
        ----------
        client : distributed.Client
            The cluster's client.
        key : str
            The Dask key a batch reported lost.
        large : dict of str to (Any, str, int)
            The run's large values (`Capture.large`), still held in the kernel.
        workers : list of str or None
            Where to put it again; None broadcasts it to every worker.

        Returns
        -------
        bool
            True when the value was scattered again.
        """
        for value, digest, size in large.values():
            if key == f"nbcluster-capture-{digest}":
                with self.lock:
                    self.futures[digest] = scatter(client, key, value, size, workers)
                return True
        return False


def scatter(client: Any, key: str, value: Any, size: int, workers: list[str] | None = None) -> Any:
    """Put `value` on the workers under `key`, and have them keep it (`worker.context.pin`).

    Without `workers` it is broadcast: every worker gets its copy now, in parallel, before its
    first batch. Pinning the copies before Dask's memory manager drops the "extra" replicas
    (every 2 s) saves each worker a later fetch. It is only that, a saving: a worker that
    misses it fetches the value on its first batch. So it asks only the workers that hold the
    key (they are alive), and waits at most `PIN_WAIT_S`: a worker that died a moment ago
    would otherwise hold the caller up for its connect timeout.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    key : str
        The value's Dask key.
    value : Any
        The value (a large captured value, or a run's context blob).
    size : int
        Its pickled size in bytes (its weight in the workers' LRU).
    workers : list of str, optional
        Put it only there (a value sent again to the worker that asked for it).

    Returns
    -------
    distributed.Future
        The value's Future: the workers' copies live while it does.
    """
    future = client.scatter({key: value}, workers=workers, broadcast=workers is None, hash=False)[key]

    def run() -> None:
        with contextlib.suppress(Exception):  # the client closed meanwhile: nothing to save any more
            if holders := client.who_has([future]).get(key, ()):
                client.run(pin, [(key, size)], workers=list(holders), on_error="ignore")

    threads.spawn(run, name="nbcluster-pin").wait(PIN_WAIT_S)
    return future


_SHIPMENTS: weakref.WeakKeyDictionary[Any, Shipments] = weakref.WeakKeyDictionary()


def shipments(client: Any) -> Shipments:
    """The `Shipments` of a client: the same object for every call with it, dropped with it.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.

    Returns
    -------
    Shipments
        This client's large values on the cluster.
    """
    # One dict call (atomic under the GIL): two threads asking at once get the same object.
    return _SHIPMENTS.setdefault(client, Shipments())


class Job:
    """What a run runs, made once in the kernel before anything is sent.

    A job is the run's code (a parsed `Cell` or a function), its `Plan`, the `Capture`, the
    seed, and the policy for failures and batch sizes. Everything that can fail on the user's
    input fails while the job is made, naming the culprit: a function that cannot be pickled,
    an item that cannot travel. The code is serialised once (marshal for a cell's code
    objects, which keeps their filename for tracebacks; cloudpickle for a function);
    `for_workers` adds the keys of the large values shipped (which depend on the cluster)
    and pickles the context each worker loads once (`worker.Context`). A failure record
    coming back from an item becomes an `ItemError` (`item_error`), with the item's
    parameters and where the notebook functions it shipped came from.

    `sent_from` is the index of the first item that runs on the workers (after the
    `--local K` items), or None when every item runs in the kernel.
    """

    def __init__(
        self, plan: Plan, *, cell: Cell | None = None, fn: Any = None, capture: Capture | None = None,
        seed: int | None = None, retries: int = 0, batch: int | str = "auto", sent_from: int | None = None,
        persist: bool = False, reads_handles: bool = False, trial: TrialSpec | None = None,
    ):  # fmt: skip
        self.plan, self.cell, self.fn, self.seed = plan, cell, fn, seed
        self.capture = capture if capture is not None else Capture()
        self.batch = None if batch == "auto" else int(batch)  # items per batch; None: the policy sizes them
        self.retries = retries  # how many more times a failed item runs
        self.persist = persist  # the values stay on the workers, behind handles
        self.reads_handles = reads_handles  # items or captured names are handles: Dask dependencies
        self.trial = trial  # a trial run's spec: its items report, and may be stopped (`trials.py`)
        # Where its notebook functions came from (`code_index`): tracebacks map back to their cells.
        self.sources = code_index([*self.capture.direct.values(), *([fn] if fn is not None else [])])
        if sent_from is not None:  # fail early, naming the item, when item values cannot travel
            item = plan.items[sent_from]
            if reads_handles:  # its handles travel as Dask dependencies, not in the blob
                item = handles.held_slots([item], 0)[0][0]
            _dumps(lambda: f"item {sent_from} ({plan.describe(sent_from)})", item)
        # The code's wire form, made once; None for a job whose items all run in the kernel.
        self.wire = self._code(wire=True) if sent_from is not None else None

    def hold_handles(self, strongly: bool) -> None:
        """Hold the handles the run reads weakly (`handles.Read`: the run is over), or strongly again.

        Parameters
        ----------
        strongly : bool
            True for a retry, which takes them back: one line if one was deleted or released
            since (`handles.Read.recall`). False once the run is over: `del` of the notebook's
            variables then frees the values.
        """
        kind, how = (handles.Read, handles.Read.recall) if strongly else (handles.Handle, handles.Read)
        if self.reads_handles:
            if isinstance(self.plan.items, list):  # a range holds no handle
                self.plan.items[:] = [handles.replaced(item, kind, how) for item in self.plan.items]
            self.capture.held = {n: how(h) for n, h in self.capture.held.items()}

    def for_kernel(self) -> worker.Context:
        """The context `--local` items run in: the values as they are, but no item sees another's changes.

        The large plain arrays are read-only views (the notebook's own arrays stay writeable).
        The values each item gets its own copy of are pickled together (`copyable`), and so
        is a notebook function that reads a large array (here it reads the notebook's own
        array), and a function run that is not `shareable`.

        Returns
        -------
        worker.Context
            A context built in the kernel.
        """
        c = self.capture
        namespace = {"__name__": "__main__", **c.direct}
        arrays = [n for n in c.read_only if read_only_array(namespace[n])]
        for name in arrays:
            namespace[name] = namespace[name].view()
            namespace[name].flags.writeable = False
        copied = [*c.copied, *(n for n in c.read_only if isinstance(namespace[n], FunctionType))]
        fresh = copyable(", ".join(f"`{n}`" for n in copied), {n: c.direct[n] for n in copied}) if copied else None
        spec = {**self._binding(), **self._code(wire=False), "large": [], "read_only": arrays, "arrays": arrays,
                "fresh": fresh}  # fmt: skip
        return worker.Context(spec, namespace)

    def for_workers(self, large: list[tuple[str, str, int]]) -> bytes:
        """The context blob the workers load: code, binding, captured names, large values' keys.

        Parameters
        ----------
        large : list of (str, str, int)
            (name, Dask key, size) of the large values shipped to this cluster
            (`Shipments.ship`).

        Returns
        -------
        bytes
            The pickled context spec, which `worker.Context.from_payload` loads.
        """
        assert self.wire is not None, "a job made for the kernel only sends nothing"
        c = self.capture
        values = {n: b for n, b in c.values.items() if n not in c.copied}
        # The values to copy together, so that two names of one object (or a function and the list it reads)
        # are still one object in an item. In-band buffers: each unpickling copies them.
        fresh = cloudpickle.dumps({n: c.direct[n] for n in c.copied}, protocol=5) if c.copied else None
        # Plain data only (the values and the code are bytes already): pickle, not cloudpickle's slower Pickler.
        return pickle.dumps({**self._binding(), **self.wire, "large": large, "modules": c.modules, "values": values,
                             "fresh": fresh, "copied": c.copied, "read_only": c.read_only}, protocol=5)  # fmt: skip

    def item_error(self, index: int, record: worker.ErrorRecord, where: str) -> ItemError:
        """A failure record from item `index`, run on `where` ("the cluster" or "the kernel").

        Parameters
        ----------
        index : int
            The item's index in the run.
        record : worker.ErrorRecord
            The failure record the item's exception became.
        where : str
            Where it ran: ``"the cluster"`` or ``"the kernel"``.

        Returns
        -------
        ItemError
            The error with the item's parameters, its traceback mapped to the notebook cells the
            shipped functions came from.
        """
        return ItemError(index, self.plan.params(index), record, where, self.sources)

    def _binding(self) -> dict[str, Any]:
        """How an item binds names, for `worker.Context`."""
        p = self.plan
        return {"kind": "cell" if self.cell is not None else "function", "mode": p.mode, "names": p.names,
                "target": p.target, "unpacks": p.unpacks, "seed": self.seed,
                "trial": self.trial}  # fmt: skip

    def _code(self, *, wire: bool) -> dict[str, Any]:
        """The run's code: a cell's code marshalled; a function as it is, or pickled for the workers (`wire`)."""
        if (cell := self.cell) is not None:  # marshalled for the kernel too: one form, which `worker.Context` loads
            return {"filename": cell.filename, "source": cell.source, "body": cell.body and marshal.dumps(cell.body),
                    "last": cell.last and marshal.dumps(cell.last)}  # fmt: skip
        if not wire:  # a function that is not `shareable` is copied for each item in the kernel too
            if shareable(self.fn) or copyable("the function", self.fn) is None:
                return {"fn": self.fn}
            fn_copy, holders = function_copy(self.fn)
            return {"fn": self.fn, "fn_copy": fn_copy, "holders": holders}
        fn = _dumps(lambda: f"the function {getattr(self.fn, '__name__', repr(self.fn))}", self.fn)
        # A function that reads what an item could change is unpickled again per item.
        return {"fn": fn, "fresh_fn": not shareable(self.fn, arrays=True)}
