"""Worker side: a batch's items run in chunks, each one loop in C or one compiled `for`.

Running items one by one with their bookkeeping (a clock read, a stop check, naming the item
for its output) costs about 0.2 us an item; a fresh copy of the namespace and an
`exec`/`eval` per item as much again. For a tiny item (`x + 1`) that is ten times the work.
So a batch runs in chunks, the bookkeeping done once per chunk, and each chunk is one loop:

- a function over plain items (`distribute(fn, over=xs)`, no seed, nothing it reads to
  copy per item): `values.extend(map(fn, chunk))` (`starmap` when an item unpacks into
  arguments), at C speed;
- a cell that is one expression, whose captured values are all shared (`context.py`) (``%%distribute --over "x in xs"`` then ``f(x) + 1``, or
  ``--grid``/``--zip``, no seed): the cell's expression compiled into a function of the
  chunk, ``for x in CHUNK: VALUES.append(<expression>)``, with the cell's own file name and line
  numbers, called once per chunk. A function, not module-level code run by `exec`: its item
  names are local variables, not the namespace's keys, which halves a tiny item's time
  (`x + 1`: 45 ns against 91 here), and the namespace is only read, never written;
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

**Why one loop per chunk is safe for a one-expression cell.** The general path gives
each item a fresh copy of the captured namespace, so that names one item assigns are not
seen by the next. An expression assigns no name, except with the walrus operator, and can
reach its scope otherwise only by introspection (`globals()`, `locals()`, `vars()`,
`exec`, `eval`, frames). A cell using any of those, a `lambda` or a generator expression
(which would see a later item's name when called after its item), or a name the loop itself
uses, keeps the general path (`cell_loop` returns None). Comprehensions run at once and
read the name as it is, so they stay. What is left reads the captured namespace and its
own item names, and writes nothing: the loop runs with the captured namespace itself as its
globals, shared by the worker's batches, with no copy per batch. That is only correct
because every value in it is immutable or a read-only array (`run/capture.py`'s
`shareable`): a cell that captures anything an item could change takes the general path,
where each item unpickles its own copy.
"""

from __future__ import annotations

import ast
import itertools
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from types import CodeType
from typing import Any

#: A cell's (or a function's) loop over one chunk: ``loop(chunk, values)`` (`loop_function`).
Loop = Callable[[Iterator[Any], list[Any]], None]

CHUNK_S = 0.002  # seconds a chunk aims at: how long a stop or a spent budget may wait
_ITEMS, _VALUES = "__nbcluster_items__", "__nbcluster_values__"
_KEEP_LOOPS = 32  # cells whose loop is kept (`cell_loop`)
_LOOPS: OrderedDict[tuple[str, tuple[str, ...], bool], CodeType | None] = OrderedDict()
_LOOPS_LOCK = threading.Lock()  # contexts load in the worker's threads
# Names through which an expression could read or change the namespace it runs in.
_INTROSPECTION = frozenset({"globals", "locals", "vars", "exec", "eval", "dir", "breakpoint", "_getframe",
                            "currentframe", "f_globals", "f_locals", "f_back"})  # fmt: skip


def cell_loop(source: str, filename: str, names: tuple[str, ...], tuple_target: bool) -> CodeType | None:
    """The loop that runs a one-expression cell over a chunk of items, or None if it must not.

    A worker loads each run's context once, and making the loop (parse, check, compile: about
    0.13 ms here) was most of that load, in every worker's first batch of every run. A cell
    run again, as a notebook's cells are, takes the loop made for its source the last time,
    under its new run's file name (`_KEEP_LOOPS` sources are kept).

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
        The code of a function of two arguments, the chunk's iterator and the values list
        (`loop_function` makes it); None when the cell is not one expression, or
        uses something that could tell one namespace per batch from one per item.

    Examples
    --------
    >>> cell_loop("x + 1", "<cell>", ("x",), False) is not None
    True
    >>> cell_loop("(y := x + 1)", "<cell>", ("x",), False) is None
    True
    """
    made = _kept(_LOOPS, (source, names, tuple_target), lambda: _make_loop(source, filename, names, tuple_target))
    return None if made is None else refiled(made, filename)


def _kept(cache: OrderedDict[Any, CodeType | None], key: Any, make: Callable[[], CodeType | None]) -> CodeType | None:
    """What `make` gave for `key` the last time (the last `_KEEP_LOOPS` kept), else `make()`,
    outside the lock: two threads loading the same context at once both make it."""
    with _LOOPS_LOCK:
        if key in cache:
            return cache[key]
    made = make()
    with _LOOPS_LOCK:
        cache[key] = made
        while len(cache) > _KEEP_LOOPS:
            cache.popitem(last=False)
    return made


