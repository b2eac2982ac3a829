"""Stoppers without a cluster (``run/stoppers.py``): made-up reports in, decisions out."""

from __future__ import annotations

import pytest

from nbcluster.errors import BadArgument
from nbcluster.run.stoppers import ASHA, Median, Stopper, make


def test_asha_rungs_and_defaults() -> None:
    asha = make("asha")
    assert isinstance(asha, ASHA)
    assert (asha.grace, asha.eta, asha.max_t, asha.rungs) == (1, 3, 27, [1, 3, 9])
    assert make("asha(grace=2, eta=2, max_t=20)").rungs == [2, 4, 8, 16]  # type: ignore[attr-defined]


def test_asha_is_asynchronous_each_trial_judged_as_it_arrives() -> None:
    asha = ASHA(grace=1, eta=3, max_t=27)
    # The first trial at a rung has no one to lose to: it goes on, with no barrier to wait at.
    assert asha.decide(0, 1, 0.2) is False
    # A later, worse one is stopped at once, though most trials have not reported yet.
    assert asha.decide(1, 1, 0.1) is True
    assert asha.decide(2, 1, 0.9) is False  # a better one goes on
    # Reports between rungs are not judged again; the next rung judges afresh.
    assert asha.decide(0, 2, 0.0) is False
    assert asha.decide(2, 3, 0.95) is False
    assert asha.decide(0, 3, 0.3) is True  # below the best 1/3 of rung 3 so far


def test_asha_judges_every_rung_a_jump_in_steps_passes() -> None:
    asha = ASHA(grace=1, eta=3, max_t=27)
    assert asha.decide(0, 1, 1.0) is False
    assert asha.decide(0, 3, 1.0) is False
    assert asha.decide(1, 10, 0.5) is True  # reached rungs 1, 3 and 9 at once: stopped at rung 1


def test_asha_on_a_known_answer_keeps_the_best_trials() -> None:
    asha = ASHA(grace=1, eta=3, max_t=27)
    quality = [0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6, 0.4]
    alive = set(range(9))
    for step in range(1, 28):  # in lockstep here; the rule itself never waits
        for t in sorted(alive):
            if asha.decide(t, step, quality[t] * step):
                alive.discard(t)
    assert 1 in alive  # the best trial always goes on
    assert not alive & {2, 6}  # the two worst never do


def test_median_stops_below_the_median_of_the_others() -> None:
    median = Median(grace=2, min_trials=2)
    for t, s in enumerate([0.5, 0.6]):
        assert median.decide(t, 1, s) is False
        assert median.decide(t, 2, s) is False
    assert median.decide(2, 1, 0.1) is False  # before the grace
    assert median.decide(2, 2, 0.1) is True
    assert median.decide(3, 2, 0.9) is False


@pytest.mark.parametrize("stopper", [ASHA(grace=1, eta=3, max_t=27), Median(grace=1, min_trials=1)], ids=repr)
def test_a_score_that_is_not_a_number_is_never_judged(stopper: ASHA | Median) -> None:
    # A NaN (a diverged loss) neither stops its trial nor enters the records others are judged by.
    assert stopper.decide(0, 1, 0.5) is False
    assert stopper.decide(1, 1, float("nan")) is False
    assert stopper.decide(2, 1, 0.9) is False
    assert stopper.decide(1, 1, 0.1) is True  # judged once it reports a number


def test_a_user_stopper_is_taken_as_it_is() -> None:
    class Floor:
        def decide(self, trial: int, step: int, score: float) -> bool:
            return score < 0

    floor = Floor()
    assert isinstance(floor, Stopper) and make(floor) is floor  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("hyperband", "unknown policy 'hyperband'; use asha or median"),
        ("asha(rungs=3)", "unknown parameter in 'asha(rungs=3)'; it takes grace, eta, max_t"),
        ("asha(eta=1)", "eta=...) needs a number above 1"),
        ("asha(grace=0)", "grace=...) needs a whole number of 1 or more"),
        ("asha(max_t=1)", "max_t=...) needs a whole number above grace"),
        ("median(grace=x)", "parameters are name=number"),
        ("asha(", "cannot read 'asha('"),
        ("median(min_trials=0)", "min_trials=...) needs a whole number"),
    ],
)
def test_bad_stoppers_are_one_line(text: str, said: str) -> None:
    with pytest.raises(BadArgument, match=None) as caught:
        make(text)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(BadArgument, match="stopper= needs"):
        make(3)  # type: ignore[arg-type]
