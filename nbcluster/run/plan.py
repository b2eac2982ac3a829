"""Items from `--over` / `--grid` / `--zip`.

A `Plan` holds the item values (`items`, a list) and how one value binds names:

- `over="x in xs"`: each value of `xs` binds `x`; `"a, b in pairs"` unpacks each value;
- `grid="lr=[..], depth=[..]"`: the Cartesian product, first name slowest (like nested
  loops written in that order); each value is a tuple bound to the names in order;
- `zip="a=[..], b=[..]"`: the lists walked in step (equal lengths required);
- none of these: one item with no names.

Per-item parameter dicts (`Plan.params(i)`) are built only when asked for: a 100,000-item
cell should not pay for 100,000 dicts it never looks at. How items are grouped into
batches is `batching.py`'s business.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbcluster.errors import BadArgument


@dataclass
class Plan:
    """What to run: item values and the names each binds."""

    mode: str  # "over", "grid", "zip", "once", "everywhere"
    items: Sequence[Any]  # a list, or a range kept as it is (a million ints are 36 MB as a list)
    names: tuple[str, ...] = ()
    target: str = ""  # for "over": the target as written ("x", "a, b")
    positional: bool = False  # for "over" with an iterable and a function: fn(item)

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
        if self.mode == "once":
            return {}
        if self.mode == "over" and not self.unpacks:
            return {self.names[0]: value}
        if self.mode == "over":
            scope: dict[str, Any] = {}
            try:
                exec(f"{self.target} = __item__", {"__item__": value}, scope)
            except (TypeError, ValueError) as e:
                return {"item": value, "unpack error": str(e)}
            return {n: scope[n] for n in self.names}
        return dict(zip(self.names, value, strict=True))

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
    parts = []
    for k, v in params.items():
        text = repr(v)
        parts.append(f"{k}={text if len(text) <= 40 else text[:37] + '...'}")
    return ", ".join(parts)


def plan(
    *,
    over: Any = None,
    grid: Any = None,
    zip: Any = None,
    evaluate: Callable[[str, str], Any],
) -> Plan:
    """Build the plan from ``--over``, ``--grid`` or ``--zip`` (at most one of them).

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
        For more than one of them, a malformed expression, names that are not Python names
        or bound twice, an iterable that is not one or is empty, or ``--zip`` lists of
        different lengths; the message gives the form to use.

    Examples
    --------
    >>> plan(grid={"lr": [0.1, 0.01], "depth": [3, 5]}, evaluate=eval).items
    [(0.1, 3), (0.1, 5), (0.01, 3), (0.01, 5)]
    """
    given = [name for name, v in (("over", over), ("grid", grid), ("zip", zip)) if v is not None]
    if len(given) > 1:
        raise BadArgument(f"use one of --over, --grid and --zip, not {' and '.join('--' + g for g in given)}")
    if over is not None:
        return _over(over, evaluate)
    if grid is not None:
        names, lists = _named_lists(grid, "grid", evaluate)
        return Plan("grid", list(itertools.product(*lists)), names)
    if zip is not None:
        names, lists = _named_lists(zip, "zip", evaluate)
        lengths = {n: len(v) for n, v in builtins_zip(names, lists)}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{n} has {k}" for n, k in lengths.items())
            raise BadArgument(f"--zip needs lists of the same length: {detail}")
        return Plan("zip", list(builtins_zip(*lists)), names)
    return Plan("once", [None])


builtins_zip = zip


def _over(over: Any, evaluate: Callable[[str, str], Any]) -> Plan:
    if not isinstance(over, str):
        items = _materialize(over, "over", repr(type(over).__name__))
        return Plan("over", items, ("item",), target="item", positional=True)
    example = 'e.g. --over "x in range(10)" or --over "a, b in pairs"'
    try:
        loop = ast.parse(f"for {over}:\n    pass").body[0]
    except SyntaxError:
        raise BadArgument(f"--over needs `NAME in ITERABLE`, {example}; got {over!r}") from None
    assert isinstance(loop, ast.For)
    names = _target_names(loop.target)
    if names is None:
        raise BadArgument(f"--over binds plain names (x, or a, b), {example}; got {over!r}")
    if len(set(names)) != len(names):
        raise BadArgument(f"--over binds a name twice: {over!r}")
    expression = ast.get_source_segment(f"for {over}:\n    pass", loop.iter) or ""
    target = ast.get_source_segment(f"for {over}:\n    pass", loop.target) or names[0]
    items = _materialize(evaluate(expression, "over"), "over", expression)
    return Plan("over", items, tuple(names), target=target.strip("()[] "))


def _target_names(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        names: list[str] = []
        for elt in node.elts:
            sub = _target_names(elt)
            if sub is None:
                return None
            names.extend(sub)
        return names
    return None


def _named_lists(
    spec: Any, flag: str, evaluate: Callable[[str, str], Any]
) -> tuple[tuple[str, ...], list[Sequence[Any]]]:
    example = f'e.g. --{flag} "lr=[0.1, 0.01], depth=[3, 5]"'
    if isinstance(spec, Mapping):
        pairs = [(str(k), v) for k, v in spec.items()]
        for name, _ in pairs:
            if not name.isidentifier():
                raise BadArgument(f"--{flag} names must be Python names, got {name!r}")
    elif isinstance(spec, str):
        try:
            call = ast.parse(f"_({spec})", mode="eval").body
        except SyntaxError:
            raise BadArgument(
                f"--{flag} needs NAME=VALUES pairs separated by commas, {example}; got {spec!r}"
            ) from None
        assert isinstance(call, ast.Call)
        if call.args or any(k.arg is None for k in call.keywords):
            raise BadArgument(
                f"--{flag} needs NAME=VALUES pairs separated by commas, {example}; got {spec!r}"
            )
        names = [k.arg for k in call.keywords]
        if len(set(names)) != len(names):
            raise BadArgument(f"--{flag} names a parameter twice: {spec!r}")
        source = f"_({spec})"
        pairs = [
            (k.arg or "", evaluate(ast.get_source_segment(source, k.value) or "", flag))
            for k in call.keywords
        ]
    else:
        raise BadArgument(f"--{flag} needs a string like 'a=[1, 2], b=[3]' or a dict of lists")
    if not pairs:
        raise BadArgument(f"--{flag} needs at least one NAME=VALUES pair, {example}")
    lists = [_materialize(values, flag, name) for name, values in pairs]
    return tuple(n for n, _ in pairs), lists


def _materialize(values: Any, flag: str, what: str) -> Sequence[Any]:
    try:
        items = values if isinstance(values, range) else list(values)
    except TypeError:
        raise BadArgument(f"--{flag}: {what} is not iterable (it is {_a(type(values).__name__)})") from None
    if not items:
        raise BadArgument(f"--{flag}: {what} is empty, so there is nothing to run")
    return items


def _a(noun: str) -> str:
    """`noun` with its article: "an int", "a float"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
