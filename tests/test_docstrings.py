"""Every public name has a numpydoc docstring: those in `nbcluster.__all__`, the public
members of `Results` and `ClusterHandle` (what the docs' Python API reference shows), and
every public function, class and method defined in the modules of `checked_modules`.

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
from tests.docs_helpers import checked_modules

CLASSES = ("Results", "ClusterHandle")
def members(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties `cls` defines itself."""
    for name, member in vars(cls).items():
        if not name.startswith("_") and (
            inspect.isfunction(member) or isinstance(member, (property, staticmethod, classmethod))
        ):
            yield name, member


# The magics' docstrings are their parsers' help, set when the class is built: what `%cluster?`
# and `%%distribute?` show, and what the generated options reference is made from. A numpydoc
# Parameters section ("line", "cell") would only add IPython's calling convention to that help.
GENERATED_HELP = ("nbcluster.magics.NbclusterMagics.cluster", "nbcluster.magics.NbclusterMagics.distribute")


def module_names() -> Iterator[tuple[str, Any, bool]]:
    """(dotted name, object, False) for each public definition of the checked modules."""
    for module_name in checked_modules():
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
                continue
            if inspect.isfunction(obj):
                yield f"{module_name}.{name}", obj, False
            elif inspect.isclass(obj):
                yield f"{module_name}.{name}", obj, False
                for member_name, member in members(obj):
                    if f"{module_name}.{name}.{member_name}" not in GENERATED_HELP:
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
