"""nbcluster's own import graph: the drawn layering, no cycle, and no import hidden inside a function.

Every module of `nbcluster/` is parsed with `ast` (nothing is imported, so an import that
only a worker or an optional dependency would reach counts the same as any other). An edge
``a -> b`` is an ``import`` or ``from ... import`` in `a`, at any depth (module level,
class bodies, functions), that loads `b`:

- ``import a.b.c`` and ``from a.b import c`` load `a.b.c` (or `a.b` when `c` is a name in
  it) and every package above it, because importing a module runs its packages'
  ``__init__`` first; the packages that contain the importing module itself are left out,
  since Python has already started them before the importing module runs;
- relative imports are resolved against the importing module's package;
- imports under ``if TYPE_CHECKING:`` are left out: they never run.

A cycle is a strongly connected component of that graph, reported as ``a -> b -> a``. A
function-level import of an nbcluster module is the usual way a cycle is hidden, so each
one must be in `ALLOWED_LOCAL` with the reason it cannot be at the top.

The layering (`LAYERS`, `MAY_IMPORT`) is the picture in ARCHITECTURE.md as data: every
module belongs to one part, by the longest prefix of its name, and an edge between two parts
is allowed only if the importing part lists the other. Faces call the API, the API starts
runs, runs use clusters, and everything stands on the base modules; the widgets sit beside
the run code and never import it; what runs on workers (`nbcluster.worker`) and on the
scheduler (the metrics plugin, the supervisor's side) never imports kernel code.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nbcluster"

#: Function-level imports of nbcluster modules that stay, as (importing module, imported
#: module): each for a reason a top-level import would not serve.
ALLOWED_LOCAL: dict[tuple[str, str], str] = {
    ("nbcluster.widgets._live", "nbcluster.widgets.widget"): (
        "anywidget and ipywidgets (0.1 s) load only once a run lasts long enough to show a widget"
    ),
    # Every worker and the scheduler import the package (items are pickled by reference into
    # it), so the kernel side loads only when a kernel-side name is used.
    ("nbcluster", "nbcluster._current"): "nbcluster.start / use: the kernel side, on first use",
    ("nbcluster", "nbcluster.cluster.launcher"): "load_ipython_extension's prewarm: kernel-side only",
    ("nbcluster", "nbcluster.magics"): "load_ipython_extension: IPython loads only in a kernel",
    ("nbcluster.commands", "nbcluster.widgets"): (
        "anywidget and ipywidgets load only when a status is shown in a kernel (never by the CLI)"
    ),
    ("nbcluster.magics", "nbcluster.run.api"): "`%load_ext` stays quick: the engine loads at the first cell",
    ("nbcluster.magics", "nbcluster.widgets"): "`%load_ext` stays quick: the widgets load at the first cell",
    ("nbcluster.cluster.supervisor", "nbcluster.metrics.plugin"): (
        "a broken or missing metrics plugin must never stop a cluster from starting"
    ),
    ("nbcluster.cluster.forkserver", "nbcluster._compat"): (
        "a supervisor starts the forkserver before it imports Dask's distributed (_compat imports it)"
    ),
    ("nbcluster.cluster.forkserver", "nbcluster.config"): (
        "a supervisor launched for a request starts the forkserver before Dask's config loads"
    ),
    ("nbcluster.worker.trial", "nbcluster._compat"): (
        "a trial item's task key: _compat imports Dask's distributed, which the worker package must not need to load"
    ),
    ("nbcluster.worker", "nbcluster._compat"): (
        "the worker package loads without Dask's Client (_compat imports it): a cancel check and a direct batch need it"
    ),
}

#: The parts of the package, by module prefix (the longest prefix that matches wins).
LAYERS: dict[str, str] = {
    # faces: what a user or Jupyter calls
    "nbcluster.magics": "face",
    "nbcluster.cli": "face",
    "nbcluster.commands": "face",
    "nbcluster.server": "face",
    "nbcluster.teaching": "face",
    # the public API: nbcluster.start/use/distribute/wait, and this process's current cluster
    "nbcluster": "api",
    "nbcluster._current": "api",
    "nbcluster.run.api": "api",  # distribute() and wait(): the run module that looks up the current cluster
    # the kernel side of a run
    "nbcluster.run": "run",
    "nbcluster.journal": "run",
    "nbcluster.persist": "run",
    "nbcluster.widgets": "widgets",
    "nbcluster.worker": "worker",
    "nbcluster.cluster": "cluster",
    "nbcluster.metrics": "metrics",
    # base: imports nothing of nbcluster's but other base modules
    "nbcluster.errors": "base",
    "nbcluster.config": "base",
    "nbcluster.config_schema": "base",
    "nbcluster._compat": "base",
    "nbcluster._wire": "base",
    "nbcluster._threads": "base",
    "nbcluster._lazy": "base",
    "nbcluster._version": "base",
    "nbcluster._start_up": "base",
    "nbcluster._aio": "base",
}

#: Which parts each part may import (its own included), and the rule in words.
MAY_IMPORT: dict[str, tuple[frozenset[str], str]] = {
    "face": (
        frozenset({"face", "api", "run", "widgets", "cluster", "metrics", "base"}),
        "faces parse and call what is below them",
    ),
    "api": (
        frozenset({"api", "run", "widgets", "cluster", "metrics", "base"}),
        "the API never imports a face (magics, cli, commands, server)",
    ),
    "run": (
        frozenset({"run", "widgets", "worker", "cluster", "metrics", "base"}),
        "the engine never imports the public API layer (_current, run.api): what it needs is passed in",
    ),
    "widgets": (
        frozenset({"widgets", "cluster", "metrics", "base"}),
        "widgets sit beside the run code and never import it (nor the API or a face)",
    ),
    "worker": (
        frozenset({"worker", "base"}),
        "worker code runs on workers: it imports only base modules",
    ),
    "cluster": (
        frozenset({"cluster", "metrics", "base"}),
        "the scheduler side never imports kernel or worker code",
    ),
    "metrics": (
        frozenset({"metrics", "base"}),
        "metrics run on the scheduler: they never import kernel, cluster or worker code",
    ),
    "base": (frozenset({"base"}), "base modules import only base modules"),
}

#: Edges across the layering that stay, as (importing module, imported module), each with why.
ALLOWED_ACROSS: dict[tuple[str, str], str] = {
    ("nbcluster", "nbcluster.magics"): (
        "load_ipython_extension is IPython's entry point, which must live in the package itself"
    ),
    ("nbcluster.cluster.forkserver_preload", "nbcluster.worker"): (
        "the forkserver's children are workers: loading the worker package before they fork is its job"
    ),
}


def layer_of(module: str, layers: dict[str, str] = LAYERS) -> str | None:
    """The part `module` belongs to: that of the longest prefix of its dotted name in `layers`."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        found = layers.get(".".join(parts[:depth]))
        if found is not None:
            return found
    return None


