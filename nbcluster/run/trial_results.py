"""What `Results` adds for a trial run (``trials.py``): `metrics`, `best`, `states`, `stop`.

A mixin, so that ``results.py`` stays the view of every run; it reads the run's `Trials`
(None for a run that is not a trial run) and its `RunState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from nbcluster.errors import BadArgument
from nbcluster.run.state import CANCELLED, DONE, FAILED, RunState

if TYPE_CHECKING:
    from nbcluster.run.cell import Plan
    from nbcluster.run.trials import Trials

_STATUS = {DONE: "done", FAILED: "failed", CANCELLED: "cancelled"}


class Best(NamedTuple):
    """The best trial: `Results.best`'s answer."""

    item: int
    params: dict[str, Any]
    value: float  # its objective's value (last reported, else its result's)
    step: int | None  # the step of its last report, None if it reported none
    metrics: dict[str, float]  # its last reported metrics
    state: str  # done, stopped, timed out, ...


class TrialResults:
    """`Results`' trial verbs; see the module docstring."""

    __slots__ = ()
    _state: RunState
    _plan: Plan
    _trials: Trials | None

    def _trial(self) -> Trials:
        if self._trials is None:
            raise BadArgument(
                "this run is not a trial run: call nbcluster.report(...) in the item, or give --objective"
            )
        return self._trials

    @property
    def metrics(self) -> Any:
        """Every report of the run, as a pandas DataFrame.

        One row per report: ``item``, the item's parameters, ``step``, one column per metric
        (empty where a report did not name it) and ``time`` (seconds since the epoch, on the
        worker). Filled in while the run goes on.

        Raises
        ------
        nbcluster.errors.BadArgument
            For a run whose items do not report (no `nbcluster.report` in its code).
        """
        return self._trial().frame()

    @property
    def states(self) -> list[str]:
        """Each item's state: done, stopped, timed out, failed, cancelled or running."""
        trials = self._trial()
        state = self._state
        with state.lock:
            out = []
            for i, s in enumerate(state.status):
                value = state.values[i] if s == DONE else None
                error = state.errors.get(i)
                out.append(trials.state(i, _STATUS.get(s, "running"), value, error.type_name if error else None))
        return out

    def best(self) -> Best:
        """The best trial by the run's objective (``--objective NAME:min|max``).

        A trial's value is its last report of the objective; a trial that reported none is
        ranked by its result (a number, or a dict's entry of that name). Stopped trials take
        part, with the value they were stopped at.

        Returns
        -------
        Best
            ``item``, ``params``, ``value``, ``step``, ``metrics``, ``state``.

        Without an objective nothing is ranked, in the live table either (it keeps item
        order): a run does not guess which way is better.

        Raises
        ------
        nbcluster.errors.BadArgument
            Without an objective (any run, a trial run or not), or when no trial has a value for it (naming the metrics
            that were reported).
        """
        trials = self._trials
        if trials is None or (objective := trials.rules.objective) is None:
            # Never a guess at the direction: a loss is best low, an accuracy high.
            raise BadArgument(
                "best() needs an objective, to know whether larger or smaller is better: "
                "give --objective NAME:min|max (objective= in Python)"
            )
        states = self.states
        state = self._state
        scored = []
        for i in range(len(state)):
            value = trials.objective_value(i, state.values[i] if state.status[i] == DONE else None)
            if value is not None and value == value:  # nan ranks nowhere
                scored.append((objective.score(value), i, value))
        if not scored:
            raise BadArgument(trials.unknown_objective() or f"no trial has a value for {objective.name} yet")
        _, i, value = max(scored)
        step, metrics = trials.reports.last.get(i, (None, {}))
        return Best(i, self._plan.params(i), value, step, dict(metrics), states[i])

    def stop(self, i: int) -> None:
        """Stop item `i` while it runs: asked at once, forced after ``nbcluster.stop.grace``.

        Its ``should_stop()`` turns True and its next ``report()`` raises `TrialStopped`;
        one that does not end within the grace is interrupted, then its worker restarted.
        It ends *stopped*, keeping its last metrics. An item not started yet stops at its
        first report.

        Parameters
        ----------
        i : int
            The item's index.
        """
        if not 0 <= i < len(self._state):
            raise BadArgument(f"stop({i}): this run has items 0 to {len(self._state) - 1}")
        self._trial().stop(i)
