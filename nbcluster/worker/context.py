"""Worker side: a cell run's context, unpickled once per worker and cached.

The *context* is one opaque pickled blob per cell run: the cell's code (or function), the
small captured variables (each pickled on its own in the kernel, so a bad one is named
before anything is sent), modules to import, how an item binds names, the seed, and the
Dask keys of the large values. Up to `INLINE_CONTEXT` bytes it rides inline in every
batch; above that it is scattered and fetched by key. Either way each worker unpickles it
once (`load`, cached in `_CONTEXTS`) however many batches it runs. For `--local` the
kernel builds a `Context` directly (`job.for_kernel`).

**Each item starts from the notebook's state** (`run/capture.py` sorts the values). The
shareable values are loaded once, into `Context.namespace`. The others come as one pickled
blob (`Context.fresh`) that `item_namespace` unpickles again for every item, and a
function that reads such a value is unpickled again for every item (`Context.item_function`).
A large plain array is shared through a read-only view (`Context.shared`): writing to it
fails, and `read_only_error` turns numpy's error into one line naming the variable. A large
pandas object gets a shallow copy per item, which pandas' copy-on-write (pandas 3) keeps
apart from the others; any other large value is pickled once here and unpickled for every
item.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import linecache
import marshal
import pickle
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Any

import cloudpickle

from nbcluster.worker.loop import cell_loop
from nbcluster.worker.objects import fetch

#: Fresh copies of some captured values, by name, for one item (`Context.shared`).
Copy = Callable[[], dict[str, Any]]

if TYPE_CHECKING:  # a type only: the worker package loads no more than it runs
    from nbcluster._wire import TrialSpec

INLINE_CONTEXT = 64 * 1024  # bytes: a bigger context is scattered instead of sent per batch
_CONTEXTS: OrderedDict[str, Context] = OrderedDict()
_CONTEXTS_LOCK = threading.Lock()
_KEEP_CONTEXTS = 8


class Context:
    """A cell run's shared state on one worker (or in the kernel for --local)."""

    def __init__(self, spec: dict[str, Any], namespace: dict[str, Any]):
        self.kind: str = spec["kind"]
        self.mode: str = spec["mode"]
        self.names: tuple[str, ...] = tuple(spec["names"])
        self.target: str = spec["target"]
        self.unpacks: bool = spec["unpacks"]
        self.positional: bool = spec["positional"]
        self.seed: int | None = spec["seed"]
        self.large: list[tuple[str, str, int]] = spec["large"]  # (name, key, size)
        self.read_only: tuple[str, ...] = tuple(spec.get("read_only", ()))  # large values, shared read-only
        self.arrays: set[str] = set(spec.get("arrays", ()))  # what a write error names (`read_only_error`)
        self.fresh: bytes | None = spec.get("fresh")  # the values each item gets its own copy of
        # A trial run's (`worker/trial.py`): each item then runs alone, as the thread's current item.
        self.trial: TrialSpec | None = spec.get("trial")
        # The function of a "function" item; the code of a "cell" one. `fn_blob`: the
        # function pickled, when it reads values each item must get its own copy of.
        self.fn: Callable[..., Any] | None = spec.get("fn")
        self.fn_blob: bytes | None = spec.get("fn_blob")
        self._large_blob: tuple[tuple[int, ...], bytes] | None = None  # copied large values, pickled
        # Module globals hold `__builtins__`, and C code that imports (numpy's lazy imports, any
        # `PyImport_Import`) reads it from the running frame's globals: `exec` adds it to the
        # namespace it runs in, a cell's loop (`loop.loop_function`) runs there without `exec`.
        namespace.setdefault("__builtins__", builtins)
        self.namespace = namespace
        self.body: CodeType | None = None
        self.last: CodeType | None = None
        self.bind: CodeType | None = None
        self.loop: CodeType | None = None  # the cell, or the function's body, as one loop (`loop.py`)
        if self.kind == "cell":
            filename, source = spec["filename"], spec["source"]
            linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
            # marshal, not cloudpickle: cloudpickle renames every code object's file to
            # "<dynamic-code>", and the cell's filename is what maps tracebacks to cell lines.
            body = spec["body"]  # None for a cell that is one expression
            self.body = marshal.loads(body) if isinstance(body, bytes) else body
            last = spec["last"]
            self.last = marshal.loads(last) if isinstance(last, bytes) else last
            if self.unpacks and self.mode == "over":
                self.bind = compile(
                    f"{self.target} = __nbcluster_item__", "<--over>", "exec", dont_inherit=True
                )
            # The one loop per chunk reads one namespace for all its items: only when every
            # captured value is shared (`shared` tells the large ones).
            if (self.seed is None and self.body is None and self.bind is None and self.fresh is None
                    and self.mode in ("over", "grid", "zip")):  # fmt: skip
                self.loop = cell_loop(source, filename, self.names, tuple_target=self.mode != "over")

    def shared(self, large_values: tuple[Any, ...]) -> tuple[dict[str, Any], list[Copy]]:
        """What the items of a batch read: the shared namespace, and how each item copies the rest.

        Parameters
        ----------
        large_values : tuple
            The values of `large`, in that order, fetched on this worker.

        Returns
        -------
        namespace : dict
            The shareable values, with the large arrays as read-only views.
        copies : list of callable
            Each returns fresh copies of some values, by name, for one item (`item_namespace`):
            the small values to copy, unpickled again; a large pandas object, as a shallow
            copy that pandas' copy-on-write keeps apart; any other large value, unpickled again.
        """
        namespace = self.namespace
        copies: list[Copy] = [] if self.fresh is None else [functools.partial(pickle.loads, self.fresh)]
        if not large_values:
            return namespace, copies
        namespace = dict(namespace)
        copied, lazy = {}, {}
        for (name, _, _), value in zip(self.large, large_values, strict=True):
            if name in self.read_only and isinstance(value, FunctionType):
                self.arrays.update(freeze(value))  # this worker's own copy, cached for every run
                namespace[name] = value
            elif name in self.read_only and _plain_array(value):
                view = value.view()  # the worker's copy stays as it is for the next run
                view.flags.writeable = False
                namespace[name] = view
                self.arrays.add(name)
            elif name in self.read_only:  # immutable: a long string, a class
                namespace[name] = value
            elif _copy_on_write(value):
                lazy[name] = value
            else:
                copied[name] = value
        if lazy:
            copies.append(lambda: {n: v.copy(deep=False) for n, v in lazy.items()})
        if copied:
            ids = tuple(map(id, copied.values()))
            if self._large_blob is None or self._large_blob[0] != ids:
                self._large_blob = ids, cloudpickle.dumps(copied, protocol=5)
            copies.append(functools.partial(pickle.loads, self._large_blob[1]))
        return namespace, copies

    def item_function(self) -> Callable[..., Any]:
        """The function an item calls: its own copy when it reads values to copy.

        Returns
        -------
        callable
            `fn` itself, or a fresh unpickling of it (with fresh copies of what it reads).
        """
        if self.fn_blob is not None:
            fn: Callable[..., Any] = cloudpickle.loads(self.fn_blob)
            return fn
        assert self.fn is not None  # set for every "function" context
        return self.fn

    @classmethod
    def from_payload(cls, payload: bytes) -> Context:
        """Build a worker's context from the pickled blob the kernel sent.

        Imports the modules the cell uses and unpickles each captured value into a fresh
        ``__main__`` namespace, so a missing module or a value that cannot load here is named.

        Parameters
        ----------
        payload : bytes
            The cloudpickled context spec the kernel made (`job.Job.for_workers`).

        Returns
        -------
        Context
            The context, ready to run items.

        Raises
        ------
        ImportError
            When a module the cell uses cannot be imported on this worker (it says which, and to
            install it there).
        RuntimeError
            When a captured variable cannot be unpickled here (it names the variable).
        """
        spec = cloudpickle.loads(payload)
        namespace: dict[str, Any] = {"__name__": "__main__"}
        for name, module in spec["modules"].items():
            try:
                namespace[name] = importlib.import_module(module)
            except ImportError as e:
                raise ImportError(
                    f"the cell uses `{name}` (module {module}), which cannot be imported on the "
                    f"worker: {e}. Install it on the workers"
                ) from None
        for name, blob in spec["values"].items():
            try:
                namespace[name] = cloudpickle.loads(blob)
            except Exception as e:
                raise RuntimeError(
                    f"the variable `{name}` could not be loaded on the worker: {type(e).__name__}: {e} "
                    "(is a module it needs missing there?)"
                ) from None
        if spec.get("fresh") is not None:
            try:
                pickle.loads(spec["fresh"])  # once here, so that a value that cannot load is named
            except Exception as e:
                names = ", ".join(f"`{n}`" for n in spec.get("copied", ())) or "a captured value"
                raise RuntimeError(
                    f"the variables {names} could not be loaded on the worker: {type(e).__name__}: {e} "
                    "(is a module they need missing there?)"
                ) from None
        if spec["kind"] == "function":
            if spec.get("fresh_fn"):
                spec["fn_blob"] = spec["fn"]
            spec["fn"] = cloudpickle.loads(spec["fn"])
            if not spec.get("fresh_fn"):
                spec["arrays"] = freeze(spec["fn"])
        return cls(spec, namespace)