def broken_rules(
    graph: list[Edge],
    layers: dict[str, str] = LAYERS,
    may_import: dict[str, tuple[frozenset[str], str]] = MAY_IMPORT,
    allowed: dict[tuple[str, str], str] = ALLOWED_ACROSS,
) -> list[str]:
    """One line per import edge the layering forbids, naming the rule it breaks."""
    found = []
    for edge in sorted(graph, key=lambda e: (e.source, e.line, e.target)):
        source, target = layer_of(edge.source, layers), layer_of(edge.target, layers)
        if source is None or target is None or (edge.source, edge.target) in allowed:
            continue
        parts, rule = may_import[source]
        if target not in parts:
            found.append(f"{edge.source} ({source}) imports {edge.target} ({target}) at line {edge.line}: {rule}")
    return found


#: Cycles allowed to stay, each as the set of modules of its strongly connected component.
#: None: a new one is a design change to discuss, not an entry to add.
EXPECTED_CYCLES: list[frozenset[str]] = []

#: Function-level imports that are neither allowed nor fixed yet: none.
EXPECTED_LOCAL: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Edge:
    """One import statement's effect: `source` loads `target`, at `line`."""

    source: str
    target: str
    line: int
    local: bool  # inside a function
    named: bool  # the module the statement names (not a package above it)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module below `root`, by dotted name (a package by its own name)."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, local: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, and whether it is inside a function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, local
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the `else:` of `if TYPE_CHECKING` does run
                yield from _imports(ast.Module(body=[child], type_ignores=[]), local)
        else:
            inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports(node, inner)


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = source.split(".") if is_package else source.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _loaded(target: str, source: str, known: set[str]) -> Iterator[tuple[str, bool]]:
    """`target` and the packages above it that importing it runs, as seen from `source`."""
    parts = target.split(".")
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package in known and not (source == package or source.startswith(package + ".")):
            yield package, False
    if target in known:
        yield target, True


