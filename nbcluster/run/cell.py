"""Cell source -> what a worker runs: compiled code, the value of the last expression, the
names it reads from the notebook, and line numbers that match the notebook.

`Cell.parse(source, first_line=2)` does everything that can fail on bad input here, in the
kernel, so a syntax error is one message naming the cell line, not a worker traceback.

Line numbers: the source is padded with `first_line - 1` blank lines before compiling, so
the code objects, every traceback and every `SyntaxError` carry notebook line numbers
directly (the `%%distribute` line itself is line 1 of the notebook cell). The padded
source is registered in `linecache` under the cell's unique filename, on the kernel and on
each worker, so tracebacks and `inspect.getsource` show the lines.

Free names: which names must come from the user's namespace? Python's scoping decides,
and `symtable` alone cannot, because a module-level name that is assigned *after* it is
read (`total = total + x`) is still read from outside. `_FreeNames` walks the statements
in execution order, keeping the set of names bound so far:

- a load at module level (or in a comprehension, a class body) of a name not yet bound
  is *immediate*: the name must exist when the cell starts;
- a load inside a function or lambda body of a name that is not local to it is
  *deferred*: it is resolved when the function runs, so it is free only if the cell never
  binds it at module level;
- branches count as binding (an `if` that assigns `y` makes `y` the cell's own): the rare
  cell that reads a name bound only on a branch not taken would fail on the worker just as
  it would in the kernel with a fresh namespace.

Over-capturing would ship stale (possibly huge or unpicklable) values, under-capturing
would fail on the worker: the walk errs towards the scoping Python really does.
"""

from __future__ import annotations

import ast
import builtins
import linecache
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import CodeType

from nbcluster.errors import BadArgument

_BUILTINS = frozenset(dir(builtins))


@dataclass
class Cell:
    """A parsed cell: `body` runs, then `last` (if any) is evaluated for the item's value.

    `body` is None for a cell that is one expression: running an empty code object cost as
    much as evaluating `x + 1`, a real share of a tiny item's time on the worker.
    """

    source: str  # padded so that line numbers match the notebook
    filename: str
    body: CodeType | None
    last: CodeType | None
    immediate: dict[str, int] = field(default_factory=dict)  # name -> first line read
    deferred: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, source: str, *, filename: str, first_line: int = 1) -> Cell:
        """Parse and compile a cell, and find the names it reads from outside.

        The source is padded with blank lines so that its line numbers, in tracebacks too, are
        the notebook cell's.

        Parameters
        ----------
        source : str
            The cell's body (below the ``%%distribute`` line).
        filename : str
            The file name its code objects carry: IPython's name for the cell, so tracebacks point
            at it.
        first_line : int
            The notebook cell line the body starts on.

        Returns
        -------
        Cell
            The compiled cell; its last expression, if it ends with one, is compiled apart as the
            item's value.

        Raises
        ------
        nbcluster.errors.BadArgument
            For a syntax error (with its cell line, and a hint when the line is an IPython magic
            or shell command) or an empty cell.

        Examples
        --------
        >>> cell = Cell.parse("y = x * 2\\ny", filename="<cell>", first_line=2)
        >>> cell.free_names()
        {'x': 2}
        """
        padded = "\n" * max(first_line - 1, 0) + source
        try:
            tree = ast.parse(padded, filename=filename, mode="exec")
        except SyntaxError as e:
            raise BadArgument(_syntax_message(e, padded)) from None
        if not tree.body:
            raise BadArgument("the cell is empty: write the code to run below the %%distribute line")
        last = None
        tail = tree.body[-1]
        if isinstance(tail, ast.Expr):
            tree.body.pop()
            expr = ast.Expression(tail.value)
            last = compile(expr, filename, "eval")
        body = compile(tree, filename, "exec") if tree.body else None
        walker = _FreeNames()
        walker.run(tree.body + ([expr.body] if last is not None else []))
        register_source(filename, padded)
        return cls(padded, filename, body, last, walker.immediate, walker.deferred - walker.bound)

    def free_names(self, bound: Iterable[str] = ()) -> dict[str, int | None]:
        """Names the cell reads from outside, minus `bound` (item variables, `seed`).

        Maps each name to the line it is first read on (None for names read only inside
        functions), for messages about unknown names.

        Parameters
        ----------
        bound : Iterable of str
            Names bound for each item (the ``--over`` variables, ``seed``), so not captured.

        Returns
        -------
        dict of str to int or None
            Free name -> the cell line it is first read on, or None.
        """
        skip = set(bound)
        names: dict[str, int | None] = {n: line for n, line in self.immediate.items() if n not in skip}
        for n in sorted(self.deferred - skip - set(names)):
            names[n] = None
        return names


