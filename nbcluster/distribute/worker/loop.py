"""Worker side: a batch's items run in chunks, each one loop in C or one compiled `for`.

Running items one by one with their bookkeeping (a clock read, a stop check, naming the item
for its output) costs about 0.2 us an item; a fresh copy of the namespace and an
`exec`/`eval` per item as much again. For a tiny item (`x + 1`) that is ten times the work.
So a batch runs in chunks, the bookkeeping done once per chunk, and each chunk is one loop:

- a function over plain items (`distribute(fn, over=xs)`, no seed): `values.extend(map(fn,
  chunk))` (`starmap` when an item unpacks into arguments), at C speed;
- a cell that is one expression (``%%distribute --over "x in xs"`` then ``f(x) + 1``, or
  ``--grid``/``--zip``, no seed): the cell's expression compiled into a loop,
  ``for x in CHUNK: APPEND(<expression>)``, with the cell's own file name and line numbers,
  run by one `exec` per chunk;
- anything else (statements, a seed, an unpacking target, keyword arguments): the one-item
  step (`items._run_one`, a fresh namespace per item) mapped over (item, index) pairs with
  `starmap`.

**Chunks.** The items run in chunks sized to take about `CHUNK_S`: the first chunk is one
item, and each next one at most twice the last, from the time per item measured so far
(and never past the batch's time budget). So a stop token, a cancelled task or a spent
budget, checked between chunks, takes effect within a few ms, or one item's time for items
slower than that. The general path's one-item step also checks the stop token before each
item (`Stopped`): beside a fresh namespace per item it costs little, and a cell that waits
on something, then is stopped, runs no further item.

**A failing item fails alone.** The values are appended in order to one list, so when the
loop raises, its length is the failing item's position in the batch: it gets its error
record and a None, and the same loop resumes after it. The chunk is an iterator
(`itertools.islice` of the batch's), so the item that raised has been taken from it and
the next `exec` (or `extend`) starts with the one after. The resumption runs outside the
`except` block, so the next item's own exception carries no `__context__` from this one.

**Output.** The item running is the one at position ``len(values)``: `output.follow` files
a print or a `display()` under that item's index, read when something is written, not
set per item.

**Why one namespace per batch is safe for a one-expression cell.** The general path gives
each item a fresh copy of the captured namespace, so that names one item assigns are not
seen by the next. An expression assigns no name, except with the walrus operator, and can
reach its namespace otherwise only by introspection (`globals()`, `locals()`, `vars()`,
`exec`, `eval`, frames). A cell using any of those, a `lambda` or a generator expression
(which would see a later item's name when called after its item), or a name the loop itself
uses, keeps the general path (`cell_loop` returns None). Comprehensions run at once and
read the name as it is, so they stay.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterable, Iterator
from types import CodeType
from typing import Any

CHUNK_S = 0.002  # seconds a chunk aims at: how long a stop or a spent budget may wait
_ITEMS, _APPEND = "__nbcluster_items__", "__nbcluster_append__"
# Names through which an expression could read or change the namespace it runs in.
_INTROSPECTION = frozenset({"globals", "locals", "vars", "exec", "eval", "dir", "breakpoint", "_getframe",
                            "currentframe", "f_globals", "f_locals", "f_back"})  # fmt: skip


def cell_loop(source: str, filename: str, names: tuple[str, ...], tuple_target: bool) -> CodeType | None:
    """The loop that runs a one-expression cell over a chunk of items, or None if it must not.

    Parameters
    ----------
    source : str
        The cell's source, padded so that its line numbers are the notebook's.
    filename : str
        The cell's file name, which the loop's code carries (tracebacks map it to the cell).
    names : tuple of str
        The names an item binds.
    tuple_target : bool
        True when an item is a tuple of values, one per name (``--grid``, ``--zip``).

    Returns
    -------
    code or None
        Code for `exec` in a namespace holding the chunk's iterator under ``_ITEMS`` and the
        values list's ``append`` under ``_APPEND``; None when the cell is not one expression,
        or uses something that could tell one namespace per batch from one per item.

    Examples
    --------
    >>> cell_loop("x + 1", "<cell>", ("x",), False) is not None
    True
    >>> cell_loop("(y := x + 1)", "<cell>", ("x",), False) is None
    True
    """
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr) or not names:
        return None
    expression = tree.body[0].value
    for node in ast.walk(expression):
        if isinstance(node, ast.NamedExpr | ast.Lambda | ast.GeneratorExp | ast.Await | ast.Yield | ast.YieldFrom):
            return None
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is not None and (name in _INTROSPECTION or name.startswith("__nbcluster")):
            return None
    store: list[ast.expr] = [ast.Name(id=n, ctx=ast.Store()) for n in names]
    target: ast.expr = ast.Tuple(elts=store, ctx=ast.Store()) if tuple_target else store[0]
    append = ast.Call(func=ast.Name(id=_APPEND, ctx=ast.Load()), args=[expression], keywords=[])
    loop = ast.For(
        target=target,
        iter=ast.Name(id=_ITEMS, ctx=ast.Load()),
        body=[ast.Expr(value=append)],
        orelse=[],
    )
    # The loop's own nodes take the expression's position: a traceback points at the cell line.
    for node in (loop, target, *store, loop.iter, append, append.func, loop.body[0]):
        ast.copy_location(node, expression)
    return compile(ast.Module(body=[loop], type_ignores=[]), filename, "exec", dont_inherit=True)


def chunk_sizes(per_item: Callable[[], float | None], left: Callable[[], float | None]) -> Iterator[int]:
    """How many items each next chunk takes: 1, then up to twice the last, aiming at `CHUNK_S`.

    Parameters
    ----------
    per_item : callable
        The time per item measured so far, or None before any.
    left : callable
        Seconds left of the batch's budget, or None without one.

    Yields
    ------
    int
        The next chunk's size, at least 1.

    Examples
    --------
    >>> sizes = chunk_sizes(lambda: 1e-6, lambda: None)
    >>> [next(sizes) for _ in range(4)]
    [1, 2, 4, 8]
    >>> sizes = chunk_sizes(lambda: 1e-3, lambda: None)
    >>> [next(sizes) for _ in range(4)]
    [1, 2, 2, 2]
    """
    size = 1
    while True:
        yield size
        per = per_item()
        aim = CHUNK_S
        budget_left = left()
        if budget_left is not None:
            aim = min(aim, budget_left)
        fits = 2 * size if per is None or per <= 0 else int(aim / per)
        size = max(1, min(2 * size, fits))


class Stopped(Exception):
    """Raised by a one-item step, before its item, when the run was told to stop: the chunk
    ends there (the general path checks before every item, as it costs little beside it)."""


def run_chunk(
    code: CodeType | None,
    namespace: dict[str, Any],
    fn: Callable[..., Any] | None,
    chunk: Iterator[Any],
    values: list[Any],
    on_error: Callable[[int, BaseException], None],
) -> bool:
    """Run a chunk of items, appending each value to `values`; a failing item gets None.

    Parameters
    ----------
    code : code or None
        A `cell_loop`, run in `namespace`; None runs `fn` over the chunk instead.
    namespace : dict
        The batch's namespace for `code` (its own copy: the loop binds the item names in it).
    fn : callable or None
        For a function's items: called with each item of `chunk` (`map`, or `starmap` over
        items it unpacks, bound in `fn` by the caller).
    chunk : iterator
        The chunk's items; consumed.
    values : list
        The batch's values so far; the chunk's are appended.
    on_error : callable
        Called with (position in the batch, exception) for each item that raised.

    Returns
    -------
    bool
        True when a step raised `Stopped`: the chunk's other items were not run.

    Raises
    ------
    KeyboardInterrupt
        Ctrl-C in the kernel during ``--local``: it stops the cell rather than fail one item.
    """
    if code is not None:
        namespace[_ITEMS] = chunk
        namespace[_APPEND] = values.append
        assert fn is None
    else:
        assert fn is not None
        mapped = fn(chunk)
    while True:
        try:
            if code is not None:
                exec(code, namespace)
            else:
                values.extend(mapped)
            return False
        except Stopped:
            return True
        except KeyboardInterrupt:
            raise  # Ctrl-C in the kernel (--local) stops the cell; workers never get one
        except BaseException as e:  # SystemExit too: one item's sys.exit() fails that item
            on_error(len(values), e)
            values.append(None)


def chunks(items: Iterable[Any], n: int, sizes: Iterator[int]) -> Iterator[Iterator[Any]]:
    """The `n` `items` cut into consecutive chunks of the sizes `sizes` gives, as they are
    asked for.

    Parameters
    ----------
    items : iterable
        The batch's items.
    n : int
        How many there are.
    sizes : iterator of int
        The size of each next chunk, read only when that chunk is asked for.

    Yields
    ------
    iterator
        Each chunk, an `itertools.islice` of one shared iterator: consume it before asking
        for the next.

    Examples
    --------
    >>> [list(c) for c in chunks([1, 2, 3, 4, 5], 5, iter([1, 2, 4]))]
    [[1], [2, 3], [4, 5]]
    """
    it = iter(items)
    left = n
    while left > 0:
        size = min(next(sizes), left)
        left -= size
        yield itertools.islice(it, size)
