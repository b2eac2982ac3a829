"""Stoppers: which running trials to stop early, decided in the kernel as reports arrive.

A stopper is anything with the `Stopper` protocol's one method, ``decide(trial, step,
score)``, called for every report of the run's objective metric, in the order the reports
reach the kernel; it returns True to stop that trial. ``score`` is oriented so that larger
is better (the kernel negates a metric minimised: ``--objective loss:min``), so a stopper
never needs to know the direction. Stoppers are pure: no clock, no cluster; the tests
drive them with made-up reports.

Two are built in, named after their papers and Ray Tune's schedulers of the same meaning:

- `ASHA` (asynchronous successive halving; Li et al., 2020). Rungs at ``grace * eta**k``
  steps, below ``max_t``. When a trial first reaches a rung, its score is recorded there,
  and it goes on only if it is within the best ``1/eta`` of the scores recorded at that
  rung *so far*. No barrier: a trial is judged against the trials that got there before
  it, as it arrives, so early trials are promoted generously and none waits for a rung
  to fill. Defaults (``grace=1, eta=3, max_t=27``) suit trials of tens of steps: rungs at
  1, 3 and 9, and about one trial in 27 runs to the end.
- `Median` (the median stopping rule; Golovin et al., 2017, Google Vizier). After
  ``grace`` steps, a trial stops when its best score so far is below the median of the
  other trials' mean scores up to the same step, once at least ``min_trials`` others
  have reached it.

A stopper may also have ``rungs``, a list of steps (`ASHA` has): a trial reporting the
objective at one of them waits for the verdict on that report before it goes on, so a
trial dropped at a rung stops there. Between rungs, and for a stopper without them,
trials never wait; a stop reaches them within about a tenth of a second.

`make` reads ``--stop``'s text: ``asha``, ``median``, ``asha(grace=2, eta=4)``.
"""

from __future__ import annotations

import ast
import math
from typing import Any, Protocol, runtime_checkable

from nbcluster.errors import BadArgument


@runtime_checkable
class Stopper(Protocol):
    """What a stopper implements (no base class needed).

    Examples
    --------
    A stopper that stops every trial whose score drops below 0.1 after step 3:

    >>> class Floor:
    ...     def decide(self, trial: int, step: int, score: float) -> bool:
    ...         return step >= 3 and score < 0.1
    >>> isinstance(Floor(), Stopper)
    True
    """

    def decide(self, trial: int, step: int, score: float) -> bool:
        """Whether to stop `trial`, which just reported `score` at `step`.

        Parameters
        ----------
        trial : int
            The item's index in the run.
        step : int
            The step of the report (1 for the first, unless the item numbers its own).
        score : float
            The objective's value, oriented so that larger is better.

        Returns
        -------
        bool
            True to stop the trial now (it is told; its report raises `TrialStopped`).
        """
        ...


class _Rule:
    """What the built-in stoppers share: a score that is not a number is never judged."""

    def decide(self, trial: int, step: int, score: float) -> bool:
        """`Stopper.decide`, for a built-in rule: a score that is not a number (NaN) is never judged.

        Parameters
        ----------
        trial, step, score
            As `Stopper.decide` takes them.

        Returns
        -------
        bool
            True to stop the trial now; False for NaN.
        """
        return not math.isnan(score) and self._judge(trial, step, score)

    def _judge(self, trial: int, step: int, score: float) -> bool:
        raise NotImplementedError


class ASHA(_Rule):
    """Asynchronous successive halving; see the module docstring.

    Parameters
    ----------
    grace : int, default 1
        The first rung: no trial is stopped before this many steps.
    eta : float, default 3
        The reduction factor: a trial goes on past a rung when it is within the best
        ``1/eta`` of those that reached the rung before it.
    max_t : int, default 27
        The most steps a trial runs; rungs are below it.

    Examples
    --------
    >>> asha = ASHA(grace=1, eta=3, max_t=27)
    >>> asha.rungs
    [1, 3, 9]
    >>> [asha.decide(t, 1, score) for t, score in enumerate([0.5, 0.9, 0.1, 0.95])]
    [False, False, True, False]
    """

    name = "asha"

    def __init__(self, grace: int = 1, eta: float = 3, max_t: int = 27):
        if not _whole(grace) or grace < 1:
            raise BadArgument(f"--stop asha(grace=...) needs a whole number of 1 or more, got {grace!r}")
        if not _number(eta) or eta <= 1:
            raise BadArgument(f"--stop asha(eta=...) needs a number above 1, got {eta!r}")
        if not _whole(max_t) or max_t <= grace:
            raise BadArgument(f"--stop asha(max_t=...) needs a whole number above grace ({grace}), got {max_t!r}")
        self.grace, self.eta, self.max_t = grace, eta, max_t
        self.rungs: list[int] = []
        milestone = float(grace)
        while milestone < max_t:
            self.rungs.append(round(milestone))
            milestone *= eta
        self._recorded: dict[int, list[float]] = {rung: [] for rung in self.rungs}
        self._passed: dict[int, int] = {}  # trial -> rungs it has been judged at

    def _judge(self, trial: int, step: int, score: float) -> bool:
        # At each rung `trial` reaches for the first time.
        judged = self._passed.get(trial, 0)
        stop = False
        while judged < len(self.rungs) and step >= self.rungs[judged]:
            recorded = self._recorded[self.rungs[judged]]
            recorded.append(score)
            judged += 1
            keep = max(1, math.floor(len(recorded) / self.eta))
            cutoff = sorted(recorded, reverse=True)[keep - 1]
            if score < cutoff:
                stop = True
                break
        self._passed[trial] = judged
        return stop

    def __repr__(self) -> str:
        return f"asha(grace={self.grace}, eta={self.eta:g}, max_t={self.max_t})"


