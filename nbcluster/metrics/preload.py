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
    """Dask's preload hook: install nbcluster's metrics plugin on a starting scheduler.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler that preloads this module (``--preload nbcluster.metrics.preload``).
    """
    await install(scheduler)