def refiled(code: CodeType, filename: str) -> CodeType:
    """`code`, and the code nested in it (a comprehension's), under `filename`.

    Parameters
    ----------
    code : code
        A loop's code (`cell_loop`).
    filename : str
        The file its frames name: the cell's.

    Returns
    -------
    code
        `code` itself when it already names `filename`, else a copy that does.
    """
    if code.co_filename == filename:
        return code
    consts = tuple(refiled(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _make_loop(source: str, filename: str, names: tuple[str, ...], tuple_target: bool) -> CodeType | None:
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr) or not names:
        return None
    return _loop_code(tree.body[0].value, filename, names, tuple_target)


def _loop_code(
    expression: ast.expr, filename: str, names: tuple[str, ...], tuple_target: bool
) -> CodeType | None:
    """``for NAMES in ITEMS: VALUES.append(expression)`` as the code of a function, or
    None when the expression could tell one namespace per chunk from one per item."""
    for node in ast.walk(expression):
        if isinstance(node, ast.NamedExpr | ast.Lambda | ast.GeneratorExp | ast.Await | ast.Yield | ast.YieldFrom):
            return None
        found = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if found is not None and (found in _INTROSPECTION or found.startswith("__nbcluster")):
            return None
    store: list[ast.expr] = [ast.Name(id=n, ctx=ast.Store()) for n in names]
    target: ast.expr = ast.Tuple(elts=store, ctx=ast.Store()) if tuple_target else store[0]
    # `VALUES.append(...)`, a method of a list: Python runs it as one step, with no call.
    method = ast.Attribute(value=ast.Name(id=_VALUES, ctx=ast.Load()), attr="append", ctx=ast.Load())
    append = ast.Call(func=method, args=[expression], keywords=[])
    loop = ast.For(
        target=target,
        iter=ast.Name(id=_ITEMS, ctx=ast.Load()),
        body=[ast.Expr(value=append)],
        orelse=[],
    )
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=_ITEMS), ast.arg(arg=_VALUES)], vararg=None,
        kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[],
    )  # fmt: skip
    # The loop is named as the cell's top level, which it stands for: a traceback shows the
    # cell's line as it would the cell run directly, "in <module>" (`tracebacks.py` names
    # such a frame by its line only).
    function = ast.FunctionDef(name="<module>", args=arguments, body=[loop], decorator_list=[], returns=None)
    # The loop's own nodes take the expression's position: a traceback points at its line.
    for node in (function, arguments, *arguments.args, loop, target, *store, loop.iter, append, method,
                 method.value, loop.body[0]):  # fmt: skip
        ast.copy_location(node, expression)
    module = compile(ast.Module(body=[function], type_ignores=[]), filename, "exec", dont_inherit=True)
    return next(c for c in module.co_consts if isinstance(c, CodeType))


def loop_function(code: CodeType, namespace: dict[str, Any]) -> Loop:
    """The loop of `cell_loop` as a function reading its names from `namespace`.

    Parameters
    ----------
    code : code
        What `cell_loop` returned.
    namespace : dict
        The captured names the cell reads (only read: the loop writes nothing there). Like
        any module's globals it should hold ``__builtins__`` (`Context` sees to that): C code
        that imports reads it from the running frame's globals.

    Returns
    -------
    callable
        ``loop(chunk, values)``: runs the cell once per item of `chunk`, appending each value to
        the list `values`.

    Examples
    --------
    >>> values = []
    >>> loop_function(cell_loop("x + k", "<cell>", ("x",), False), {"k": 10})(iter([1, 2]), values)
    >>> values
    [11, 12]
    """
    return types.FunctionType(code, namespace)


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
    loop: Loop | None,
    fn: Callable[..., Any] | None,
    chunk: Iterator[Any],
    values: list[Any],
    on_error: Callable[[int, BaseException], None],
) -> bool:
    """Run a chunk of items, appending each value to `values`; a failing item gets None.

    Parameters
    ----------
    loop : callable or None
        A cell's loop (`loop_function`); None runs `fn` over the chunk instead.
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
    if loop is None:
        assert fn is not None
        mapped = fn(chunk)
    while True:
        try:
            if loop is not None:
                loop(chunk, values)
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
