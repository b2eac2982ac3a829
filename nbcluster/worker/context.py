"""Worker side: a cell run's context, unpickled once per worker and cached.

The *context* is one opaque pickled blob per cell run: the cell's code (or function), the
small captured variables (each pickled on its own in the kernel, so a bad one is named
before anything is sent), modules to import, how an item binds names, the seed, and the
Dask keys of the large values. Up to `INLINE_CONTEXT` bytes it rides inline in every
batch; above that it is scattered and fetched by key. Either way each worker unpickles it
once (`load`, cached in `_CONTEXTS`) however many batches it runs. For `--local` the
kernel builds a `Context` directly (`job.for_kernel`).
"""

from __future__ import annotations

import builtins
import importlib
import linecache
import marshal
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any

import cloudpickle

from nbcluster.worker.loop import cell_loop, refiled
from nbcluster.worker.objects import fetch

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
        # A trial run's (`worker/trial.py`): each item then runs alone, as the thread's current item.
        self.trial: TrialSpec | None = spec.get("trial")
        # The function of a "function" item; the code of a "cell" one.
        self.fn: Callable[..., Any] | None = spec.get("fn")
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
            if self.seed is None and self.body is None and self.bind is None and self.mode in ("over", "grid", "zip"):
                self.loop = cell_loop(source, filename, self.names, tuple_target=self.mode != "over")
        elif spec.get("loop") is not None and self.fn is not None:
            # The function's body inlined (`loop.function_loop`), in the function's file as
            # it is here (cloudpickle renames a function's file, which tracebacks map back).
            loop = spec["loop"]
            code = marshal.loads(loop) if isinstance(loop, bytes) else loop
            self.loop = refiled(code, self.fn.__code__.co_filename)

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
        if spec["kind"] == "function":
            spec["fn"] = cloudpickle.loads(spec["fn"])
        return cls(spec, namespace)


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
