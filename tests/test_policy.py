"""The scheduling policy, driven by its events alone: no cluster, no thread (`run/policy.py`).

The worked example in the module's docstring runs in `test_docstring_examples.py`.
"""

from __future__ import annotations

import heapq

import pytest

from nbcluster.run.policy import PROBE_ITEMS, Batcher, Policy


def test_never_more_batches_out_than_in_flight_per_thread() -> None:
    policy = Policy(range(1000), Batcher(3, fixed=10), per_thread=2)
    out = len(policy.top_up(out=0))
    assert out == 6
    assert policy.top_up(out=out) == []
    assert len(policy.top_up(out=out - 2)) == 2  # two came back: two go out


def test_a_worker_that_joins_gets_batches_at_once_and_one_that_leaves_shrinks_the_limit() -> None:
    policy = Policy(range(1000), Batcher(1, fixed=10), per_thread=2)
    assert len(policy.top_up(out=0)) == 2
    policy.resize(2)
    assert len(policy.top_up(out=2)) == 2
    policy.resize(1)
    assert policy.top_up(out=3) == []


def test_a_share_waits_behind_the_first_item_for_the_thread_that_ran_it() -> None:
    # Dask may put both probes on one worker: the first item's worker then finds the kept
    # share, sized from the first item's time, as soon as that item is back.
    policy = Policy(range(64), Batcher(2), per_thread=2)
    assert policy.top_up(out=0) == [range(0, 1), range(1, 22), range(22, 43)]
    assert policy.top_up(out=3) == [] and policy.held() == 21  # a free slot, but the share waits
    policy.finished(range(0, 1), reached=1, seconds=0.005)
    assert policy.top_up(out=2) == [range(43, 49), range(49, 53)]  # a share of the 4 batches out each


def test_the_kept_share_never_leaves_nothing_out() -> None:
    # Every batch of the first top-up came back unrun: the next top-up still sends work (the
    # first item alone again), so a run never waits with nothing out.
    policy = Policy(range(64), Batcher(2), per_thread=2)
    for batch in reversed(policy.top_up(out=0)):  # each goes back in front
        policy.finished(batch, reached=0)
    assert policy.top_up(out=0) == [range(0, 1)]


def test_a_failed_item_runs_again_while_it_has_attempts_then_is_delivered() -> None:
    policy = Policy([7], Batcher(1), retries=2)
    for attempt in range(2):
        (batch,) = policy.top_up(out=0)
        assert list(batch) == [7], attempt
        assert policy.finished(batch, reached=1, failed=[0]) == [7]  # held back from delivery
    (batch,) = policy.top_up(out=0)
    assert policy.finished(batch, reached=1, failed=[0]) == []  # out of attempts: delivered failed
    assert policy.top_up(out=0) == [] and policy.held() == 0


def test_items_a_batch_did_not_reach_go_back_in_front_in_order() -> None:
    policy = Policy(range(10), Batcher(1, fixed=4), per_thread=1)
    (first,) = policy.top_up(out=0)
    assert list(first) == [0, 1, 2, 3]
    assert policy.finished(first, reached=1, seconds=0.3) == []
    (again,) = policy.top_up(out=0)
    assert list(again) == [1, 2, 3, 4]


def test_a_killed_batch_is_halved_until_its_culprit_is_found_alone() -> None:
    policy = Policy(range(8), Batcher(1, fixed=8), per_thread=1)
    culprit, failed, runs = 5, [], 0
    (batch,) = policy.top_up(out=0)
    pending = [batch]
    while pending:
        batch = pending.pop()
        runs += 1
        if culprit in batch:
            failed += policy.killed(batch, alone=runs > 1)
        else:
            assert policy.finished(batch, reached=len(batch)) == []
        assert policy.top_up(out=1) == []  # a suspect never runs beside another batch
        pending += policy.top_up(out=0)
    assert failed == [culprit]
    assert runs <= 1 + 2 * 3  # halved each time: log2(8) rounds of two suspects


def test_a_batch_killed_beside_others_proves_nothing_even_of_one_item() -> None:
    policy = Policy([3], Batcher(1))
    (batch,) = policy.top_up(out=0)
    assert policy.killed(batch, alone=False) == []  # it becomes a suspect
    assert policy.top_up(out=0) == [[3]]
    assert policy.killed([3], alone=True) == [3]


def test_a_batch_back_unrun_goes_back_in_front_and_the_next_batch_is_one_item_alone() -> None:
    batcher = Batcher(2)
    batcher.alone_first = False  # a direct first batch sends its first item ahead instead
    policy = Policy(range(100), batcher, per_thread=1)
    first, _ = policy.top_up(out=0)
    policy.finished(first, reached=0)  # no item time measured yet: the first result must still come at once
    assert list(policy.top_up(out=1)[0]) == [0]


