"""The worker's fast path (`worker/loop.py`) keeps the per-item guarantees: one failing item
fails alone, output goes to the item that wrote it, a stop ends a batch within a chunk, and a
cell that could tell one shared namespace from one per item runs item by item."""

from __future__ import annotations

import collections
import itertools
import pickle
import time
from typing import Any

import pytest

from nbcluster.run.cell import Cell
from nbcluster.worker import output, stopping
from nbcluster.worker.context import Context
from nbcluster.worker.items import run_items
from nbcluster.worker.loop import cell_loop


def context(
    source: str, namespace: dict[str, Any] | None = None, filename: str = "<test-loop-cell>", **spec: Any
) -> Context:
    cell = Cell.parse(source, filename=filename, first_line=2)
    full = {"kind": "cell", "mode": "over", "names": ("x",), "target": "x", "unpacks": False,
            "positional": False, "seed": None, "large": [], "filename": cell.filename,
            "source": cell.source, "body": cell.body, "last": cell.last, **spec}  # fmt: skip
    return Context(full, {"__name__": "__main__", **(namespace or {})})


def one_in_seven_fails(x: int) -> int:
    return 10 // (x % 7) + x


def pair_fails(a: int, b: int) -> int:
    return 10 // (a - b)


FAST = {
    "cell": lambda: context("10 // (x % 7) + x"),
    "function": lambda: context("x", kind="function", fn=one_in_seven_fails),
}