def freeze(fn: Any) -> list[str]:
    """Make the plain numpy arrays a notebook function reads read-only, in place; their names.

    Only called on a function that the kernel found shareable but for large arrays
    (`run.capture.shareable` with ``arrays=True``), unpickled here: every array it reads
    as a global or from its closure, and so do the notebook functions it reads, is this
    worker's own copy, shared by the items.

    Parameters
    ----------
    fn : Any
        The function, as loaded on this worker.

    Returns
    -------
    list of str
        The names the arrays go by in the function's globals or closure.
    """
    names: list[str] = []
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if type(f) is not FunctionType or f.__module__ != "__main__" or id(f) in seen:
            continue  # an imported function's globals are its module's, never touched
        seen.add(id(f))
        cells = [(n, _contents(c)) for n, c in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True)]
        for name, value in [*f.__globals__.items(), *cells]:
            if _plain_array(value):
                value.flags.writeable = False
                names.append(name)
            elif type(value) is FunctionType:
                todo.append(value)
    return names


def _plain_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(value) is numpy.ndarray and not value.dtype.hasobject


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell: a name the enclosing function binds later
        return None


def item_namespace(shared: dict[str, Any], copies: list[Copy]) -> dict[str, Any]:
    """An item's own namespace: the shared values, and a fresh copy of the others.

    Parameters
    ----------
    shared : dict
        The namespace the batch's items share (`Context.shared`).
    copies : list of callable
        Each returns fresh copies of some values, by name (`Context.shared`).

    Returns
    -------
    dict
        A new dict: what the item binds or changes stays its own.
    """
    namespace = dict(shared)
    for copy in copies:
        namespace.update(copy())
    return namespace


