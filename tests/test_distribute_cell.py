"""Cell analysis (free names, last expression, line numbers) and item plans; no cluster needed."""

from __future__ import annotations

import io

import pytest

from nbcluster.errors import BadArgument
from nbcluster.run.api import distribute
from nbcluster.run.capture import LARGE, Capture, capture
from nbcluster.run.cell import Cell, mentions_trials, plan
from nbcluster.run.policy import PROBE_ITEMS, PROBE_S, Batcher


def free(source: str, bound: tuple[str, ...] = ()) -> set[str]:
    return set(Cell.parse(source, filename="<t>").free_names(bound))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("y = z * 2\ny", {"z"}),
        ("total = total + z", {"total", "z"}),  # read before the cell binds it
        ("acc += 1", {"acc"}),
        ("import numpy as np\nnp.sum(a)", {"a"}),
        ("def f(v):\n    return v * w\nf(3)", {"w"}),  # global read inside a function
        ("def f():\n    return g()\ndef g():\n    return 1\nf()", set()),  # defined later in the cell
        ("[i * k for i in range(n) if i > t]", {"range", "n", "k", "t"}),
        ("sum(u * i for i in xs)", {"sum", "u", "xs"}),
        ("class A:\n    k = 1\n    def m(self):\n        return k\nA", {"k"}),  # methods skip class scope
        ("(m := 5) + m", set()),
        ("try:\n    pass\nexcept E as e:\n    e", {"E"}),
        ("for i in range(3):\n    acc = i\nacc", {"range"}),
        ("lambda a: a + b", {"b"}),
        ("x", set()),  # x is bound by --over
    ],
)
def test_free_names_follow_python_scoping(source: str, expected: set[str]) -> None:
    assert free(source, bound=("x",)) - {"print"} == expected


def test_last_expression_is_the_value_and_lines_match_the_notebook() -> None:
    cell = Cell.parse("a = 1\na + 1", filename="<t1>", first_line=2)
    assert cell.last is not None
    assert cell.free_names() == {}
    ns: dict = {}
    exec(cell.body, ns)
    assert eval(cell.last, ns) == 2
    with pytest.raises(BadArgument, match=r"syntax error at cell line 3: .*: x = = 1"):
        Cell.parse("a = 1\nx = = 1", filename="<t2>", first_line=2)


def test_ipython_syntax_and_empty_cells_are_explained() -> None:
    with pytest.raises(BadArgument, match="IPython magics and shell commands cannot run on a worker"):
        Cell.parse("%time x", filename="<t3>", first_line=2)
    with pytest.raises(BadArgument, match="the cell is empty"):
        Cell.parse("# only a comment\n", filename="<t4>")


def test_capture_names_unknown_and_unpicklable_variables() -> None:
    import threading

    with pytest.raises(BadArgument, match=r"`y` \(cell line 3\) is not defined in the notebook"):
        capture(Cell.parse("a = 1\nb = y", filename="<t5>", first_line=2).free_names(), {})
    with pytest.raises(BadArgument, match=r"`lock` cannot be sent to the workers: TypeError: cannot pickle"):
        capture({"lock": 2}, {"lock": threading.Lock()})
    # cloudpickle would copy a read-mode file's contents: the file itself cannot travel.
    with open(__file__) as f, pytest.raises(BadArgument, match=r"`f` is an open file .* open it inside the cell"):
        capture({"f": 2}, {"f": f})
    assert capture({"buffer": 2}, {"buffer": io.BytesIO(b"in memory")}).values.keys() == {"buffer"}  # a value, not a file
    # A name only a function reads is resolved when it runs, as in the kernel.
    assert capture({"later": None}, {}) == Capture()


