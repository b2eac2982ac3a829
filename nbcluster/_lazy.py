"""A package's public names, loaded on first use (PEP 562).

`nbcluster` and `nbcluster.distribute` are imported by every worker on its way to the
worker-side modules, so their public names (the cluster handle, the engine, the results)
are imported when first used, not when the package is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def attributes(
    package: str, where: Mapping[str, str], namespace: MutableMapping[str, Any], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level ``__getattr__`` and ``__dir__``.

    Parameters
    ----------
    package
        The package's name, for the message of a missing attribute.
    where
        Each lazy public name, and the module that defines it.
    namespace
        The package's ``globals()``: a name once loaded is stored there, so the next lookup
        is a plain module attribute.
    public
        The package's ``__all__``, listed by ``dir()`` before anything is loaded.

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)``, to assign at the package's top level.
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__
