"""The runs' reused threads (`nbcluster._threads`): no cluster needed."""

from __future__ import annotations

import threading
import weakref

import pytest

from nbcluster import _threads as threads


@pytest.fixture
def spares(monkeypatch: pytest.MonkeyPatch) -> list:
    """A list of spare threads of the test's own: the suite's runs keep theirs apart."""
    mine: list = []
    monkeypatch.setattr(threads, "_idle", mine)
    return mine


def _seen(into: list) -> threading.Thread:
    into.append((threading.current_thread(), threading.current_thread().name))
    return threading.current_thread()


def test_a_thread_that_finished_its_call_runs_the_next_one_under_its_name(spares: list) -> None:
    seen: list = []
    assert threads.spawn(_seen, seen, name="nbcluster-test-first").wait(10)
    there = set(threading.enumerate())
    assert threads.spawn(_seen, seen, name="nbcluster-test-second").wait(10)
    (_, first_name), (second, second_name) = seen
    # A spare ran the second call, not a new thread: usually the first call's, but an earlier
    # test's run may have left its own spare in the list a moment later (the newest is taken).
    assert second in there and second.name == threads.SPARE and second.daemon
    assert (first_name, second_name) == ("nbcluster-test-first", "nbcluster-test-second")


def test_calls_at_once_each_get_a_thread(spares: list) -> None:
    release, both = threading.Event(), threading.Barrier(3)

    def hold() -> None:
        both.wait(10)  # the two calls are running at the same time
        release.wait(10)

    done = [threads.spawn(hold, name=f"nbcluster-test-{k}") for k in range(2)]
    both.wait(10)
    release.set()
    assert all(d.wait(10) for d in done)


def test_a_call_that_raises_is_printed_and_its_thread_goes_on(spares: list, capfd: pytest.CaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("an nbcluster bug")

    assert threads.spawn(broken, name="nbcluster-test-broken").wait(10)
    seen: list = []
    assert threads.spawn(_seen, seen, name="nbcluster-test-after").wait(10)
    assert "RuntimeError: an nbcluster bug" in capfd.readouterr().err
    assert seen and seen[0][0].is_alive()


def test_a_spare_thread_ends_once_no_call_came_for_a_while(spares: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "IDLE_S", 0.05)
    seen: list = []
    assert threads.spawn(_seen, seen, name="nbcluster-test-idle").wait(10)
    (thread, _), = seen
    thread.join(10)
    assert not thread.is_alive() and spares == []


class _Token:
    """Something a call is given, whose lifetime the test watches."""


def test_a_waiting_thread_keeps_nothing_of_the_calls_it_ran(spares: list) -> None:
    # A run's driver is its engine's method: a thread that kept it would keep the run's
    # results, and a --persist run's values on the workers, past `del`.
    for attempt in ("a new thread", "a spare one"):
        token = _Token()
        gone = weakref.ref(token)
        assert threads.spawn(_seen, [token], name="nbcluster-test-keep").wait(10), attempt
        del token
        assert gone() is None, attempt


def test_a_later_call_runs_when_due_and_a_cancelled_one_never(spares: list) -> None:
    seen: list = []
    kept = _Token()
    gone = weakref.ref(kept)
    dropped = threads.later(0.05, _seen, [kept], name="nbcluster-test-dropped")
    due = threads.later(0.1, _seen, seen, name="nbcluster-test-due")
    assert dropped.cancel() and dropped.finished.is_set()
    del kept
    assert gone() is None  # a cancelled call lets go of its arguments at once
    assert due.finished.wait(10)
    assert [name for _, name in seen] == ["nbcluster-test-due"]
    assert not due.cancel()  # it ran: too late to cancel