def test_capture_splits_modules_small_and_large_values() -> None:
    import math

    import numpy as np

    big = np.zeros(LARGE // 8 + 10)
    cap = capture({"math": 1, "k": 1, "big": 1, "len": 1}, {"math": math, "k": 3, "big": big})
    assert cap.modules == {"math": "math"}
    assert list(cap.values) == ["k"]
    value, digest, size = cap.large["big"]
    assert value is big and size > LARGE
    assert capture({"big": 1}, {"big": big.copy()}).large["big"][1] == digest  # same content, same digest
    big[0] = 1
    assert capture({"big": 1}, {"big": big}).large["big"][1] != digest


def evaluate(ns: dict):
    return lambda expression, flag: eval(expression, dict(ns))


def test_plans_over_grid_zip() -> None:
    p = plan(over="a, b in pairs", evaluate=evaluate({"pairs": [(1, 2), (3, 4)]}))
    assert p.names == ("a", "b") and p.unpacks and p.params(1) == {"a": 3, "b": 4}
    g = plan(grid="lr=[0.1, 0.01], depth=[3, 5]", evaluate=evaluate({}))
    assert [g.params(i) for i in range(len(g))] == [
        {"lr": 0.1, "depth": 3},
        {"lr": 0.1, "depth": 5},
        {"lr": 0.01, "depth": 3},
        {"lr": 0.01, "depth": 5},
    ]
    z = plan(zip="a=[1, 2], b='xy'", evaluate=evaluate({}))
    assert [z.params(i) for i in range(2)] == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert plan(evaluate=evaluate({})).mode == "once"
    # The target as Python reads it: brackets around a tuple, or around one name, change nothing.
    assert plan(over="(a, b) in pairs", evaluate=evaluate({"pairs": [(1, 2)]})).target == p.target == "(a, b)"
    single = plan(over="(x) in xs", evaluate=evaluate({"xs": [5]}))
    assert single.target == "x" and not single.unpacks and single.params(0) == {"x": 5}


def test_a_nested_over_target_unpacks_as_python_does() -> None:
    # `(a, b), c` is a Python for-target; its brackets are its structure, not decoration.
    nested = plan(over="(a, b), c in [((1, 2), 3)]", evaluate=evaluate({}))
    assert nested.params(0) == {"a": 1, "b": 2, "c": 3}
    assert list(distribute("a + b + c", over="(a, b), c in [((1, 2), 3)]", local=True, namespace={})) == [6]



def test_a_range_stays_a_range() -> None:
    # A million ints are 36 MB as a list, in the kernel and pickled into every batch; a range
    # (and each batch's slice of it) is a few bytes.
    import pickle

    p = plan(over="x in range(10**7)", evaluate=evaluate({}))
    assert isinstance(p.items, range) and len(p) == 10**7 and p.params(10**7 - 1) == {"x": 10**7 - 1}
    assert len(pickle.dumps(p.items[5_000:15_000])) < 100
    assert isinstance(plan(over=range(3), evaluate=evaluate({})).items, range)  # distribute(fn, over=range(3))
    with pytest.raises(BadArgument, match="is empty"):
        plan(over="x in range(0)", evaluate=evaluate({}))

@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"over": "x range(3)"}, "--over needs `NAME in ITERABLE`"),
        ({"over": "x.y in range(3)"}, "--over binds plain names"),
        ({"over": "x in []"}, "--over: [] is empty, so there is nothing to run"),
        ({"over": "x in 5"}, "--over: 5 is not iterable (it is an int)"),
        ({"grid": "lr 0.1"}, "--grid needs NAME=VALUES pairs"),
        ({"grid": "[1, 2]"}, "--grid needs NAME=VALUES pairs"),
        ({"grid": "a=[1], a=[2]"}, "--grid names a parameter twice"),
        ({"grid": "a=[]"}, "--grid: a is empty"),
        ({"zip": "a=[1, 2], b=[1]"}, "--zip needs lists of the same length: a has 2, b has 1"),
    ],
)
def test_plan_mistakes(kwargs: dict, message: str) -> None:
    with pytest.raises(BadArgument) as info:
        plan(evaluate=evaluate({}), **kwargs)
    assert message in str(info.value)


def sizes(batcher: Batcher, n: int, seconds_per_item: float, *, first: int = 0) -> list[int]:
    """The batches of `n` items, each finished (and measured) before the next is sized."""
    out = []
    while n:
        size = batcher.next_size(n)
        out.append(size)
        batcher.observe(size, size * seconds_per_item)
        n -= size
    return out