def edges(root: Path = ROOT) -> list[Edge]:
    """Every import edge between nbcluster's modules."""
    found = modules(root)
    known = set(found)
    result = []
    for source, path in found.items():
        is_package = path.name == "__init__.py"
        for node, local in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(source, is_package, node)
                # `from pkg import mod` loads pkg.mod; `from mod import name` loads mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                for loaded, named in _loaded(target, source, known):
                    if loaded != source:
                        result.append(Edge(source, loaded, node.lineno, local, named))
    return result


def _successors(graph: list[Edge]) -> dict[str, set[str]]:
    succ: dict[str, set[str]] = {}
    for edge in graph:
        succ.setdefault(edge.source, set()).add(edge.target)
    return succ


def components(graph: list[Edge]) -> list[frozenset[str]]:
    """The strongly connected components of two or more modules of `graph`: each holds a
    cycle, and every module of it is on one."""
    succ = _successors(graph)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the graph has ~60 nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(succ.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(succ):
        if node not in index:
            connect(node)
    return sorted(found, key=min)


def cycles(graph: list[Edge]) -> list[list[str]]:
    """A cycle of each component, as the path ``a -> b -> ... -> a`` from its first module."""
    succ = _successors(graph)
    return [_path_through(component, succ) for component in components(graph)]


def _path_through(component: frozenset[str], succ: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module, by breadth-first search."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(succ.get(node, set()) & component):
                if nxt == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = came_from[node]
                    return [start, *reversed(path[1:]), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def _described(graph: list[Edge], path: list[str]) -> str:
    steps = []
    for source, target in itertools.pairwise(path):
        edge = min((e for e in graph if e.source == source and e.target == target), key=lambda e: e.line)
        steps.append(f"{source} -> {target} (line {edge.line}{', in a function' if edge.local else ''})")
    return " -> ".join(path) + "\n      " + "\n      ".join(steps)


def test_no_import_cycle() -> None:
    graph = edges()
    succ = _successors(graph)
    found = [_path_through(c, succ) for c in components(graph) if c not in EXPECTED_CYCLES]
    assert not found, "import cycles in nbcluster/:\n  " + "\n  ".join(_described(graph, p) for p in found)


def test_every_module_has_a_part() -> None:
    """A new module (or folder) is placed in the layering before it can be imported anywhere."""
    unplaced = sorted(name for name in modules(ROOT) if layer_of(name) is None)
    assert not unplaced, f"modules in no part of LAYERS (add their prefix): {unplaced}"


def test_layering() -> None:
    broken = broken_rules(edges())
    assert not broken, "imports that break the layering (tests/test_imports.py, MAY_IMPORT):\n  " + "\n  ".join(
        broken
    )


def test_no_hidden_import() -> None:
    local = {(e.source, e.target): e for e in sorted(edges(), key=lambda e: -e.line) if e.local and e.named}
    hidden = sorted(set(local) - set(ALLOWED_LOCAL) - EXPECTED_LOCAL)
    assert not hidden, (
        "function-level imports of nbcluster modules (move them to the top, or add them to "
        "ALLOWED_LOCAL with the reason they cannot be):\n  "
        + "\n  ".join(f"{s} -> {t} (line {local[s, t].line})" for s, t in hidden)
    )


def test_allow_lists_are_current() -> None:
    """An entry whose import is gone (or moved to the top) is dropped, so the lists stay short."""
    graph = edges()
    local = {(e.source, e.target) for e in graph if e.local and e.named}
    stale_local = sorted((set(ALLOWED_LOCAL) | EXPECTED_LOCAL) - local)
    assert not stale_local, (
        f"ALLOWED_LOCAL or EXPECTED_LOCAL name imports that are not function-level: {stale_local}"
    )
    across = {(e.source, e.target) for e in graph}
    stale_across = sorted(set(ALLOWED_ACROSS) - across)
    assert not stale_across, f"ALLOWED_ACROSS names imports that are gone: {stale_across}"
    present = set(components(graph))
    stale = [sorted(c) for c in EXPECTED_CYCLES if c not in present]
    assert not stale, f"EXPECTED_CYCLES lists cycles that are gone: {stale}"


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        (
            {"a.py": "from pkg import b\n", "b.py": "def f():\n    from . import a\n"},
            "pkg.a -> pkg.b -> pkg.a",
        ),
        ({"__init__.py": "from pkg.a import x\n", "a.py": "from pkg import y\n"}, "pkg -> pkg.a -> pkg"),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
                "b.py": "import pkg.a\n",
            },
            "",
        ),
        ({"__init__.py": "from pkg import a\n", "a.py": "from pkg import b\n", "b.py": "x = 1\n"}, ""),
        (
            {
                "sub/__init__.py": "from pkg.sub.c import z\n",
                "sub/c.py": "from ..a import q\n",
                "a.py": "import pkg.sub\n",
            },
            "pkg.a -> pkg.sub -> pkg.sub.c -> pkg.a",
        ),
    ],
    ids=["function-level", "package-init", "type-checking", "submodule-of-own-package", "relative"],
)
def test_walker_finds_cycles(tmp_path: Path, files: dict[str, str], cycle: str) -> None:
    """The walker itself, on small packages whose cycles are known."""
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found = [" -> ".join(path) for path in cycles(edges(root))]
    assert found == ([cycle] if cycle else [])


