"""nbcluster: interactive distributed computing for Jupyter, on Dask.

>>> import nbcluster
>>> cluster = nbcluster.start(workers=2)      # or `%load_ext nbcluster` + `%cluster start`
>>> cluster.client.submit(sum, [1, 2]).result()
3
>>> cluster.stop()
"""

from __future__ import annotations

from typing import Any

from nbcluster._current import current
from nbcluster.cluster.handle import ClusterHandle, clusters, connect
from nbcluster.cluster.handle import start as _start
from nbcluster.errors import NbclusterError

__all__ = [
    "ClusterHandle",
    "NbclusterError",
    "clusters",
    "connect",
    "current",
    "load_ipython_extension",
    "start",
    "use",
]
__version__ = "0.1.0"


def start(
    workers: int | None = None,
    threads: int | None = None,
    memory: str | int | None = None,
    gpus: int | str | None = None,
    name: str | None = None,
    keep: bool = False,
    dashboard: bool = False,
    gpu_backend: str | None = None,
    **kwargs: Any,
) -> ClusterHandle:
    """Start (or reuse) a cluster and make it this process's current cluster.

    See `nbcluster.cluster.handle.start` for the reuse rules; `owner_pid=` and
    `runtime_dir=` are accepted for servers and tests.
    """
    from nbcluster import _current

    handle = _start(workers, threads, memory, gpus, name, keep, dashboard, gpu_backend, **kwargs)
    return _current.use(handle)


def use(name_or_address: str) -> ClusterHandle:
    """Make a running cluster (by name or address) the current one of this process."""
    from nbcluster import _current

    return _current.use(connect(name_or_address))


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the sidebar (used by `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "nbcluster"}]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext nbcluster`: register `%cluster` and `%%distribute`."""
    from nbcluster.cluster.handle import prewarm
    from nbcluster.magics import NbclusterMagics

    ipython.register_magics(NbclusterMagics)
    prewarm()
