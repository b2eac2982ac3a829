"""What a new user meets in `Results` and the messages around it (issue 21, defects 7 and 9)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from distributed import Event

from nbcluster.errors import BadArgument, Interrupted, NbclusterError
from nbcluster.run.api import distribute
from nbcluster.run.results import NotReady

STOPS_AT_1 = "if x == 1:\n    raise KeyboardInterrupt\nx"


def interrupted(ns: dict[str, Any]) -> Any:
    # Ctrl-C in item 1 of a kernel run: item 0 done, 1-3 cancelled (no cluster needed).
    with pytest.raises(Interrupted):
        distribute(STOPS_AT_1, namespace=ns, over="x in range(4)", local="all", into="res")
    return ns["res"]


def test_iterating_an_interrupted_run_says_in_one_line_to_use_values() -> None:
    res = interrupted({})
    with pytest.raises(NotReady) as info:
        list(res)
    message = str(info.value)
    assert message == (
        "the run was interrupted (1/4 done, 3 cancelled): .values() lists every value, with None "
        "for the missing ones; .retry() runs what is missing"
    )
    assert info.value._render_traceback_() == [f"NotReady: {message}"]  # IPython shows that line alone
    assert res.values() == [0, None, None, None]
    assert [v for v in res.values(missing=...) if v is not ...] == [0]


def test_a_finished_run_iterates_like_a_list() -> None:
    ns: dict[str, Any] = {}
    res = distribute("x", namespace=ns, over="x in range(3)", local="all", into="res")
    assert list(res) == [0, 1, 2]  # a finished run iterates as a list does


def test_iterating_a_run_with_a_failed_item_raises_its_error_there(cluster: Any, capsys: Any) -> None:
    res = distribute("10 // x", namespace={}, over="x in [5, 0, 2]")
    seen = []
    with pytest.raises(ZeroDivisionError):
        seen.extend(res)  # not a None in its place: the loop stops at the failed item, with its own error
    assert seen == [2]
    errors = res.to_pandas()["error"]
    assert errors.isna().tolist() == [True, False, True] and errors[1] == f"ZeroDivisionError: {res.errors[0].message}"


def test_printed_output_of_a_run_without_into_points_at_underscore(cluster: Any, capsys: Any) -> None:
    distribute("print('hello', x)\nx", namespace={}, over="x in range(8)")
    out = capsys.readouterr().out
    assert "── … and 3 more items printed output: `_.output(i)` right after the cell shows item i's ──" in out
    assert "results.output" not in out


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("a=[1, 2], b=3", "--grid: b is not iterable (it is an int)"),
        ("a=[1, 2], b=0.5", "--grid: b is not iterable (it is a float)"),
    ],
)
def test_a_value_that_is_not_iterable_is_named_with_its_article(grid: str, message: str) -> None:
    with pytest.raises(BadArgument) as info:
        distribute("a", namespace={}, grid=grid, local="all")
    assert str(info.value) == message


def test_the_results_table_shows_the_whole_unpicklable_result_message(cluster: Any) -> None:
    res = distribute("import threading\nthreading.Lock()", namespace={}, over="x in range(2)")
    [first, _] = res.errors
    assert first.message.endswith("cannot pickle '_thread.lock' object"), first.message
    table = res._repr_html_()
    assert "cannot pickle &#x27;_thread.lock&#x27; object</td>" in table, table
    assert f"{first.type_name}: {first.message}" in repr(res)


def test_an_items_output_keeps_64k_characters_per_stream(cluster: Any, capsys: Any) -> None:
    # The documented cap (docs/user-guide/distribute.md, "Output, errors, interrupting"):
    # each stream of an item keeps its first 65,536 characters, then says it was cut.
    cell = "import sys\nprint('o' * 70_000)\nprint('e' * 70_000, file=sys.stderr)\nx"
    res = distribute(cell, namespace={}, over="x in range(1)", into="res")
    capsys.readouterr()
    shown = res.output(0)
    for char, cut in (("o", "\n... (output truncated)\n"), ("e", "\n[stderr] ... (output truncated)\n")):
        assert char * 65_536 + cut in shown and char * 65_537 not in shown, f"{char}: not cut at 64K, or not said"


def test_a_retry_prints_what_the_retried_items_print_this_time(cluster: Any, capsys: Any, tmp_path: Any) -> None:
    # Item 1 prints, then fails until a file exists; its retry's output is what the retry's cell shows.
    flag = tmp_path / "ready"
    cell = f"import os\nprint('try', x, os.path.exists({str(flag)!r}))\nassert x != 1 or os.path.exists({str(flag)!r})\nx"
    res = distribute(cell, namespace={}, over="x in range(3)", into="res")
    assert res.counts()["failed"] == 1 and "── item 1 (x=1) ──\ntry 1 False\n" in capsys.readouterr().out
    flag.touch()
    res.retry()
    assert res.values() == [0, 1, 2]
    out = capsys.readouterr().out
    assert "── item 1 (x=1) ──\ntry 1 True\n" in out, out
    assert "try 0" not in out and "try 2" not in out, out  # the items kept are not printed again


def test_listeners_hear_the_run_until_they_leave_and_a_retry_waits_for_its_end(cluster: Any, capsys: Any) -> None:
    # Item 0 fails at once; items 1 and 2 wait on a Dask event, so the run is going while we look.
    gate = f"gate-{uuid.uuid4().hex}"
    cell = f"from distributed import Event\nassert x, 'item 0 fails'\nEvent({gate!r}).wait(60)\nx"
    res = distribute(cell, namespace={}, over="x in range(3)", batch=1, wait=False)
    left: list[bool] = []
    heard: list[bool] = []
    done: list[Any] = []
    finished = threading.Event()  # done callbacks run after the waiters are woken: wait for them
    res.subscribe(lambda r: left.append(r.done))()  # unsubscribed at once: never called
    res.subscribe(lambda r: heard.append(r.done))
    res.subscribe(lambda r: 1 / 0)  # a failing listener is printed and stops nothing
    res.add_done_callback(lambda r: (done.append(r.values()), finished.set()))
    with pytest.raises(NbclusterError, match=r"^the run is still going: wait for it"):
        res.retry()  # one start at a time: item 0 has failed, but the run has not ended
    Event(gate, client=cluster.client).set()
    assert finished.wait(60) and res.values() == [None, 1, 2] and [e.index for e in res.errors] == [0]
    assert left == [] and heard[-1] is True and done == [[None, 1, 2]]
    assert "nbcluster: a Results listener failed" in capsys.readouterr().err
    res.subscribe(lambda r: left.append(r.done))  # a finished run changes no more: not called
    res.add_done_callback(lambda r: done.append("at once"))
    assert left == [] and done[-1] == "at once"
