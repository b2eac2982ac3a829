"""`LiveOptions`: what a live view shows and how often, with Dask config defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from nbcluster import config
from nbcluster._wire import TaskRecord
from nbcluster.widgets._progress import Best

TaskFilter = Callable[[TaskRecord], bool]


@dataclass(frozen=True)
class LiveOptions:
    """The keyword arguments of `nbcluster.widgets.live` / `status` (documented there).

    `delay`, `interval`, `refresh`, `resource_window` and `limits` left at None take their
    ``nbcluster.widget.*`` Dask config value when the view starts (`resolved`), so a
    `dask.config.set` around the start holds for the whole run.
    """

    label: str | None = None
    delay: float | None = None
    interval: float | None = None
    refresh: float | None = None
    best: Best = None
    window: float | None = None
    resource_window: float | None = None
    live_for: float | None = None
    history: bool = False
    task_filter: TaskFilter | None = None
    #: the view's bounds, {maxTasks, maxSamples} (``nbcluster.widget.max-*``)
    limits: dict[str, int] | None = None

    def resolved(self) -> ResolvedOptions:
        """These options with every unset timing read from Dask config.

        Returns
        -------
        ResolvedOptions
            The same options, every timing a number (``nbcluster.widget.*``).
        """

        def pick(value: float | None, key: str) -> float:
            return config.seconds(f"widget.{key}") if value is None else value

        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return ResolvedOptions(
            **{
                **given,
                "delay": pick(self.delay, "delay"),
                "interval": pick(self.interval, "interval"),
                "refresh": pick(self.refresh, "refresh"),
                "resource_window": pick(self.resource_window, "resource-window"),
                "limits": config.view_limits() if self.limits is None else self.limits,
            }
        )


@dataclass(frozen=True)
class ResolvedOptions(LiveOptions):
    """`LiveOptions.resolved`: the same options, with the timings and limits always set."""

    delay: float = 0.0
    interval: float = 0.0
    refresh: float = 0.0
    resource_window: float = 0.0
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
