"""A batch's items on a worker (`worker/__init__.py`), mapped in chunks, keep the per-item
guarantees: one failing item fails alone, output goes to the item that wrote it, a stop ends a
batch within a chunk, and each item sees its own names, whichever way it runs."""

from __future__ import annotations

import collections
import marshal
import pickle
import threading
import time
from typing import Any

import cloudpickle
import pytest

from nbcluster import worker
from nbcluster.run.cell import Cell
from nbcluster.worker import Context, run_items
from nbcluster.worker.context import stop_run


def context(
    source: str, namespace: dict[str, Any] | None = None, filename: str = "<test-loop-cell>", **spec: Any
) -> Context:
    cell = Cell.parse(source, filename=filename, first_line=2)
    full = {"kind": "cell", "mode": "over", "names": ("x",), "target": "x", "unpacks": False,
            "seed": None, "large": [], "filename": cell.filename,
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
    result = run_items(ctx, range(1000, 1300), list(range(300)), capture=True)
    failing = [j for j in range(300) if j % 7 == 0]
    assert result["count"] == 300 and not result["stopped"]
    assert sorted(result["errors"]) == failing  # by position in the batch, several per chunk
    assert result["values"] == [None if j % 7 == 0 else 10 // (j % 7) + j for j in range(300)]
    for record in result["errors"].values():
        assert record["type"] == "ZeroDivisionError"
        # The next item ran outside the handler of the last one's exception.
        assert record["traceback"].__context__ is None


def stops_at_two(x: int) -> int:
    if x == 2:
        next(iter([]))  # StopIteration, which `map` takes for the end of the items
    return x


@pytest.mark.parametrize(
    "ctx",
    [context("x", kind="function", fn=stops_at_two), context("stops_at_two(x)\ny = 1\ny * x", {"stops_at_two": stops_at_two}),
     context("stops_at_two(x)", {"stops_at_two": stops_at_two})],
    ids=["function", "statements", "one expression"],
)  # fmt: skip
def test_an_item_raising_stop_iteration_fails_alone_and_the_rest_keep_their_places(ctx: Context) -> None:
    result = run_items(ctx, range(5), list(range(5)), capture=True)
    assert result["count"] == 5 and not result["stopped"]
    assert result["values"] == [0, 1, None, 3, 4]
    record = result["errors"][2]
    assert list(result["errors"]) == [2] and "StopIteration" in f"{record['type']}: {record['message']}"


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
    result = run_items(grid, range(3), pairs, capture=True)
    assert result["values"] == [5, None, 2] and list(result["errors"]) == [1]


def test_output_is_filed_under_the_item_that_wrote_it() -> None:
    worker.install()
    # The worker's `display` (in a process that made an IPython shell, the builtin is IPython's).
    ctx = context("print('item', x) or display(x * 10) or x", {"display": worker.display})
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
            stop_run(token)
        return x

    n = 1_000_000
    result = run_items(context("stop_at(x)", {"stop_at": stop_at}), range(n), range(n), capture=True, token=token)
    # Chunks at most double (1, 2, 4, ... 32, 64): item 50's chunk ends by item 127.
    assert result["stopped"] and 50 < result["count"] < 128
    assert result["values"] == list(range(result["count"]))


def test_on_the_general_path_a_stop_token_ends_the_batch_before_the_next_item() -> None:
    token = "test-loop-stop-general"

    def stop_at(x: int) -> int:
        if x == 50:
            stop_run(token)
        return x

    ctx = context("y = stop_at(x)\ny", {"stop_at": stop_at})  # statements: a namespace per item
    result = run_items(ctx, range(1000), list(range(1000)), capture=True, token=token)
    assert result["stopped"] and result["count"] == 51
    assert result["values"] == list(range(51)) and not result["errors"]


def test_a_stop_token_ends_a_batch_of_slow_items_after_the_current_item() -> None:
    token = "test-loop-stop-each"

    def stop_at(x: int) -> int:
        time.sleep(0.003)  # longer than a chunk aims at: one item a chunk
        if x == 5:
            stop_run(token)
        return x

    ctx = context("y = stop_at(x)\ny", {"stop_at": stop_at})  # statements: a namespace per item
    result = run_items(ctx, range(1000), list(range(1000)), capture=True, token=token)
    assert result["stopped"] and result["count"] == 6
    assert result["values"] == list(range(6)) and not result["errors"]


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
        "__import__('sys')._getframe().f_globals.setdefault('first', x)",
        "vars().setdefault('x', x)",
    ],
)
def test_each_item_sees_its_own_names(source: str) -> None:
    # However the cell runs, nothing an item binds is seen by the next: each item's names,
    # lambda and generator are its own, and what one writes to its globals the next does not see.
    values = run_items(context(source), range(5), list(range(5)), capture=True)["values"]
    if source.startswith(("lambda", "(x for")):
        values = [v() if callable(v) else next(v) for v in values]
    assert values == [x + 1 if "+ 1" in source else x for x in range(5)]


def test_seeded_items_keep_their_own_seeds() -> None:
    ctx = context("seed", seed=7)
    fn = context("x", kind="function", fn=lambda x, seed: seed, seed=7)
    seeds = run_items(ctx, range(3), [0, 1, 2], capture=True)["values"]
    assert seeds == run_items(fn, range(3), [0, 1, 2], capture=True)["values"] and len(set(seeds)) == 3


def test_a_cell_loop_runs_c_code_that_imports() -> None:
    # C code that imports (pickle's class lookup, numpy's lazy imports) reads `__builtins__`
    # from the running frame's globals; a one-expression cell's are the captured namespace.
    ctx = context("loads(x)", {"loads": pickle.loads})
    blob = pickle.dumps(collections.OrderedDict(a=1))
    result = run_items(ctx, range(3), [blob] * 3, capture=True)
    assert not result["errors"] and result["values"] == [collections.OrderedDict(a=1)] * 3


def test_a_cell_run_again_points_at_its_own_run() -> None:
    # The same source run twice: a traceback shows the cell of the run it came from, down to
    # the comprehension's frame.
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


def test_a_thread_counts_its_wait_between_batches_of_one_run_only() -> None:
    # Each batch says how long its thread waited since its last batch of the same run
    # (``idle``, for the batch sizing), never across runs or threads.
    cell = Cell.parse("x", filename="<test-idle>")
    spec = {"kind": "cell", "mode": "over", "names": ("x",), "target": "x", "unpacks": False, "seed": None,
            "large": [], "modules": {}, "values": {}, "filename": cell.filename, "source": cell.source,
            "body": None, "last": marshal.dumps(cell.last)}  # fmt: skip
    context, batch = ("test-idle", cloudpickle.dumps(spec)), pickle.dumps(([0], [0], None))

    def idle(token: str | None) -> float | None:
        return cloudpickle.loads(worker.run_batch(context, batch, token)).get("idle")

    def in_thread(*tokens: str | None) -> list[float | None]:
        got: list[float | None] = []
        t = threading.Thread(target=lambda: got.extend(idle(token) for token in tokens))
        t.start()
        t.join()
        return got

    first, again, other, unnamed = in_thread("run-a", "run-a", "run-b", None)
    assert first is None and other is None and unnamed is None
    assert again is not None and 0 <= again < 5
    assert in_thread("run-a") == [None]  # another thread has its own
