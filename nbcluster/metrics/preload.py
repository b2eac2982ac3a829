"""``dask scheduler --preload nbcluster.metrics.preload``: metrics on a scheduler nbcluster did
not start (an existing deployment reached with ``%cluster connect``), so the live widget and
the sidebar can draw it too. nbcluster's own supervisor installs the plugin itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbcluster.metrics.plugin import install

if TYPE_CHECKING:
    from distributed import Scheduler


async def dask_setup(scheduler: Scheduler) -> None:
    await install(scheduler)