class Median(_Rule):
    """The median stopping rule; see the module docstring.

    Parameters
    ----------
    grace : int, default 3
        No trial is stopped before this many steps.
    min_trials : int, default 3
        Others that must have reached the step before a trial is compared with them.

    Examples
    --------
    >>> median = Median(grace=1, min_trials=2)
    >>> [median.decide(t, 1, s) for t, s in enumerate([0.8, 0.7, 0.2])]
    [False, False, True]
    """

    name = "median"

    def __init__(self, grace: int = 3, min_trials: int = 3):
        if not _whole(grace) or grace < 1:
            raise BadArgument(f"--stop median(grace=...) needs a whole number of 1 or more, got {grace!r}")
        if not _whole(min_trials) or min_trials < 1:
            raise BadArgument(f"--stop median(min_trials=...) needs a whole number of 1 or more, got {min_trials!r}")
        self.grace, self.min_trials = grace, min_trials
        self._history: dict[int, list[tuple[int, float]]] = {}

    def _judge(self, trial: int, step: int, score: float) -> bool:
        # `trial`'s best against the others' running means at `step`.
        self._history.setdefault(trial, []).append((step, score))
        if step < self.grace:
            return False
        means = []
        for other, history in self._history.items():
            upto = [s for t, s in history if t <= step and not math.isnan(s)]
            if other != trial and upto and history[-1][0] >= step:
                means.append(sum(upto) / len(upto))
        if len(means) < self.min_trials:
            return False
        best = max(s for _, s in self._history[trial])
        return best < _median(means)

    def __repr__(self) -> str:
        return f"median(grace={self.grace}, min_trials={self.min_trials})"


POLICIES: dict[str, type[ASHA] | type[Median]] = {"asha": ASHA, "median": Median}


def make(spec: str | Stopper | None) -> Stopper | None:
    """The stopper ``--stop`` / ``stopper=`` names: a policy's text, or a `Stopper` as it is.

    Parameters
    ----------
    spec : str, Stopper or None
        ``"asha"``, ``"median"``, or one called with keyword parameters:
        ``"asha(grace=2, eta=4, max_t=50)"``; or an object with a ``decide`` method.

    Returns
    -------
    Stopper or None
        None for None.

    Raises
    ------
    nbcluster.errors.BadArgument
        An unknown policy, or bad parameters, in one line naming what is allowed.

    Examples
    --------
    >>> make("asha(grace=2, eta=2, max_t=16)").rungs
    [2, 4, 8]
    >>> make("hyperband")
    Traceback (most recent call last):
    ...
    nbcluster.errors.BadArgument: --stop: unknown policy 'hyperband'; use asha or median, e.g. --stop "asha(grace=1, eta=3, max_t=27)"
    """
    if spec is None:
        return None
    if not isinstance(spec, str):
        if not isinstance(spec, Stopper):
            raise BadArgument(f"stopper= needs 'asha', 'median' or an object with a decide(trial, step, score) method, got {type(spec).__name__}")
        return spec
    hint = 'use asha or median, e.g. --stop "asha(grace=1, eta=3, max_t=27)"'
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError:
        raise BadArgument(f"--stop: cannot read {spec!r}; {hint}") from None
    name: str | None = None
    params: dict[str, Any] = {}
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        name = node.func.id
        for kw in node.keywords:
            if kw.arg is None or not isinstance(kw.value, ast.Constant):
                raise BadArgument(f"--stop {name}: parameters are name=number, got {ast.unparse(kw)!r}")
            params[kw.arg] = kw.value.value
    if name is None:
        raise BadArgument(f"--stop: cannot read {spec!r}; {hint}")
    policy = POLICIES.get(name.lower())
    if policy is None:
        raise BadArgument(f"--stop: unknown policy {name!r}; {hint}")
    try:
        return policy(**params)
    except TypeError:
        allowed = ", ".join(policy.__init__.__code__.co_varnames[1 : policy.__init__.__code__.co_argcount])
        raise BadArgument(f"--stop {name}: unknown parameter in {spec!r}; it takes {allowed}") from None


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