def _copy_on_write(value: Any) -> bool:
    """A pandas object whose shallow copy behaves as a copy (pandas 3 is copy-on-write)."""
    pandas = sys.modules.get("pandas")
    return (
        pandas is not None
        and isinstance(value, pandas.DataFrame | pandas.Series)
        and int(pandas.__version__.split(".")[0]) >= 3
    )


def read_only_error(e: BaseException, names: tuple[str, ...]) -> BaseException:
    """numpy's error for a write to a shared read-only array, as one line naming the variable.

    Parameters
    ----------
    e : BaseException
        What an item raised.
    names : tuple of str
        The large arrays the items share read-only (`Context.arrays`).

    Returns
    -------
    BaseException
        `e` itself, unless it is numpy's "read-only" `ValueError` and the run shares arrays:
        then a `ValueError` that names them and the fix, with `e`'s traceback.

    Examples
    --------
    >>> print(read_only_error(ValueError("assignment destination is read-only"), ("big",)))
    `big` is a large captured array, which the items share read-only: to change it, copy it in the cell first (big = big.copy())
    """
    if not names or type(e) is not ValueError or "read-only" not in str(e):
        return e
    which = " or ".join(f"`{n}`" for n in names)
    what = "a large captured array, which the items share" if len(names) == 1 else "large captured arrays, which the items share"
    fix = "; ".join(f"{n} = {n}.copy()" for n in names)
    return ValueError(f"{which} is {what} read-only: to change it, copy it in the cell first ({fix})").with_traceback(
        e.__traceback__
    )


def load(key: str, inline: bytes | None) -> Context:
    """The context of a run: cached, else unpickled from `inline` or fetched by `key`.

    Parameters
    ----------
    key : str
        The context's key: its name in this worker's cache, and its Dask key when it was
        scattered rather than sent inline.
    inline : bytes or None
        The pickled context when it travels with every batch; None when it must be fetched by
        `key`.

    Returns
    -------
    Context
        The run's context, the same object for every batch on this worker (the last eight
        runs' contexts are kept).

    Raises
    ------
    nbcluster.errors.Lost
        When the context was scattered and no worker holds it any more.
    """
    with _CONTEXTS_LOCK:
        context = _CONTEXTS.get(key)
        if context is not None:
            _CONTEXTS.move_to_end(key)
            return context
    # Unpickle outside the lock; two threads racing on the first batch both build one.
    context = Context.from_payload(inline if inline is not None else fetch(key, 0, keep=False))
    with _CONTEXTS_LOCK:
        _CONTEXTS[key] = context
        while len(_CONTEXTS) > _KEEP_CONTEXTS:
            _CONTEXTS.popitem(last=False)
    return context