def register_source(filename: str, source: str) -> None:
    """Make `source` what tracebacks and `inspect` show for `filename` in this process.

    Parameters
    ----------
    filename : str
        The file name the code objects carry.
    source : str
        The (padded) source to show for it.
    """
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def is_builtin(name: str) -> bool:
    """True when `name` needs no capture: a Python builtin, or ``display``.

    Parameters
    ----------
    name : str
        A free name of a cell.

    Returns
    -------
    bool
        Whether the worker has it without the kernel sending it.
    """
    # `display` is a builtin in IPython only while a cell runs, and workers provide their own.
    return name in _BUILTINS or name == "display"


def _syntax_message(e: SyntaxError, source: str) -> str:
    line = (e.text or "").strip()
    hint = ""
    if line.startswith(("%", "!")) or line.endswith("?"):
        hint = " (IPython magics and shell commands cannot run on a worker; plain Python only)"
    where = f"cell line {e.lineno}" if e.lineno else "the cell"
    return f"syntax error at {where}: {e.msg}{hint}" + (f": {line}" if line else "")


class _Scope:
    __slots__ = ("deferred", "is_class", "locals")

    def __init__(self, local_names: set[str], deferred: bool, is_class: bool = False):
        self.locals = local_names
        self.deferred = deferred
        self.is_class = is_class


class _FreeNames(ast.NodeVisitor):
    """Execution-order walk; see the module docstring for the rules."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.immediate: dict[str, int] = {}
        self.deferred: set[str] = set()
        self.scopes: list[_Scope] = []

    def run(self, nodes: list[ast.AST]) -> None:
        for node in nodes:
            self.visit(node)

    # -- names ------------------------------------------------------------------------
    def _load(self, name: str, line: int) -> None:
        deferred = False
        for depth, scope in enumerate(reversed(self.scopes)):
            # Methods do not see their class body's names; only the class body itself does.
            if name in scope.locals and not (scope.is_class and depth > 0):
                return
            deferred = deferred or scope.deferred
        if deferred:
            self.deferred.add(name)
        elif name not in self.bound:
            self.immediate.setdefault(name, line)

    def _store(self, name: str) -> None:
        if self.scopes:
            self.scopes[-1].locals.add(name)
        else:
            self.bound.add(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load | ast.Del):
            self._load(node.id, node.lineno)
        else:
            self._store(node.id)

    # -- statements whose fields are not in execution order ------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self._load(node.target.id, node.lineno)
        self.visit(node.target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)
        elif not isinstance(node.target, ast.Name):
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        # A walrus in a comprehension binds in the enclosing function or module.
        scopes, self.scopes = self.scopes, [s for s in self.scopes if not isinstance(s, _CompScope)]
        self._store(node.target.id)
        self.scopes = scopes

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._store(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self._store(node.name)
        for stmt in node.body:
            self.visit(stmt)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.pattern is not None:
            self.visit(node.pattern)
        if node.name:
            self._store(node.name)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._store(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self.generic_visit(node)
        if node.rest:
            self._store(node.rest)

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        pass

    visit_Nonlocal = visit_Global

    # -- new scopes -------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        args = node.args
        for expr in [*getattr(node, "decorator_list", []), *args.defaults, *args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                self.visit(a.annotation)
        returns = getattr(node, "returns", None)
        if returns is not None:
            self.visit(returns)
        if not isinstance(node, ast.Lambda):
            self._store(node.name)
        params = {
            a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a
        }
        body = node.body if isinstance(node.body, list) else [node.body]
        scope = _Scope(params | _locals_of(body), deferred=True)
        self.scopes.append(scope)
        for stmt in body:
            self.visit(stmt)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        # A class body runs at once; its names are not visible to its methods, which is
        # what a fresh non-deferred scope whose functions open deferred scopes gives.
        self.scopes.append(_Scope(set(), deferred=False, is_class=True))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()
        self._store(node.name)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        first, *rest = node.generators
        self.visit(first.iter)  # evaluated in the enclosing scope
        # Generator expressions are nearly always consumed where they stand (`sum(...)`),
        # so their reads count as immediate like a list comprehension's.
        self.scopes.append(_CompScope(set(), deferred=False))
        self.visit(first.target)
        for cond in first.ifs:
            self.visit(cond)
        for gen in rest:
            self.visit(gen.iter)
            self.visit(gen.target)
            for cond in gen.ifs:
                self.visit(cond)
        if isinstance(node, ast.DictComp):
            self.visit(node.key)
            self.visit(node.value)
        else:
            self.visit(node.elt)
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension


class _CompScope(_Scope):
    __slots__ = ()


def _locals_of(body: Sequence[ast.AST]) -> set[str]:
    """Names a function body binds (so they are local to it), not looking into nested scopes."""
    found: set[str] = set()
    declared_global: set[str] = set()
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Global | ast.Nonlocal):
            declared_global.update(node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
            todo.extend(getattr(node, "decorator_list", []))
            continue
        elif isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            continue
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            found.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update(a.asname or a.name.split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.add(node.name)
        elif isinstance(node, ast.NamedExpr):
            found.add(node.target.id)
        todo.extend(ast.iter_child_nodes(node))
    return found - declared_global
