"""Worker side: a cell run's context, loaded once per worker, and the large values it reads.

The *context* is one opaque pickled blob per cell run: the cell's code (or function), the
small captured variables (each pickled on its own in the kernel, so a bad one is named
before anything is sent), modules to import, how an item binds names, the seed, and the
Dask keys of the large values. Up to `INLINE_CONTEXT` bytes it rides inline in every
batch; above that it is scattered and fetched by key. Either way each worker unpickles it
once (`load`, the last `KEEP_CONTEXTS` kept) however many batches it runs. For `--local` the
kernel builds a `Context` directly (`capture.Job.for_kernel`).

**Each item starts from the notebook's state** (`run/capture.py` sorts the values). The
shareable values (immutable ones, and large arrays made read-only) are loaded once, into
`Context.namespace`, which the items share. The small others come as one pickled blob
(`Sharing.fresh`) that each item unpickles again. A large plain array is shared through a
read-only view (`Context.shared`): writing to it fails, and `read_only_error` turns numpy's
error into one line naming the variable. A large pandas object gets a shallow copy per
item, which pandas' copy-on-write (pandas 3) keeps apart from the others. Any other large
value (an object holding arrays, a model, a big dict), and a function that reads values to
copy, is pickled once here with its arrays out of band (pickle protocol 5, `copier`): each
item unpickles its own copy around read-only views of this worker's arrays, so the object
and all else it holds are the item's own for the cost of unpickling it without its arrays,
and a write to one of those arrays fails with a line naming the variable.

**Large values** (pickles over 1 MB) are scattered to every worker by the kernel and kept in
`_OBJECTS`, an LRU bounded in bytes, *outside* Dask's store: Dask's active memory manager
drops "superfluous" replicas of scattered data every few seconds, which would make the next
cell fetch the value again (that is also why they are not task dependencies). Right after
the scatter the kernel runs `pin` on every worker, which moves the fresh replica into
`_OBJECTS` (the same object, no copy); a worker that joins later fetches the value from a
peer on its first batch (`fetch`). A key no worker holds any more raises `Lost`, and the
kernel scatters it again.

**Runs told to stop.** `stop_run(token)`, sent to every worker by the kernel on interrupt or
`Results.cancel()`, records the run's stop token, which its batches look up between chunks
of items (`worker/__init__.py`). The tokens live here, with the thread's item output
(`running`), so that trial items (`trial.py`, which the batch runner imports) read both
without an import cycle.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import functools
import importlib
import linecache
import marshal
import pickle
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import cloudpickle

from nbcluster.errors import Lost

if TYPE_CHECKING:  # a type only: the worker package loads no more than it runs
    from nbcluster._wire import TrialSpec

#: Fresh copies of some captured values, by name, for one item (`Context.shared`).
Copy = Callable[[], dict[str, Any]]
V = TypeVar("V")

SHARED_ARRAY = 1_000_000  # bytes: an array this large in a value copied per item is shared read-only
INLINE_CONTEXT = 64 * 1024  # bytes: a bigger context is scattered instead of sent per batch
KEEP_CONTEXTS = 8
OBJECTS_BYTES = 2_000_000_000  # large values kept, at most (or 40% of the worker's memory limit)
FETCH_CHECK_S = 2.0  # while fetching a value, how often to check that someone still holds it
_FETCHING = threading.Lock()  # one fetch at a time: threads wanting the same value wait for it
_STOPPED: dict[str, None] = {}  # stop tokens of runs told to stop, oldest first (the last 256)
# Names through which a one-expression cell could write to the namespace its items share.
_INTROSPECTION = frozenset({"globals", "locals", "vars", "exec", "eval", "dir", "breakpoint", "_getframe",
                            "currentframe", "f_globals", "f_locals", "f_back", "__nbcluster_items__",
                            "__nbcluster_values__"})  # fmt: skip


class Kept(Generic[V]):
    """Values by key, the least recently used dropped first once their sizes add up to over
    `limit` (the latest always stays). Worker threads and the event loop share it: its lock
    is never held over the network.

    Parameters
    ----------
    limit : int
        What the sizes of the values kept may add up to (bytes, or a count with sizes of 1).

    Examples
    --------
    >>> kept = Kept[bytes](limit=10)
    >>> for key, report in [("a", b"12345"), ("b", b"123456"), ("c", b"1")]:
    ...     kept.add(key, report, len(report))
    >>> kept.size, kept.get("b"), kept.get("c", take=True), kept.size
    (7, b'123456', b'1', 6)
    """

    def __init__(self, limit: int):
        self.limit, self.size = limit, 0
        self._values: OrderedDict[str, tuple[V, int]] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def add(self, key: str, value: V, size: int) -> None:
        """Keep `value` as `key`'s (in place of any before), the most recently used.

        Parameters
        ----------
        key : str
            Its key.
        value : Any
            The value.
        size : int
            What it counts for against `limit`.
        """
        with self._lock:
            self.size += size - self._values.pop(key, (None, 0))[1]
            self._values[key] = (value, size)
            while self.size > self.limit and len(self._values) > 1:
                self.size -= self._values.popitem(last=False)[1][1]

    def get(self, key: str, *, take: bool = False) -> V:
        """`key`'s value, now the most recently used; or, with `take`, handed out once.

        Parameters
        ----------
        key : str
            Its key.
        take : bool
            True hands the value out once: it is kept no more.

        Returns
        -------
        Any
            The value.

        Raises
        ------
        KeyError
            When none is kept for `key`.
        """
        with self._lock:
            value, size = self._values.pop(key)
            if take:
                self.size -= size
            else:  # back, as the most recently used
                self._values[key] = (value, size)
            return value


_CONTEXTS = Kept["Context"](limit=KEEP_CONTEXTS)  # each counts 1: the last KEEP_CONTEXTS
_OBJECTS = Kept[Any](limit=OBJECTS_BYTES)  # by pickled size (`_keep` lowers the limit to the worker's memory)


class _Running(threading.local):
    """What this thread's items write to (`worker/__init__.py`), read by a trial's reports too,
    and when it ended its last batch (`worker.run_batch`'s ``idle``)."""

    outputs: dict[int, list[list[Any]]] | None = None  # item index -> chunks; None: the real streams
    follow: tuple[list[Any], Any] = ([], ())  # the batch's (values, indices): they name the item running
    ended: tuple[str | None, float] = (None, 0.0)  # (stop token, perf_counter) at the end of its last batch


running = _Running()


class Code(NamedTuple):
    """What an item runs: a cell's code objects, or a function (and how an item gets its own
    copy of it, when it reads values an item could change)."""

    body: CodeType | None = None
    last: CodeType | None = None
    bind: CodeType | None = None  # `TARGET = __nbcluster_item__` for an unpacking target
    expression: CodeType | None = None  # a one-expression cell, as a loop (`cell_loop`)
    fn: Callable[..., Any] | None = None
    fn_copy: Callable[[], Callable[..., Any]] | None = None  # an item's own copy of `fn` (`function_copy`)


@dataclass
class Sharing:
    """How the items get the captured values: in the shared namespace, shared read-only, or
    copied for each item (module docstring)."""

    large: list[tuple[str, str, int]]  # values scattered apart, fetched by key: (name, key, size)
    read_only: tuple[str, ...]  # large values the items share read-only
    arrays: set[str]  # the read-only arrays, which a write error names (`read_only_error`)
    fresh: bytes | None  # the values each item unpickles its own copy of
    holders: set[str] = field(default_factory=set)  # large values copied around read-only arrays
    large_copy: Copy | None = None  # copies the large values for an item (made once per run)


class Context:
    """A cell run's shared state on one worker (or in the kernel for --local).

    Parameters
    ----------
    spec : dict
        How an item binds names (``kind``, ``mode``, ``names``, ``target``, ``unpacks``), the
        ``seed``, the ``trial``, the code (``filename``, ``source``, ``body``, ``last``, or
        ``fn``, ``fn_copy``) and the captured values apart from `namespace` (``large``,
        ``read_only``, ``arrays``, ``holders``, ``fresh``).
    namespace : dict
        The captured values the items share.
    """

    def __init__(self, spec: dict[str, Any], namespace: dict[str, Any]):
        self.kind: str = spec["kind"]
        self.mode: str = spec["mode"]
        self.names: tuple[str, ...] = tuple(spec["names"])
        self.unpacks: bool = spec["unpacks"]
        self.seed: int | None = spec["seed"]
        self.trial: TrialSpec | None = spec.get("trial")  # each item then a trial (`worker/trial.py`)
        self.sharing = Sharing(spec["large"], tuple(spec.get("read_only", ())), set(spec.get("arrays", ())),
                               spec.get("fresh"), set(spec.get("holders", ())))  # fmt: skip
        # C code that imports (numpy's lazy imports, any `PyImport_Import`) reads `__builtins__`
        # from the running frame's globals, which `exec` adds and a plain function call does not.
        namespace.setdefault("__builtins__", builtins)
        self.namespace = namespace
        self.code = Code(fn=spec.get("fn"), fn_copy=spec.get("fn_copy"))
        if self.kind == "cell":
            filename, source = spec["filename"], spec["source"]
            linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
            # marshal, not cloudpickle: cloudpickle renames every code object's file to
            # "<dynamic-code>", and the cell's filename is what maps tracebacks to cell lines.
            body, last = (marshal.loads(c) if isinstance(c, bytes) else c for c in (spec["body"], spec["last"]))
            bind = expression = None
            if self.unpacks and self.mode == "over":
                bind = compile(f"{spec['target']} = __nbcluster_item__\ndel __nbcluster_item__", "<--over>", "exec",
                               dont_inherit=True)  # fmt: skip
            elif body is None and self.mode in ("over", "grid", "zip"):
                expression = cell_loop(source, filename, self.names, self.mode != "over")
            self.code = Code(body, last, bind, expression)

    def shared(self, large_values: tuple[Any, ...]) -> tuple[dict[str, Any], list[Copy]]:
        """What the items of a batch read: the shared namespace, and how each item copies the rest.

        Parameters
        ----------
        large_values : tuple
            The values of ``sharing.large``, in that order, fetched on this worker.

        Returns
        -------
        namespace : dict
            The shareable values, with the large arrays as read-only views.
        copies : list of callable
            Each returns fresh copies of some values, by name, for one item: the small values
            to copy, unpickled again; a large pandas object, as a shallow copy that pandas'
            copy-on-write keeps apart; any other large value, unpickled again.
        """
        s, namespace = self.sharing, self.namespace
        copies: list[Copy] = [] if s.fresh is None else [functools.partial(pickle.loads, s.fresh)]
        namespace, copied, lazy = dict(namespace), dict[str, Any](), dict[str, Any]()
        for (name, _, _), value in zip(s.large, large_values, strict=True):
            if name in s.read_only and isinstance(value, FunctionType):
                s.arrays.update(freeze(value))  # this worker's own copy, cached for every run
            elif name in s.read_only and _plain_array(value):
                value = value.view()  # the worker's copy stays as it is for the next run
                value.flags.writeable = False
                s.arrays.add(name)
            elif name not in s.read_only:  # else immutable: a long string, a class
                (lazy if _copy_on_write(value) else copied)[name] = value
                continue
            namespace[name] = value
        if lazy:
            copies.append(lambda: {n: v.copy(deep=False) for n, v in lazy.items()})
        if copied:
            if s.large_copy is None:  # a key's value never changes: pickled once per run
                s.large_copy, holding = copier(copied)
                s.holders.update(holding)
            copies.append(s.large_copy)
        return namespace, copies

    def item_function(self) -> Callable[..., Any]:
        """The function an item calls: `fn`, or its own copy when it reads values to copy.

        Returns
        -------
        callable
            The function.
        """
        fn = self.code.fn if self.code.fn_copy is None else self.code.fn_copy()
        assert fn is not None  # set for every "function" context
        return fn

    @classmethod
    def from_payload(cls, payload: bytes) -> Context:
        """Build a worker's context from the pickled blob the kernel sent.

        Imports the modules the cell uses and unpickles each captured value into a fresh
        ``__main__`` namespace, so a missing module or a value that cannot load here is named.

        Parameters
        ----------
        payload : bytes
            The cloudpickled context spec the kernel made (`capture.Job.for_workers`).

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
                why = f"the cell uses `{name}` (module {module}), which cannot be imported on the worker: {e}"
                raise ImportError(f"{why}. Install it on the workers") from None
        for name, blob in spec["values"].items():
            namespace[name] = _loaded(blob, f"the variable `{name}`", "it needs")
        if spec.get("fresh") is not None:  # loaded once here, so that a value that cannot load is named
            copied = ", ".join(f"`{n}`" for n in spec.get("copied", ())) or "a captured value"
            _loaded(spec["fresh"], f"the variables {copied}", "they need")
        if spec["kind"] == "function":  # one that reads values to copy is copied for each item
            spec["fn"] = _loaded(spec["fn"], "the function", "it needs")
            if spec.get("fresh_fn"):
                spec["fn_copy"], spec["holders"] = function_copy(spec["fn"])
            else:
                spec["arrays"] = freeze(spec["fn"])
        return cls(spec, namespace)


def copier(values: dict[str, Any]) -> tuple[Copy, list[str]]:
    """How an item gets its own copy of `values`, whose arrays the copies share read-only.

    Each value is pickled once, its contiguous numpy arrays of `SHARED_ARRAY` bytes or more
    out of band (pickle protocol 5); a copy unpickles the rest of it around read-only views of
    those arrays.

    Parameters
    ----------
    values : dict
        The values, by name.

    Returns
    -------
    copy : callable
        Returns fresh copies of the values, by name.
    holders : list of str
        The names of the values that hold such arrays (a write to one fails: `read_only_error`).

    Raises
    ------
    Exception
        Whatever pickling a value raises.
    """
    pickled = {name: _apart(value) for name, value in values.items()}
    holders = [name for name, (_, views) in pickled.items() if views]
    return lambda: {name: pickle.loads(blob, buffers=views) for name, (blob, views) in pickled.items()}, holders


def function_copy(fn: Callable[..., Any]) -> tuple[Callable[[], Callable[..., Any]], list[str]]:
    """How an item gets its own copy of a notebook function and what it reads (`copier`).

    Parameters
    ----------
    fn : callable
        The function.

    Returns
    -------
    copy : callable
        Returns a fresh copy of the function, whose globals and closure are the copy's own.
    holders : list of str
        The names of the values it reads (as globals or from its closure, its notebook
        functions' too) whose arrays the copies share read-only.

    Raises
    ------
    Exception
        Whatever pickling the function raises.
    """
    copy, holding = copier({"fn": fn})
    # What `_reads` finds is what went into the function's pickle: each pickles alone too.
    holders = [name for name, value in _reads(fn) if holding and type(value) is not FunctionType and _apart(value)[1]]
    return lambda: copy()["fn"], holders


def _apart(value: Any) -> tuple[bytes, list[memoryview]]:
    """`value` pickled without its arrays of `SHARED_ARRAY` bytes or more, and those, read-only."""
    buffers: list[pickle.PickleBuffer] = []

    def apart(buffer: pickle.PickleBuffer) -> bool:  # True keeps it in band: a small array is copied
        if buffer.raw().nbytes < SHARED_ARRAY:
            return True
        buffers.append(buffer)
        return False

    blob = cloudpickle.dumps(value, protocol=5, buffer_callback=apart)
    return blob, [b.raw().toreadonly() for b in buffers]


def _loaded(blob: bytes, what: str, need: str) -> Any:
    try:
        return cloudpickle.loads(blob)
    except Exception as e:
        why = f"{what} could not be loaded on the worker: {type(e).__name__}: {e}"
        raise RuntimeError(f"{why} (is a module {need} missing there?)") from None


def cell_loop(source: str, filename: str, names: tuple[str, ...], tuple_target: bool) -> CodeType | None:
    """A one-expression cell as the code of ``f(items, values)``, a loop that appends its value
    for each item, or None if it must not.

    One call runs a chunk of items, with no call and no namespace per item: the item's names
    are the loop's locals, and its globals the items' shared namespace, which holds only what
    an item cannot change (`Context`). A cell whose items could then tell each other apart
    runs item by item, each in its own namespace: one that binds a name (`:=`), makes a
    `lambda` or a generator (called later, it would see a later item's names), or could write
    its globals (`globals()`, `exec`, frames...).

    Parameters
    ----------
    source : str
        The cell's source, padded so that its line numbers are the notebook's.
    filename : str
        The cell's file name, which tracebacks map to the cell.
    names : tuple of str
        The names an item binds, in order.
    tuple_target : bool
        True when an item is a tuple of values, one per name (``--grid``, ``--zip``).

    Returns
    -------
    code or None
        The loop's code, named ``<module>`` as the cell's top level it stands for.

    Examples
    --------
    >>> values = []
    >>> FunctionType(cell_loop("x + k", "<cell>", ("x",), False), {"k": 10})(iter([1, 2]), values)
    >>> values
    [11, 12]
    >>> cell_loop("(y := x) + 1", "<cell>", ("x",), False) is None
    True
    """
    code = _loop(source, names, tuple_target)
    return None if code is None else _placed(code, filename).replace(co_name="<module>")


@functools.lru_cache(maxsize=KEEP_CONTEXTS)
def _loop(source: str, names: tuple[str, ...], tuple_target: bool) -> CodeType | None:
    """`cell_loop`'s code, before `_placed` in the run's file: compiled once per source, as a
    cell run again has the same (compiling is most of loading a small cell's context)."""
    own = ("__nbcluster_items__", "__nbcluster_values__", *names)
    target = ", ".join(names) + ("," if tuple_target else "")
    loop = f"def _({own[0]}, {own[1]}):\n for ({target}) in {own[0]}: {own[1]}.append(({source}\n))"
    try:
        module = compile(loop, "<cell>", "exec", dont_inherit=True)
    except SyntaxError:  # a trailing `;`, a statement: item by item
        return None
    code = next(c for c in module.co_consts if isinstance(c, CodeType))
    nested = list(_nested(code))
    if ({*code.co_varnames, *code.co_cellvars} != set(own) or any(c.co_name in ("<lambda>", "<genexpr>") for c in nested)
            or _INTROSPECTION.intersection(n for c in (code, *nested) for n in c.co_names)):  # fmt: skip
        return None
    return code


def _nested(code: CodeType) -> Iterator[CodeType]:
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield const
            yield from _nested(const)


def _placed(code: CodeType, filename: str) -> CodeType:
    """`code` in the run's file and one line up: the loop's `def` line goes, its `for` line is
    the cell's first."""
    consts = tuple(_placed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_firstlineno=code.co_firstlineno - 1, co_consts=consts)


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
    arrays = [(name, value) for name, value in _reads(fn) if _plain_array(value)]
    for _, value in arrays:
        value.flags.writeable = False
    return [name for name, _ in arrays]


def _reads(fn: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of what a notebook function reads as a global or from its closure, and so
    do the notebook functions it reads (an imported function's globals are its module's).

    The globals are those its code names, as cloudpickle ships them: in the kernel a notebook
    function's globals are the whole namespace."""
    todo, seen = [fn], set[int]()
    while todo:
        f = todo.pop()
        if type(f) is not FunctionType or f.__module__ != "__main__" or id(f) in seen:
            continue
        seen.add(id(f))
        names = {n for code in (f.__code__, *_nested(f.__code__)) for n in code.co_names if n in f.__globals__}
        cells = [(n, cell_value(c)) for n, c in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True)]
        for name, value in [*((n, f.__globals__[n]) for n in sorted(names)), *cells]:
            yield name, value
            if type(value) is FunctionType:
                todo.append(value)


def _plain_array(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(value) is numpy.ndarray and not value.dtype.hasobject


def cell_value(cell: Any) -> Any:
    """A closure cell's value; None for an empty cell (a name its function binds later).

    Parameters
    ----------
    cell : types.CellType
        One of a function's ``__closure__`` cells.

    Returns
    -------
    Any
        What the cell holds, or None.
    """
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _copy_on_write(value: Any) -> bool:
    """A pandas object whose shallow copy behaves as a copy (pandas 3 is copy-on-write)."""
    pandas = sys.modules.get("pandas")
    return (pandas is not None and isinstance(value, pandas.DataFrame | pandas.Series)
            and int(pandas.__version__.split(".")[0]) >= 3)  # fmt: skip


def read_only_error(e: BaseException, arrays: tuple[str, ...], holders: tuple[str, ...] = ()) -> BaseException:
    """numpy's error for a write to a shared read-only array, as one line naming the variable.

    Parameters
    ----------
    e : BaseException
        What an item raised.
    arrays : tuple of str
        The large arrays the items share read-only (`Sharing.arrays`).
    holders : tuple of str
        The large values whose arrays the items' copies share read-only (`Sharing.holders`).

    Returns
    -------
    BaseException
        `e` itself, unless it is numpy's "read-only" `ValueError` and the run shares arrays:
        then a `ValueError` that names them and the fix, with `e`'s traceback.

    Examples
    --------
    >>> print(read_only_error(ValueError("assignment destination is read-only"), ("big",)))
    `big` is a large captured array, which the items share read-only: to change it, copy it in the cell first (big = big.copy())
    >>> print(read_only_error(ValueError("output array is read-only"), (), ("model",)))
    `model` holds large arrays, which the items share read-only: to change them, copy it in the cell first (model = copy.deepcopy(model))
    """
    if not (arrays or holders) or type(e) is not ValueError or "read-only" not in str(e):
        return e
    which = [f"`{n}` is a large captured array" for n in arrays] + [f"`{n}` holds large arrays" for n in holders]
    fixes = [f"{n} = {n}.copy()" for n in arrays] + [f"{n} = copy.deepcopy({n})" for n in holders]
    them = "it" if not holders and len(arrays) == 1 else "them"
    message = (f"{' or '.join(which)}, which the items share read-only: to change {them}, "
               f"copy it in the cell first ({'; '.join(fixes)})")  # fmt: skip
    return ValueError(message).with_traceback(e.__traceback__)


def load(key: str, inline: bytes | None) -> Context:
    """The context of a run: cached, else unpickled from `inline` or fetched by `key`.

    Two threads racing on a run's first batch may both build one; the last kept wins.

    Parameters
    ----------
    key : str
        The context's key: its name in this worker's cache, and its Dask key when it was
        scattered rather than sent inline.
    inline : bytes or None
        The pickled context when it travels with every batch; None when it must be fetched.

    Returns
    -------
    Context
        The run's context, the same object for every batch on this worker.

    Raises
    ------
    nbcluster.errors.Lost
        When the context was scattered and no worker holds it any more.
    """
    with contextlib.suppress(KeyError):
        return _CONTEXTS.get(key)
    context = Context.from_payload(inline if inline is not None else fetch(key, 0, keep=False))
    _CONTEXTS.add(key, context, 1)
    return context


def fetch(key: str, size: int, *, keep: bool = True) -> Any:
    """A scattered value by key: kept here, else from this worker's Dask store, else a peer.

    Parameters
    ----------
    key : str
        The value's Dask key (from the scatter).
    size : int
        Its pickled size in bytes, what it counts for in the LRU's budget.
    keep : bool
        Whether to keep it in the LRU afterwards (False for a context, which `load` keeps).

    Returns
    -------
    Any
        The value.

    Raises
    ------
    nbcluster.errors.Lost
        When no worker holds the key any more (the kernel then scatters it again).
    """
    with _FETCHING:
        with contextlib.suppress(KeyError):
            return _OBJECTS.get(key)
        from distributed import get_worker

        worker = get_worker()
        if (value := worker.data.get(key)) is None:  # zict mappings are thread-safe; no large value is None
            value = _from_peer(key)
        if keep:
            _keep(worker, key, value, size)
        return value


def _from_peer(key: str) -> Any:
    """Gather one value from a peer, giving up as soon as no worker holds it any more.

    A holder can die mid-transfer; Dask's gather would then wait for a key nobody will ever
    send again. The transfer runs on the worker's event loop while this thread checks every
    `FETCH_CHECK_S` that someone still holds the key (a slow transfer of a big value is left
    to finish).
    """
    from distributed import Future, get_client

    client: Any = get_client()
    # state="memory" is how Dask's own Variable hands a Future to another client (Dask
    # annotates `state` as a FutureState, yet looks the string up, as its Variable does).
    future: Future[Any] = Future(key, client, state="memory")  # type: ignore[arg-type]
    try:
        transfer = asyncio.run_coroutine_threadsafe(client.gather([future], asynchronous=True), client.loop.asyncio_loop)
        while client.who_has([future]).get(key):
            with contextlib.suppress(concurrent.futures.TimeoutError):
                return transfer.result(timeout=FETCH_CHECK_S)[0]
        transfer.cancel()
    except Exception as e:
        raise Lost(key) from e
    finally:
        future.release()
    raise Lost(key)


def pin(keys: list[tuple[str, int]], dask_worker: Any = None) -> None:
    """Keep the values just scattered here (`client.run`, in the worker's event loop).

    Run right after a broadcast scatter, before Dask's memory manager can drop this worker's
    replica: the worker then never fetches them again (a key it has no replica of is fetched
    on its first batch instead).

    Parameters
    ----------
    keys : list of (str, int)
        The scattered values' keys with their pickled sizes.
    dask_worker : distributed.Worker
        The worker, which `client.run` passes in.
    """
    for key, size in keys:
        if key in dask_worker.data:  # the same object as a replica kept already
            _keep(dask_worker, key, dask_worker.data[key], size)


def _keep(worker: Any, key: str, value: Any, size: int) -> None:
    """Keep a large value in `_OBJECTS`, within `OBJECTS_BYTES` or 40% of the worker's memory limit."""
    memory_limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    _OBJECTS.limit = min(OBJECTS_BYTES, int(memory_limit * 0.4)) if memory_limit else OBJECTS_BYTES
    _OBJECTS.add(key, value, size)


def stop_run(token: str) -> None:
    """Make running and queued batches of the run with this stop token return early.

    Run on every worker with `client.run` (in its event loop); batches read the tokens from
    their threads, which a dict under the GIL allows. The oldest of 256 tokens are forgotten.

    Parameters
    ----------
    token : str
        The stop token of the run to stop, as its batches carry it.
    """
    _STOPPED[token] = None
    if len(_STOPPED) > 256:
        del _STOPPED[next(iter(_STOPPED))]


def stopped_run(token: str | None) -> bool:
    """True when the run with this stop token was told to stop (`stop_run`); never for None.

    Parameters
    ----------
    token : str or None
        The batch's stop token.

    Returns
    -------
    bool
        Whether `stop_run` was called with `token` (among the last 256 tokens).
    """
    return token in _STOPPED


def ran_on() -> tuple[str, str] | None:
    """This worker's address and name (its address when it has none), or None outside a worker.

    A batch's result carries it, so the kernel's journal can say which worker ran each item.

    Returns
    -------
    tuple of (str, str) or None
        ``(address, name)`` as the scheduler knows the worker.
    """
    from distributed import get_worker

    with contextlib.suppress(ValueError):  # not in a worker
        worker = get_worker()
        return worker.address, str(worker.name)  # a started worker's name is its address if it has none
    return None