@pytest.mark.parametrize(
    ("files", "broken"),
    [
        ({"w/__init__.py": "", "w/a.py": "from pkg.r import b\n", "r/__init__.py": "", "r/b.py": ""},
         ["pkg.w.a (widgets) imports pkg.r (run) at line 1: no run", "pkg.w.a (widgets) imports pkg.r.b (run) at line 1: no run"]),
        ({"w/__init__.py": "", "w/a.py": "", "r/__init__.py": "", "r/b.py": "from ..w import a\n"}, []),
        ({"w/__init__.py": "", "w/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.r\n",
          "r/__init__.py": ""}, []),
        ({"w/__init__.py": "", "w/a.py": "def f():\n    from pkg.r import b\n", "r/__init__.py": "", "r/b.py": ""},
         ["pkg.w.a (widgets) imports pkg.r (run) at line 2: no run", "pkg.w.a (widgets) imports pkg.r.b (run) at line 2: no run"]),
    ],
    ids=["forbidden", "allowed", "type-checking", "function-level"],
)  # fmt: skip
def test_layering_checker(tmp_path: Path, files: dict[str, str], broken: list[str]) -> None:
    """The checker itself, on a small package with two parts: run may import widgets, not back."""
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    layers = {"pkg": "api", "pkg.w": "widgets", "pkg.r": "run"}
    may = {"widgets": (frozenset({"widgets"}), "no run"), "run": (frozenset({"run", "widgets"}), "ok")}
    assert broken_rules(edges(root), layers, may, {}) == broken


@pytest.mark.parametrize("package", ["nbcluster.run", "nbcluster.worker", "nbcluster.journal", "nbcluster.persist"])
def test_a_package_docstring_names_every_module(package: str) -> None:
    """The map of a package, in its `__init__` docstring, lists each of its modules (as `name`
    or `name.py`), so a module added or removed shows there."""
    folder = ROOT.parent / package.replace(".", "/")
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    unnamed = sorted(
        path.stem
        for path in folder.glob("*.py")
        if path.stem != "__init__" and f"`{path.stem}`" not in doc and f"`{path.stem}.py`" not in doc
    )
    assert not unnamed, f"{package}'s docstring does not name {unnamed}"
