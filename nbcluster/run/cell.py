"""What a run runs and over what: the cell's source -> compiled code and the names it reads
from the notebook (`Cell`), and `--over` / `--grid` / `--zip` -> the items (`Plan`). The
options and the magic's line that ask for them are `options.py`'s.

**The cell.** `Cell.parse(source, first_line=2)` does everything that can fail on bad input
here, in the kernel, so a syntax error is one message naming the cell line, not a worker
traceback.

Line numbers: the source is padded with `first_line - 1` blank lines before compiling, so
the code objects, every traceback and every `SyntaxError` carry notebook line numbers
directly (the `%%distribute` line itself is line 1 of the notebook cell). The padded
source is registered in `linecache` under the cell's unique filename, on the kernel and on
each worker, so tracebacks and `inspect.getsource` show the lines.

Free names: which names must come from the user's namespace? Python's scoping decides.
`symtable` knows it for the code that runs later (function and lambda bodies: `_deferred`),
but not the order of the module level, where a name that is assigned *after* it is read
(`total = total + x`) is still read from outside. `_FreeNames` walks the module level,
class bodies and comprehensions in execution order, keeping the set of names bound so far:

- a load at module level (or in a comprehension, a class body) of a name not yet bound
  is *immediate*: the name must exist when the cell starts;
- a load inside a function or lambda body of a name that is global there is *deferred*:
  it is resolved when the function runs, so it is free only if the cell never binds it at
  module level;
- branches count as binding (an `if` that assigns `y` makes `y` the cell's own): the rare
  cell that reads a name bound only on a branch not taken would fail on the worker just as
  it would in the kernel with a fresh namespace.

Over-capturing would ship stale (possibly huge or unpicklable) values, under-capturing
would fail on the worker: the walk errs towards the scoping Python really does.

**The plan.** A `Plan` holds the item values (`items`) and how one value binds names:

- `over="x in xs"`: each value of `xs` binds `x`; `"a, b in pairs"` unpacks each value;
- `grid="lr=[..], depth=[..]"`: the Cartesian product, first name slowest (like nested
  loops written in that order); each value is a tuple bound to the names in order;
- `zip="a=[..], b=[..]"`: the lists walked in step (equal lengths required);
- none of these: one item with no names.

Per-item parameter dicts (`Plan.params(i)`) are built only when asked for, and a `range`
stays a range: a 100,000-item cell pays for no dicts or lists it never looks at.

Also here, what the set-up asks of the code and how messages show things: `mentions_trials`
(does the code name `report`, `should_stop` or `checkpoint`, which makes a trial run),
`describe` (an item's parameters) and `human` (a byte count).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import linecache
import symtable
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from nbcluster.errors import BadArgument


@dataclass
class Cell:
    """A parsed cell: `body` runs, then `last` (if any) is evaluated for the item's value.

    `body` is None for a cell that is one expression, which then costs only its evaluation.
    """

    source: str  # padded so that line numbers match the notebook
    filename: str
    body: CodeType | None
    last: CodeType | None
    free: dict[str, int | None] = field(default_factory=dict)  # name -> first line read (None: in a function)

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
            text = (e.text or "").strip()
            magic = text.startswith(("%", "!")) or text.endswith("?")
            hint = " (IPython magics and shell commands cannot run on a worker; plain Python only)" if magic else ""
            where = f"cell line {e.lineno}" if e.lineno else "the cell"
            raise BadArgument(f"syntax error at {where}: {e.msg}{hint}" + (f": {text}" if text else "")) from None
        if not tree.body:
            raise BadArgument("the cell is empty: write the code to run below the %%distribute line")
        # The item's value: a last statement that is an expression, taken off the body.
        tail = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
        value = tail.value if isinstance(tail, ast.Expr) else None
        last = None if value is None else compile(ast.Expression(value), filename, "eval")
        walker = _FreeNames(*tree.body, value)
        # Only functions and lambdas read later: a cell without one needs no second parse.
        later = "def" in padded or "lambda" in padded
        deferred = _deferred(symtable.symtable(padded, filename, "exec")) if later else set()
        linecache.cache[filename] = (len(padded), None, padded.splitlines(keepends=True), filename)
        body = compile(tree, filename, "exec") if tree.body else None
        free = walker.immediate | dict.fromkeys(sorted(deferred - walker.bound - set(walker.immediate)))
        return cls(padded, filename, body, last, free)

    def free_names(self, bound: Collection[str] = ()) -> dict[str, int | None]:
        """Names the cell reads from outside, minus `bound` (item variables, `seed`).

        Parameters
        ----------
        bound : Collection of str
            Names bound for each item (the ``--over`` variables, ``seed``), so not captured.

        Returns
        -------
        dict of str to int or None
            Free name -> the cell line it is first read on, or None for a name read only
            inside functions (for messages about unknown names).
        """
        return {name: line for name, line in self.free.items() if name not in bound}


_TRIAL_NAMES = frozenset({"report", "should_stop", "checkpoint"})


def mentions_trials(body: Any) -> bool:
    """Whether a cell's or a function's code names `report`, `should_stop` or `checkpoint`.

    Such a run is a trial run (`trials.py`). The names are read from the compiled code
    (and the code nested in it): a comment or a string that says "report" does not count.

    Parameters
    ----------
    body : Cell or callable
        The parsed cell, or the function.

    Returns
    -------
    bool
        True when the run is to be a trial run for what its code says.

    Examples
    --------
    >>> mentions_trials(Cell.parse("report(loss=x)", filename="<cell>"))
    True
    """
    codes = [body.body, body.last] if isinstance(body, Cell) else [getattr(body, "__code__", None)]
    return any(_TRIAL_NAMES & code_names(code) for code in codes if isinstance(code, CodeType))


def code_names(code: CodeType) -> set[str]:
    """The names `code` and the code nested in it use: globals, and attribute names too.

    What cloudpickle takes of a function's globals, and where `mentions_trials` looks.

    Parameters
    ----------
    code : types.CodeType
        A compiled function, cell or expression.

    Returns
    -------
    set of str
        Its ``co_names`` and those of every code object nested in it.
    """
    return set(code.co_names).union(*(code_names(c) for c in code.co_consts if isinstance(c, CodeType)))


class _FreeNames(ast.NodeVisitor):
    """The execution-order walk of the cell's module level; see the module docstring.

    Function and lambda bodies run later: their reads are Python's own scoping, which
    `symtable` knows (`_deferred`). A class body and a comprehension run at once; their
    own names (`scopes`) are theirs, and a class body's are not seen inside it by the
    comprehensions and classes nested in it.
    """

    def __init__(self, *nodes: ast.AST | None) -> None:
        self.bound: set[str] = set()
        self.immediate: dict[str, int | None] = {}
        self.scopes: list[tuple[set[str], bool]] = []  # (names bound, a class body?)
        self._visit_all(*nodes)

    def _load(self, name: str, line: int) -> None:
        if not any(name in names and not (is_class and depth) for depth, (names, is_class)
                   in enumerate(reversed(self.scopes))) and name not in self.bound:  # fmt: skip
            self.immediate.setdefault(name, line)

    def _store(self, name: str) -> None:
        (self.scopes[-1][0] if self.scopes else self.bound).add(name)

    def _visit_all(self, *nodes: ast.AST | None) -> None:
        for node in nodes:
            if node is not None:
                self.visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load | ast.Del):
            self._load(node.id, node.lineno)
        else:
            self._store(node.id)

    # -- statements whose fields are not in execution order ------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self._visit_all(node.value, *node.targets)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self._load(node.target.id, node.lineno)
        self.visit(node.target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        # `x: int` alone binds nothing; `a.b: int` still evaluates `a`.
        bare = node.value is None and isinstance(node.target, ast.Name)
        self._visit_all(node.annotation, node.value, None if bare else node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        # A walrus binds in the class body it stands in; in a comprehension, in the cell (Python
        # refuses one in a comprehension in a class body).
        (self.scopes[-1][0] if self.scopes and self.scopes[-1][1] else self.bound).add(node.target.id)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._visit_all(node.iter, node.target, *node.body, *node.orelse)

    visit_AsyncFor = visit_For

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in (alias for alias in node.names if alias.name != "*"):
            self._store(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler | ast.MatchAs | ast.MatchStar | ast.MatchMapping) -> None:
        # The name these bind is a string, not a `Name`; none of their parts can read it first.
        if name := getattr(node, "name", None) or getattr(node, "rest", None):
            self._store(name)
        self.generic_visit(node)

    visit_MatchAs = visit_MatchStar = visit_MatchMapping = visit_ExceptHandler

    # -- new scopes -------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        # What runs now: decorators, defaults and annotations; the body runs later.
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        self._visit_all(*getattr(node, "decorator_list", []), *args.defaults, *args.kw_defaults,
                        *(a.annotation for a in params if a), getattr(node, "returns", None))  # fmt: skip
        if not isinstance(node, ast.Lambda):
            self._store(node.name)

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_all(*node.decorator_list, *node.bases, *(k.value for k in node.keywords))
        self.scopes.append((set(), True))
        self._visit_all(*node.body)
        self.scopes.pop()
        self._store(node.name)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        first, *rest = node.generators
        self.visit(first.iter)  # evaluated in the enclosing scope
        # Generator expressions are nearly always consumed where they stand (`sum(...)`),
        # so their reads count as immediate like a list comprehension's.
        self.scopes.append((set(), False))
        self._visit_all(first.target, *first.ifs, *(n for gen in rest for n in (gen.iter, gen.target, *gen.ifs)))
        self._visit_all(*([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]))
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension


def _deferred(table: symtable.SymbolTable, later: bool = False) -> set[str]:
    """The global names that the functions and lambdas in `table` read when they run.

    The module, class bodies and comprehensions (whose implicit argument is ``.0``) run at
    once: the walk sees their reads.
    """
    later = later or not (table.get_type() in ("module", "class") or ".0" in table.get_identifiers())
    names = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()} if later else set()
    return names.union(*(_deferred(child, later) for child in table.get_children()))


@dataclass
class Plan:
    """What to run: item values and the names each binds."""

    mode: str  # "over", "grid", "zip", "once", "everywhere", "ranks"
    items: Sequence[Any]  # a list, or a range kept as it is (a million ints are 36 MB as a list)
    names: tuple[str, ...] = ()
    target: str = ""  # for "over": the target as Python spells it ("x", "(a, b)")

    def __len__(self) -> int:
        return len(self.items)

    @property
    def unpacks(self) -> bool:
        """True when a value is unpacked into several names (tuple target, grid, zip)."""
        return self.mode in ("grid", "zip") or (self.mode == "over" and self.target != self.names[0])

    def params(self, i: int) -> dict[str, Any]:
        """The names item `i` binds, with their values: what messages and `ItemError` show.

        Parameters
        ----------
        i : int
            The item's index.

        Returns
        -------
        dict of str to Any
            ``{"x": 3}``, ``{"lr": 0.1, "depth": 5}``; ``{"worker": address}`` for
            ``--everywhere``; {} for a cell run once. An item that does not unpack into the
            ``--over`` target gives ``{"item": value, "unpack error": why}``.
        """
        value = self.items[i]
        if self.mode == "everywhere":
            return {"worker": value}
        if self.mode == "over" and self.unpacks:
            scope: dict[str, Any] = {}
            try:
                exec(f"{self.target} = __item__", {"__item__": value}, scope)
            except (TypeError, ValueError) as e:
                return {"item": value, "unpack error": str(e)}
            return {n: scope[n] for n in self.names}
        # One name for an `--over` value; a tuple of values otherwise (a cell run once: none).
        return dict(zip(self.names, (value,) if self.mode == "over" else value or (), strict=True))

    def describe(self, i: int) -> str:
        """`x=3`, `lr=0.1, depth=5`: how messages name an item.

        Parameters
        ----------
        i : int
            The item's index.

        Returns
        -------
        str
            Its parameters, as `describe` writes them.
        """
        return describe(self.params(i))


def describe(params: dict[str, Any]) -> str:
    """Parameters as messages show them: `lr=0.1, depth=5`, long values cut short.

    Parameters
    ----------
    params : dict of str to Any
        Names and values (`Plan.params`).

    Returns
    -------
    str
        ``name=repr`` pairs joined by commas, each value's repr cut to 40 characters.

    Examples
    --------
    >>> describe({"lr": 0.1, "depth": 5})
    'lr=0.1, depth=5'
    """
    texts = {k: repr(v) for k, v in params.items()}
    return ", ".join(f"{k}={t if len(t) <= 40 else t[:37] + '...'}" for k, t in texts.items())


def plan(*, over: Any = None, grid: Any = None, zip: Any = None, evaluate: Callable[[str, str], Any]) -> Plan:
    """Build the plan from ``--over``, ``--grid`` or ``--zip`` (one at most: `options.DistributeOptions` checks).

    Parameters
    ----------
    over : str or Iterable, optional
        ``"NAME in ITERABLE"`` (or ``"a, b in pairs"``), evaluated in the user's namespace;
        or an iterable, whose items a function takes as its one argument.
    grid : str or Mapping, optional
        ``"lr=[0.1, 0.01], depth=[3, 5]"`` or a mapping of name -> values: every combination.
    zip : str or Mapping, optional
        The same form as `grid`: the lists taken side by side (they must be equally long).
    evaluate : callable
        ``evaluate(expression, flag)`` evaluates an expression in the user's namespace (the
        flag names it in messages).

    Returns
    -------
    Plan
        The items and the names each binds; one item binding nothing when none of the three
        is given.

    Raises
    ------
    nbcluster.errors.BadArgument
        For a malformed expression, names that are not Python names
        or bound twice, an iterable that is not one or is empty, or ``--zip`` lists of
        different lengths; the message gives the form to use.

    Examples
    --------
    >>> plan(grid={"lr": [0.1, 0.01], "depth": [3, 5]}, evaluate=eval).items
    [(0.1, 3), (0.1, 5), (0.01, 3), (0.01, 5)]
    """
    if over is not None:
        return _over(over, evaluate)
    for mode, spec in (("grid", grid), ("zip", zip)):
        if spec is not None:
            return _named_lists(spec, mode, evaluate)
    return Plan("once", [None])


def _over(over: Any, evaluate: Callable[[str, str], Any]) -> Plan:
    if not isinstance(over, str):
        return Plan("over", _materialize(over, "over", repr(type(over).__name__)), ("item",), "item")
    example = 'e.g. --over "x in range(10)" or --over "a, b in pairs"'
    source, loop = f"for {over}:\n    pass", None
    with contextlib.suppress(SyntaxError):
        loop = ast.parse(source).body[0]
    if not isinstance(loop, ast.For):
        raise BadArgument(f"--over needs `NAME in ITERABLE`, {example}; got {over!r}")
    # A target of plain names, nested or not (`(a, b), c`), in the order they are written.
    parts = sorted((n for n in ast.walk(loop.target) if isinstance(n, ast.expr)), key=lambda n: n.col_offset)
    if not all(isinstance(n, ast.Name | ast.Tuple | ast.List) for n in parts):
        raise BadArgument(f"--over binds plain names (x, or a, b), {example}; got {over!r}")
    names = tuple(n.id for n in parts if isinstance(n, ast.Name))
    if len(set(names)) != len(names):
        raise BadArgument(f"--over binds a name twice: {over!r}")
    expression = ast.get_source_segment(source, loop.iter) or ""
    items = _materialize(evaluate(expression, "over"), "over", expression)
    # The target as Python spells it: `a, b` and `(a, b)` are one target, `(x)` is `x`.
    return Plan("over", items, names, ast.unparse(loop.target))


def _named_lists(spec: Any, flag: str, evaluate: Callable[[str, str], Any]) -> Plan:
    """`--grid` or `--zip` (`flag`, the plan's mode): the named lists, combined as it says."""
    example = f'e.g. --{flag} "lr=[0.1, 0.01], depth=[3, 5]"'
    if isinstance(spec, str):  # the text, as the mapping it spells
        source, call = f"_({spec})", None
        with contextlib.suppress(SyntaxError):
            call = ast.parse(source, mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
            raise BadArgument(f"--{flag} needs NAME=VALUES pairs separated by commas, {example}; got {spec!r}")
        if len({k.arg for k in call.keywords}) != len(call.keywords):
            raise BadArgument(f"--{flag} names a parameter twice: {spec!r}")
        spec = {k.arg: evaluate(ast.get_source_segment(source, k.value) or "", flag) for k in call.keywords}
    if not isinstance(spec, Mapping):
        raise BadArgument(f"--{flag} needs a string like 'a=[1, 2], b=[3]' or a dict of lists")
    if bad := [name for name in spec if not (isinstance(name, str) and name.isidentifier())]:
        raise BadArgument(f"--{flag} names must be Python names, got {bad[0]!r}")
    if not spec:
        raise BadArgument(f"--{flag} needs at least one NAME=VALUES pair, {example}")
    lists = [_materialize(values, flag, name) for name, values in spec.items()]
    if flag == "zip" and len({len(v) for v in lists}) > 1:
        detail = ", ".join(f"{n} has {len(v)}" for n, v in zip(spec, lists, strict=True))
        raise BadArgument(f"--zip needs lists of the same length: {detail}")
    items = itertools.product(*lists) if flag == "grid" else zip(*lists, strict=True)
    return Plan(flag, list(items), tuple(spec))


def _materialize(values: Any, flag: str, what: str) -> Sequence[Any]:
    try:
        items = values if isinstance(values, range) else list(values)
    except TypeError:
        kind = type(values).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise BadArgument(f"--{flag}: {what} is not iterable (it is {article} {kind})") from None
    if not items:
        raise BadArgument(f"--{flag}: {what} is empty, so there is nothing to run")
    return items


def human(size: float) -> str:
    """A byte count for people: ``"512 B"``, ``"1.5 MB"``.

    Parameters
    ----------
    size : float
        A size in bytes.

    Returns
    -------
    str
        The size in B, kB, MB or GB (powers of 1000), at most one decimal.

    Examples
    --------
    >>> human(2_500_000)
    '2.5 MB'
    """
    for unit in ("B", "kB", "MB"):
        if size < 1000:
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
