"""The runs' reused threads (`nbcluster._threads`): no cluster needed."""

from __future__ import annotations

import asyncio
import threading
import weakref

import pytest

from nbcluster import _threads as threads


@pytest.fixture
def spares() -> threads.Spares:
    """Spare threads of the test's own: the suite's runs keep theirs apart."""
    return threads.Spares()


def _seen(into: list) -> threading.Thread:
    into.append((threading.current_thread(), threading.current_thread().name))
    return threading.current_thread()


def test_a_thread_that_finished_its_call_runs_the_next_one_under_its_name(spares: threads.Spares) -> None:
    seen: list = []
    assert spares.spawn(_seen, seen, name="nbcluster-test-first").wait(10)
    assert spares.spawn(_seen, seen, name="nbcluster-test-second").wait(10)
    (first, first_name), (second, second_name) = seen
    # The first call's thread ran the second, and waits again as a spare, a daemon.
    assert second is first and second.name == threads.SPARE and second.daemon
    assert (first_name, second_name) == ("nbcluster-test-first", "nbcluster-test-second")


def test_calls_at_once_each_get_a_thread(spares: threads.Spares) -> None:
    release, both = threading.Event(), threading.Barrier(3)

    def hold() -> None:
        both.wait(10)  # the two calls are running at the same time
        release.wait(10)

    done = [spares.spawn(hold, name=f"nbcluster-test-{k}") for k in range(2)]
    both.wait(10)
    release.set()
    assert all(d.wait(10) for d in done)


def test_a_call_that_raises_is_printed_and_its_thread_goes_on(spares: threads.Spares, capfd: pytest.CaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("an nbcluster bug")

    assert spares.spawn(broken, name="nbcluster-test-broken").wait(10)
    seen: list = []
    assert spares.spawn(_seen, seen, name="nbcluster-test-after").wait(10)
    assert "RuntimeError: an nbcluster bug" in capfd.readouterr().err
    assert seen and seen[0][0].is_alive()


def test_a_spare_thread_ends_once_no_call_came_for_a_while() -> None:
    spares = threads.Spares(idle=0.05)
    seen: list = []
    assert spares.spawn(_seen, seen, name="nbcluster-test-idle").wait(10)
    thread = seen[0][0]
    thread.join(10)
    assert not thread.is_alive()
    # The next call is not handed to the ended thread: a new one runs it.
    assert spares.spawn(_seen, seen, name="nbcluster-test-after-idle").wait(10)
    assert seen[1][0] is not thread and seen[1][1] == "nbcluster-test-after-idle"


class _Token:
    """Something a call is given, whose lifetime the test watches."""


def test_a_waiting_thread_keeps_nothing_of_the_calls_it_ran(spares: threads.Spares) -> None:
    # A run's driver is its engine's method: a thread that kept it would keep the run's
    # results, and a --persist run's values on the workers, past `del`.
    for attempt in ("a new thread", "a spare one"):
        token = _Token()
        gone = weakref.ref(token)
        assert spares.spawn(_seen, [token], name="nbcluster-test-keep").wait(10), attempt
        del token
        assert gone() is None, attempt


def test_a_later_call_runs_when_due_and_a_cancelled_one_never(spares: threads.Spares) -> None:
    seen: list = []
    kept = _Token()
    gone = weakref.ref(kept)
    dropped = spares.later(0.05, _seen, [kept], name="nbcluster-test-dropped")
    due = spares.later(0.1, _seen, seen, name="nbcluster-test-due")
    assert dropped.cancel() and dropped.finished.is_set()
    del kept
    assert gone() is None  # a cancelled call lets go of its arguments at once
    assert due.finished.wait(10)
    assert [name for _, name in seen] == ["nbcluster-test-due"]
    assert not due.cancel()  # it ran: too late to cancel


def test_in_thread_returns_what_the_call_returned_and_raises_what_it_raised() -> None:
    async def both() -> int:
        with pytest.raises(ZeroDivisionError):
            await threads.in_thread(lambda: 1 / 0)
        return await threads.in_thread(lambda a, b=0: a + b, 2, b=5)

    assert asyncio.run(both()) == 7