@pytest.mark.parametrize("kind", list(FAST))
def test_a_failing_item_in_a_chunk_fails_alone(kind: str) -> None:
    ctx = FAST[kind]()
    assert kind == "function" or ctx.loop is not None  # the fast path, not item by item
    result = run_items(ctx, range(1000, 1300), list(range(300)), capture=True)
    failing = [j for j in range(300) if j % 7 == 0]
    assert result["count"] == 300 and not result["stopped"]
    assert sorted(result["errors"]) == failing  # by position in the batch, several per chunk
    assert result["values"] == [None if j % 7 == 0 else 10 // (j % 7) + j for j in range(300)]
    for record in result["errors"].values():
        assert record["type"] == "ZeroDivisionError"
        # The next item ran outside the handler of the last one's exception.
        assert record["traceback"].__context__ is None


def test_a_cell_failure_points_at_the_cell_line() -> None:
    result = run_items(context("1 // (x - 3)"), range(5), list(range(5)), capture=True)
    assert list(result["errors"]) == [3]
    frames = result["errors"][3]["traceback"].stack
    assert [(f.filename, f.lineno) for f in frames] == [("<test-loop-cell>", 2)]


def test_items_that_unpack_into_arguments_or_names() -> None:
    fn = context("x", kind="function", fn=pair_fails, unpacks=True, target="a, b", names=("a", "b"))
    pairs = [(3, 1), (2, 2), (5, 0)]
    assert fn.kind == "function"
    result = run_items(fn, range(3), pairs, capture=True)
    assert result["values"] == [5, None, 2] and list(result["errors"]) == [1]
    grid = context("10 // (a - b)", mode="grid", names=("a", "b"), target="")
    assert grid.loop is not None
    result = run_items(grid, range(3), pairs, capture=True)
    assert result["values"] == [5, None, 2] and list(result["errors"]) == [1]


def test_output_is_filed_under_the_item_that_wrote_it() -> None:
    output.install()
    # The worker's `display` (in a process that made an IPython shell, the builtin is IPython's).
    ctx = context("print('item', x) or display(x * 10) or x", {"display": output.display})
    assert ctx.loop is not None
    result = run_items(ctx, range(500, 700), list(range(200)), capture=True)
    assert result["values"] == list(range(200))
    assert sorted(result["outputs"]) == list(range(500, 700))
    for j in range(200):
        assert result["outputs"][500 + j] == [
            ["stdout", f"item {j}\n"],
            ["display", {"text/plain": str(j * 10)}],
        ]


def test_a_stop_token_ends_the_batch_at_the_end_of_its_chunk() -> None:
    token = "test-loop-stop"

    def stop_at(x: int) -> int:
        if x == 50:
            stopping.stop(token)
        return x

    n = 1_000_000
    result = run_items(context("stop_at(x)", {"stop_at": stop_at}), range(n), range(n), capture=True, token=token)
    # Chunks at most double (1, 2, 4, ... 32, 64): item 50's chunk ends by item 127.
    assert result["stopped"] and 50 < result["count"] < 128
    assert result["values"] == list(range(result["count"]))


def test_on_the_general_path_a_stop_token_ends_the_batch_before_the_next_item() -> None:
    token = "test-loop-stop-each"

    def stop_at(x: int) -> int:
        if x == 50:
            stopping.stop(token)
        return x

    ctx = context("y = stop_at(x)\ny", {"stop_at": stop_at})  # statements: item by item
    assert ctx.loop is None
    result = run_items(ctx, range(1000), list(range(1000)), capture=True, token=token)
    assert result["stopped"] and result["count"] == 51
    assert result["values"] == list(range(51)) and not result["errors"]


def test_a_spent_budget_ends_the_batch_within_a_few_chunks() -> None:
    def slow(x: int) -> int:
        time.sleep(0.001)  # the item's own work, a millisecond
        return x

    ctx = context("x", kind="function", fn=slow)
    result = run_items(ctx, range(10_000), list(range(10_000)), capture=True, budget=0.05)
    assert result["stopped"] and 0 < result["count"] < 1_000  # ten seconds of items otherwise


@pytest.mark.parametrize(
    "source",
    [
        "(y := x) + 1",  # a walrus assigns a name
        "lambda: x",  # called later, it would see a later item's x
        "(x for _ in range(2))",
        "globals().setdefault('first', x)",
        "eval('x')",
        "__import__('sys')._getframe().f_globals",
    ],
)
def test_cells_that_could_tell_a_shared_namespace_run_item_by_item(source: str) -> None:
    assert cell_loop(source, "<c>", ("x",), False) is None


def test_comprehensions_and_calls_take_the_fast_path() -> None:
    for source in ("x + 1", "[x * i for i in range(3)]", "{'x': x, 'f': abs(-x)}", "f(x)[0].y"):
        assert cell_loop(source, "<c>", ("x",), False) is not None
    assert cell_loop("y = x\ny", "<c>", ("x",), False) is None  # statements: item by item


def test_each_item_sees_its_own_names_where_it_could_tell() -> None:
    # Item by item, each item's lambda and namespace are its own; with one namespace per
    # batch every lambda would return the last x and `first` would stay 0.
    lambdas = run_items(context("lambda: x"), range(5), list(range(5)), capture=True)["values"]
    assert [f() for f in lambdas] == list(range(5))
    firsts = run_items(context("globals().setdefault('first', x)"), range(5), list(range(5)), capture=True)
    assert firsts["values"] == list(range(5))


def test_seeded_items_keep_their_own_seeds() -> None:
    ctx = context("seed", seed=7)
    assert ctx.loop is None
    fn = context("x", kind="function", fn=lambda x, seed: seed, seed=7)
    seeds = run_items(ctx, range(3), [0, 1, 2], capture=True)["values"]
    assert seeds == run_items(fn, range(3), [0, 1, 2], capture=True)["values"] and len(set(seeds)) == 3


def test_chunks_cover_every_item_once_in_order() -> None:
    from nbcluster.worker.loop import chunks

    items = list(range(1000))
    sizes = itertools.cycle([1, 3, 50])
    assert [x for chunk in chunks(items, len(items), sizes) for x in chunk] == items


def test_a_cell_loop_runs_c_code_that_imports() -> None:
    # C code that imports (pickle's class lookup, numpy's lazy imports) reads `__builtins__`
    # from the running frame's globals; the loop's globals are the captured namespace.
    ctx = context("loads(x)", {"loads": pickle.loads})
    assert ctx.loop is not None
    blob = pickle.dumps(collections.OrderedDict(a=1))
    result = run_items(ctx, range(3), [blob] * 3, capture=True)
    assert not result["errors"] and result["values"] == [collections.OrderedDict(a=1)] * 3


def test_a_cell_run_again_points_at_its_own_run() -> None:
    # The second run takes the loop the first made (same source), under its own file name,
    # down to the comprehension's frame: a traceback shows the cell of the run it came from.
    for filename in ("<distribute-first>", "<distribute-again>"):
        result = run_items(context("[10 // (x - i) for i in range(3)]", filename=filename), range(3), [0, 1, 2],
                           capture=True)  # fmt: skip
        assert sorted(result["errors"]) == [0, 1, 2]
        for record in result["errors"].values():
            assert {f.filename for f in record["traceback"].stack} == {filename}


def plain_function(x: int) -> int:
    """A docstring is allowed."""
    return 10 // (x - 3)


def test_a_function_fails_in_its_own_frame() -> None:
    called = context("x", kind="function", fn=plain_function)
    result = run_items(called, range(5), list(range(5)), capture=True)
    assert result["values"] == [-4, -5, -10, None, 10]
    frames = [(f.filename, f.lineno, f.name, f.line) for f in result["errors"][3]["traceback"].stack]
    assert frames == [(__file__, plain_function.__code__.co_firstlineno + 2, "plain_function", "return 10 // (x - 3)")]