def test_probes_share_out_the_items_then_batches_take_the_measured_size() -> None:
    # Unmeasured, the first batch is one item (the first result, whatever the others do); one
    # probe per thread takes a share of the rest, with the probe budget: a worker returns after
    # the first item that ends past 50 ms. One share more waits (0) for a batch to come back.
    probe = Batcher(2)
    assert [probe.next_size(n, free) for n, free in ((8, 4), (7, 3), (4, 2), (2, 1))] == [1, 3, 2, 0]
    tiny = Batcher(2)
    shares = [tiny.next_size(n, free) for n, free in ((20_000, 4), (19_999, 3), (13_332, 2), (6_666, 1))]
    assert shares == [1, 6_667, 6_666, 0]
    many = Batcher(2)
    assert many.next_size(10**6, 4) == 1 and many.next_size(10**6 - 1, 3) == PROBE_ITEMS
    whole = Batcher(2, probe_items=None)  # a range's items: a probe per thread takes its share whole
    whole.alone_first = False
    assert [whole.next_size(n, free) for n, free in ((10**6, 4), (500_000, 3))] == [500_000, 500_000]
    few = Batcher(3)
    assert [few.next_size(n, free) for n, free in ((3, 6), (2, 5), (1, 4))] == [1, 1, 1]
    assert probe.budget == PROBE_S == 0.05
    # 400 items of 10 ms on 2 threads: a probe comes back with one item (the first result
    # after ~10 ms), then at most 0.25 s per batch, and ~0.05 s batches at the end.
    measured = Batcher(2)
    measured.observe(1, 0.01)
    got = sizes(measured, 399, 0.01)
    assert got[0] == 25 and sum(got) == 399
    assert max(got) == 25 and got == sorted(got, reverse=True) and got.count(5) >= 4
    # what is left under 0.05 s of work is shared out between the threads, not one batch
    left = [sum(got[i:]) for i in range(len(got))]
    assert all(size <= -(-rest // 2) for size, rest in zip(got, left, strict=True) if rest < 5 * 2), (got, left)
    slow = Batcher(2)
    slow.observe(1, 5.0)
    assert sizes(slow, 3, 5.0) == [1, 1, 1]  # slow items alone
    assert slow.budget == 0.25  # every sized batch returns within a quarter second
    fixed = Batcher(2, fixed=4)
    assert sizes(fixed, 10, 1.0) == [4, 4, 2] and fixed.budget is None  # --batch N as it is


def test_threads_that_wait_for_their_next_batch_get_fewer_bigger_batches() -> None:
    # 100,000 items of 1 ms on 1,000 threads (the scale envelope's run): sized from the items
    # alone, the tail is cut into 5 ms tasks, ~12,000 of them, while a scheduler serving a
    # thousand threads keeps each thread waiting seconds for its next one.
    def tasks(batcher: Batcher, idle: float) -> list[int]:
        batcher.observe(1, 0.001)
        out, n = [], 50_000
        while n:
            out.append(batcher.next_size(n))
            batcher.observe(out[-1], out[-1] * 0.001, idle=idle)
            n -= out[-1]
        return out

    pipelined = tasks(Batcher(1000), 0.001)  # the next batch was there: nothing changes
    assert max(pipelined) == 50 and len(pipelined) > 1000 and Batcher(1000).budget == PROBE_S
    waited = Batcher(1000)
    got = tasks(waited, 2.0)  # each thread waited 2 s for its next batch
    assert min(got[1:-1]) == 2000 and len(got) == 26, got  # 2 s of work each (the last: what is left)
    assert waited.budget == 4.0  # a batch sized so is not cut short by its budget
    # the threads wait less again: batches shrink back
    for _ in range(16):
        waited.observe(50, 0.05, idle=0.0)
    assert waited.budget == 0.25 and waited.next_size(50_000) == 50


def test_a_batch_delivered_twice_keeps_its_first_values_and_counts_once() -> None:
    # Consecutive, fresh items are stored by slices; one already delivered (Dask re-ran the
    # batch after losing a worker) keeps its first value, and the counts add up exactly once.
    from nbcluster.run.state import RunState

    state = RunState(10)
    state.deliver(range(0, 4), [10, 11, 12], {}, {})  # a batch stopped by its budget: 3 of 4
    state.deliver(range(2, 6), [90, 91, 92, 93], {}, {})
    state.deliver([7, 6], [17, 16], {}, {})
    assert list(state.values) == [10, 11, 12, 91, 92, 93, 16, 17, None, None]
    assert state.counts() == {"total": 10, "done": 8, "failed": 0, "cancelled": 0, "running": 2}


def test_the_backlog_gives_its_items_in_order_with_those_put_back_first() -> None:
    from nbcluster.run.policy import _Queue

    queue = _Queue(range(1_000_000))  # held as one range, not a million ints
    assert queue.take(3) == range(3) and len(queue) == 999_997  # consecutive: a range, not a list
    queue.put_back([9, 1, 2])
    assert queue.take(5) == [9, 1, 2, 3, 4]
    rest = _Queue([5, 6, 8, 2])
    assert rest.take(3) == [5, 6, 8] and len(rest) == 1 and list(rest.take(9)) == [2] and len(rest) == 0


def test_a_run_is_a_trial_run_when_its_code_names_report_should_stop_or_checkpoint() -> None:
    def cell(source: str) -> Cell:
        return Cell.parse(source, filename="<trial-cell>")

    assert mentions_trials(cell("nbcluster.report(loss=x)"))
    assert mentions_trials(cell("def step():\n    checkpoint(x)\nstep()"))  # in a function the cell defines
    assert not mentions_trials(cell("# report the loss\nprint('report')\nx"))  # a comment, a string
    assert not mentions_trials(cell("x + 1"))

    def tune(lr: float) -> float:
        if should_stop():  # type: ignore[name-defined]  # noqa: F821
            return 0.0
        return lr

    assert mentions_trials(tune) and not mentions_trials(lambda x: x * 2)