def test_a_million_item_backlog_stays_a_few_ranges() -> None:
    policy = Policy(range(1_000_000), Batcher(2, probe_items=None), per_thread=2)
    batches = policy.top_up(out=0)
    assert all(isinstance(b, range) for b in batches)
    kept = policy.held()  # the share kept behind the first item: one range too
    assert kept == 333_333
    policy.finished([5, 6, 7, 9], reached=0)  # consecutive items put back go out as a range, in front
    assert policy.held() == 4 + kept
    policy.finished(range(0, 1), reached=1, seconds=1.0)  # items of a second: a batch of one
    assert policy.top_up(out=2) == [range(5, 6), range(6, 7)]


def test_drain_gives_the_suspects_then_the_backlog() -> None:
    policy = Policy(range(6), Batcher(1, fixed=2), per_thread=1)
    (batch,) = policy.top_up(out=0)
    policy.killed(batch, alone=False)
    assert policy.drain() == [0, 1, 2, 3, 4, 5]
    assert policy.top_up(out=0) == [] and policy.held() == 0


def test_a_range_of_tiny_items_goes_out_in_one_round_of_probes() -> None:
    # A range's items cost nothing to send (the engine gives it no probe cap): with the first
    # item sent ahead by a direct batch, one probe per thread takes every item; sent alone
    # first, one share waits behind it for a batch to come back. A list's probes are capped.
    n = 50 * PROBE_ITEMS
    direct = Batcher(2, probe_items=None)
    direct.alone_first = False
    assert [len(b) for b in Policy(range(n), direct).top_up(out=0)] == [n // 2, n // 2]
    alone = Policy(range(n), Batcher(2, probe_items=None)).top_up(out=0)
    assert [len(b) for b in alone] == [1, 166_667, 166_666]  # a third each; the last third waits
    capped = Policy(list(range(n)), Batcher(2)).top_up(out=0)
    assert [len(b) for b in capped] == [1, PROBE_ITEMS, PROBE_ITEMS]


def test_batches_grow_when_their_threads_waited_for_them() -> None:
    # Each batch says how long its thread waited for it (`worker.run_batch`'s ``idle``); when a round
    # trip costs more than a batch works, fewer, bigger batches are the cure.
    def sizes(idle: float) -> list[int]:
        policy = Policy(range(100_000), Batcher(4, fixed=None), per_thread=1)
        (first,) = policy.top_up(out=0)[:1]
        policy.finished(first, reached=1, seconds=0.001, idle=None)
        for _ in range(4):
            policy.finished([], reached=0, seconds=0.0, idle=idle)
        return [len(b) for b in policy.top_up(out=0)]

    assert max(sizes(0.0)) == 250  # 0.25 s of 1 ms items
    assert min(sizes(2.0)) == 2000  # 2 s of work: as long as the threads waited


def test_a_wait_for_each_batch_is_a_small_share_of_the_batch() -> None:
    # A direct batch is one a thread: its thread waits a round trip (2-3 ms on a busy 2-core
    # machine) for each next one. Batches of 50 ms lost 5% of the thread to those waits;
    # they now carry fifty times the wait, up to `max_batch`. 400 items of 1 ms left on one
    # thread: a quarter of them is 100 ms, the floor where the wait asks for less.
    def size(idle: float) -> int:
        batcher = Batcher(1)
        batcher.observe(10, 0.010)
        for _ in range(4):
            batcher.observe(0, 0.0, idle=idle)
        return batcher.next_size(400)

    assert size(0.0002) == 100  # a quarter of what is left; the 50 ms floor is below it
    assert size(0.0025) == 125  # 125 ms: the wait is 2% of the batch
    assert size(0.010) == 250  # at most `max_batch` (a wait past it is `least`'s, above)


def _threads_run_dry(policy: Policy, threads: int, item: float) -> list[float]:
    """When each thread runs dry: items of `item` seconds, each new batch queued on the thread
    with the fewest batches out (the one that ran dry first among them), as direct batches are."""
    dry, out, running, now = [0.0] * threads, [0] * threads, [], 0.0
    while True:
        for batch in policy.top_up(out=sum(out)):
            t = min(range(threads), key=lambda k: (out[k], dry[k]))
            budget = policy.batcher.budget  # a probe returns after the first item past it
            reached = len(batch) if budget is None else min(len(batch), int(budget / item) + 1)
            dry[t], out[t] = max(now, dry[t]) + reached * item, out[t] + 1
            heapq.heappush(running, (dry[t], t, list(batch), reached))
        if not running:
            return dry
        now, t, batch, reached = heapq.heappop(running)
        out[t] -= 1
        policy.finished(batch, reached=reached, seconds=reached * item)


@pytest.mark.parametrize("items", [64, 256])
def test_the_threads_run_dry_together_at_the_end_of_a_run(items: int) -> None:
    # A batch queued behind a thread's running one cannot move to a thread that ran dry, so
    # the tail's batches shrink with what is left. Sized as a thread's share of it, one
    # worker ran dry 20 ms before the other in bench/simulation.py --timeline (CartPole items
    # of 4-5 ms, 64 of them: one core idle for an eighth of the run).
    policy = Policy(range(items), Batcher(2), per_thread=2)
    policy.batcher.alone_first = False  # direct batches: the first item goes ahead of its batch
    dry = _threads_run_dry(policy, threads=2, item=0.005)
    assert max(dry) - min(dry) <= 0.005, dry  # an item apart at most
