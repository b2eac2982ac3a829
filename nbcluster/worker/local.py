"""`worker_local(name, factory)`: a value built once per worker process, on purpose and by name.

The one named exception to "each item starts from the notebook's state". A simulator (a
gymnasium environment, a physics model) is expensive to build and cheap to step: an item
asks for it by name, and the first item on a worker builds it with `factory`; every later
item that worker runs gets the same object. Captured notebook values stay per item.

Lifetime: the process's. A worker that leaves (`%cluster restart`, `%cluster stop`, a
crash, adapt scaling down) takes its values with it; a new worker builds its own. Nothing
is shared between workers, and nothing is sent back to the kernel.

State: `_VALUES`, name -> `_Entry` (the value, when and how long it took to build). One lock
per name, so two threads of one worker asking for the same name build it once, while a
slow factory for one name does not hold up another. A factory that raises stores nothing:
the item fails with the factory's own traceback, and the next item tries again.

`held` is what ``%cluster status`` asks each worker (through ``client.run``): the names it
holds, the type of each value and its build time.

Imports only base modules: it runs on workers (`tests/test_worker_imports.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

T = TypeVar("T")


@dataclass
class _Entry:
    value: Any
    built_at: float  # time.time()
    seconds: float  # how long the factory ran


class Held(TypedDict):
    """One worker-local value as ``%cluster status`` describes it (it crosses a process)."""

    type: str  # the value's type, module-qualified
    seconds: float  # how long its factory ran
    built_at: float  # when, as time.time()


_VALUES: dict[str, _Entry] = {}
_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()  # makes the per-name locks
BUILDS: dict[str, int] = {}  # name -> how many times this process built it (for the tests)


def worker_local(name: str, factory: Callable[[], T]) -> T:
    """The value named `name` on this worker: built by `factory` on first use, then reused.

    Call it inside an item (a ``%%distribute`` cell or a function run by ``distribute``):
    every item that this worker process runs gets the same object, and a new worker builds
    its own. ``%cluster restart`` and ``%cluster stop`` release the values with the worker
    processes. In the kernel (``--local``) the value lives in the kernel's process.

    This is the one deliberate exception to each item starting from the notebook's state:
    what an item does to the value (steps an environment, fills a cache) the next item on
    that worker sees. Keep in it what is expensive to build and safe to reuse.

    Parameters
    ----------
    name : str
        What the value is called on every worker (``%cluster status`` lists the names).
    factory : callable
        Called with no arguments, once per worker process, to build the value. When it
        raises, the item fails with the factory's traceback and nothing is kept: the next
        item calls it again.

    Returns
    -------
    Any
        The worker's value of that name.

    Raises
    ------
    TypeError
        When `name` is not a string or `factory` is not callable.

    Examples
    --------
    >>> import nbcluster
    >>> env = nbcluster.worker_local("doc-example", lambda: {"steps": 0})
    >>> env["steps"] += 1
    >>> nbcluster.worker_local("doc-example", dict)["steps"]  # the same object, not rebuilt
    1
    """
    entry = _VALUES.get(name)
    if entry is not None:
        return entry.value  # type: ignore[no-any-return]
    if not isinstance(name, str):
        raise TypeError(f"worker_local needs a name (a str), got {type(name).__name__}")
    if not callable(factory):
        raise TypeError(
            f"worker_local needs a factory to call, such as `lambda: make()`, got {type(factory).__name__}"
        )
    with _GUARD:
        lock = _LOCKS.setdefault(name, threading.Lock())
    with lock:
        entry = _VALUES.get(name)
        if entry is None:  # else another thread built it while this one waited
            began, start = time.time(), time.perf_counter()
            value = factory()
            entry = _Entry(value, began, time.perf_counter() - start)
            _VALUES[name] = entry
            BUILDS[name] = BUILDS.get(name, 0) + 1
    return entry.value  # type: ignore[no-any-return]


def held() -> dict[str, Held]:
    """What this process holds, by name: run on each worker by ``%cluster status``.

    Returns
    -------
    dict of str to Held
        Per name, the value's type, its factory's seconds and when it was built.
    """
    return {
        name: {"type": f"{type(e.value).__module__}.{type(e.value).__qualname__}", "seconds": e.seconds,
               "built_at": e.built_at}
        for name, e in list(_VALUES.items())
    }  # fmt: skip


def builds() -> dict[str, int]:
    """How many times this process built each name (a rebuild after a failed factory counts once).

    Returns
    -------
    dict of str to int
        Name -> builds; what the tests count across workers.
    """
    return dict(BUILDS)
