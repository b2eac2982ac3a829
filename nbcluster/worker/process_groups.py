"""Keep a rank's torch process groups alive until its item has returned, so that its end cannot deadlock.

**The deadlock.** A training function that ends as a torchrun script does, with
``dist.destroy_process_group()`` and then ``return``, leaves DDP's `Reducer` holding the last
reference to the gloo process group. When the function's locals are freed, the Reducer is
freed with the GIL held (its Python binding does not release it), and the group's
destructor then joins gloo's worker threads. A worker thread that is still dropping its
last all-reduce needs the GIL for that: the work keeps the Python context that autograd
stashes for the backward pass (`torch.autograd.graph._engine_run_backward`). So both threads
wait forever (the class of bug in pytorch/pytorch#56297). Under torchrun the window is
short and the process exits anyway. On a Dask worker, whose threads compete for the GIL, it
hung a rank in one job of three (`bench/training.py`, 2026-12-06; RESULTS, "training").

**The way around it.** While a rank runs, this module keeps a Python reference to every
group that ``init_process_group`` and ``new_group`` make. The rank lets go of them after its
item has returned: then the last reference is ours, and a `ProcessGroup`'s Python object
releases the GIL before it destroys the group.

To see those calls, the two functions are wrapped once per process, in
``torch.distributed.distributed_c10d``, the first time a rank runs after torch.distributed is
imported, or, before that, when it is imported (a finder on `sys.meta_path`). Importing
torch here instead would cost a rank that does not use it a second or two. Outside a rank,
the wrappers only call through.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

C10D = "torch.distributed.distributed_c10d"
MAKERS = ("init_process_group", "new_group")

_lock = threading.Lock()
_keeping = False  # a rank is running in this process (each rank has a worker process of its own)
_kept: list[Any] = []  # its groups, until it ends


def keep() -> None:
    """From now until `release`, keep every process group this process makes."""
    global _keeping
    with _lock:
        _keeping = True
    c10d = sys.modules.get(C10D)
    if c10d is not None:
        _wrap(c10d)
    elif not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


def release() -> None:
    """Let go of the kept groups: the last reference, once the rank's item has returned."""
    global _keeping
    with _lock:
        _keeping = False
        groups = list(_kept)
        _kept.clear()
    del groups  # here, outside the lock and the item's frame


def _wrap(c10d: ModuleType) -> None:
    dist = sys.modules.get("torch.distributed")
    for name in MAKERS:
        made = getattr(c10d, name, None)
        if made is None or getattr(made, "_nbcluster_keeps", False):
            continue
        keeping = _keeping_wrapper(c10d, name, made)
        setattr(c10d, name, keeping)
        if dist is not None and getattr(dist, name, None) is made:  # `from .distributed_c10d import *` ran
            setattr(dist, name, keeping)


def _keeping_wrapper(c10d: ModuleType, name: str, made: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(made)
    def keeping(*args: Any, **kwargs: Any) -> Any:
        result = made(*args, **kwargs)
        group = c10d.GroupMember.WORLD if name == "init_process_group" else result
        with _lock:
            if _keeping and group is not None:
                _kept.append(group)
        return result

    keeping._nbcluster_keeps = True  # type: ignore[attr-defined]  # (torch's own decorators set __wrapped__)
    return keeping


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps the group makers as torch.distributed's c10d module is first imported."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != C10D:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = spec.loader if spec is not None else None
        if spec is None or not isinstance(loader, importlib.machinery.SourceFileLoader | importlib.machinery.SourcelessFileLoader):
            return None  # not a plain file: the import goes on as usual, and the next rank wraps it
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _wrap(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader
        return spec
