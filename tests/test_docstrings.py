"""Every public name has a numpydoc docstring: those in `nbcluster.__all__`, the public
members of `Results` and `ClusterHandle` (what the docs' Python API reference shows), and
every public function, class and method defined in the modules of `MODULES`.

A docstring passes when numpydoc parses it, it opens with a summary line, its
``Parameters`` name every argument of the signature and nothing else, and it has
``Returns`` (or ``Yields``) where the function returns something. The functions and
classes of `__all__` also need an ``Examples`` section. A new public name without such a
docstring fails here, with the name and what to add.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from numpydoc.docscrape import NumpyDocString

import nbcluster

CLASSES = ("Results", "ClusterHandle")
# Modules whose every public function, class and method is checked (issue 19 goes module by
# module; a module joins once its docstrings are complete, and then a new name must be too).
MODULES = (
    "nbcluster.teaching",
    "nbcluster._aio",
    "nbcluster._current",
    "nbcluster.cluster.adaptive",
    "nbcluster.cluster.credentials",
    "nbcluster.cluster.gpu",
    "nbcluster.cluster.handle",
    "nbcluster.cluster.info",
    "nbcluster.cluster.kinds",
    "nbcluster.cluster.kubernetes",
    "nbcluster.cluster.launcher",
    "nbcluster.cluster.lifeline",
    "nbcluster.cluster.limits",
    "nbcluster.cluster.private_http",
    "nbcluster.cluster.profiles",
    "nbcluster.cluster.registry",
    "nbcluster.cluster.spec",
    "nbcluster.cluster.speccluster",
    "nbcluster.cluster.startlog",
    "nbcluster.cluster.supervisor",
    "nbcluster.cluster.worker_memory",
    "nbcluster.server",
    "nbcluster.server._threads",
    "nbcluster.server.dashboard",
    "nbcluster.server.handlers",
    "nbcluster.server.openapi",
    "nbcluster.widgets",
    "nbcluster.widgets._live",
    "nbcluster.widgets._options",
    "nbcluster.widgets._output",
    "nbcluster.widgets._progress",
    "nbcluster.widgets._results",
    "nbcluster.widgets._static",
    "nbcluster.widgets._theme",
    "nbcluster.widgets.widget",
    "nbcluster._wire",
    "nbcluster.metrics",
    "nbcluster.metrics._ring",
    "nbcluster.metrics.basic",
    "nbcluster.metrics.feed",
    "nbcluster.metrics.plugin",
    "nbcluster.metrics.preload",
    "nbcluster.metrics.summary",
)


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties `cls` defines itself."""
    for name, member in vars(cls).items():
        if not name.startswith("_") and (
            inspect.isfunction(member) or isinstance(member, (property, staticmethod, classmethod))
        ):
            yield name, member


def module_names() -> Iterator[tuple[str, Any, bool]]:
    """(dotted name, object, False) for each public definition of the `MODULES`."""
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
                continue
            if inspect.isfunction(obj):
                yield f"{module_name}.{name}", obj, False
            elif inspect.isclass(obj):
                yield f"{module_name}.{name}", obj, False
                for member_name, member in members(obj):
                    yield f"{module_name}.{name}.{member_name}", member, False


def public() -> Iterator[tuple[str, Any, bool]]:
    """(dotted name, object, needs an example) for each public name the reference shows."""
    for name in nbcluster.__all__:
        yield name, getattr(nbcluster, name), True
    for cls_name in CLASSES:
        cls = getattr(nbcluster, cls_name)
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                yield f"{cls_name}.{name}", member, False


def problems(obj: Any, needs_example: bool) -> list[str]:
    """What the docstring of `obj` lacks, in words; [] when it is complete."""
    function = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
    doc = inspect.getdoc(function)
    if not doc or not doc.strip():
        return ["no docstring"]
    try:
        parsed = NumpyDocString(doc)
    except Exception as error:  # numpydoc's own complaint (a bad section) says what to fix
        return [f"numpydoc cannot parse it: {error}"]
    out = [] if parsed["Summary"] else ["no summary line"]
    if needs_example and not parsed["Examples"]:
        out.append("no Examples section")
    if isinstance(obj, property) or inspect.isclass(function) or not callable(function):
        return out
    signature = inspect.signature(function)
    wanted = [
        ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls")
    ]
    # numpydoc allows one entry for several arguments: "a, b : int".
    documented = [name.strip() for p in parsed["Parameters"] for name in p.name.split(",")]
    if missing := [p for p in wanted if p not in documented]:
        out.append(f"Parameters does not document {missing}")
    if extra := [p for p in documented if p not in wanted]:
        out.append(f"Parameters documents {extra}, which the signature does not have")
    returns = signature.return_annotation
    if returns not in (None, "None", inspect.Signature.empty) and not (parsed["Returns"] or parsed["Yields"]):
        out.append(f"no Returns section (it returns {returns})")
    return out


@pytest.mark.parametrize(
    ("name", "obj", "needs_example"),
    list(public()) + list(module_names()),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_public_name_has_a_numpydoc_docstring(name: str, obj: Any, needs_example: bool) -> None:
    found = problems(obj, needs_example)
    assert not found, (
        f"{name}: {'; '.join(found)} (see numpydoc's format: https://numpydoc.readthedocs.io/en/latest/format.html)"
    )


def test_the_check_refuses_what_it_should() -> None:
    # The rule itself, on functions made to break it: a check that passes everything is no check.
    def bare(a: int) -> int:
        return a

    def half(a: int, b: int) -> int:
        """Add.

        Parameters
        ----------
        a : int
            One.
        """
        return a + b

    assert problems(bare, False) == ["no docstring"]
    assert problems(half, True) == [
        "no Examples section",
        "Parameters does not document ['b']",
        "no Returns section (it returns int)",
    ]
