"""nbcluster: interactive distributed computing for Jupyter, on Dask.

>>> import nbcluster
>>> cluster = nbcluster.start(workers=2)      # or `%load_ext nbcluster` + `%cluster start`
>>> cluster.client.submit(sum, [1, 2]).result()
3
>>> cluster.stop()
"""

from __future__ import annotations

import functools
from typing import Any

from nbcluster import config as _config  # noqa: F401 - registers nbcluster's Dask config defaults
from nbcluster._current import current
from nbcluster.cluster.handle import ClusterHandle, clusters, connect
from nbcluster.cluster.handle import start as _start
from nbcluster.distribute import Results, distribute, wait
from nbcluster.errors import NbclusterError

__all__ = [
    "ClusterHandle",
    "NbclusterError",
    "Results",
    "clusters",
    "connect",
    "current",
    "distribute",
    "load_ipython_extension",
    "start",
    "use",
    "wait",
]
__version__ = "0.1.0"


@functools.wraps(_start)
def start(*args: Any, **kwargs: Any) -> ClusterHandle:
    from nbcluster import _current

    return _current.use(_start(*args, **kwargs))


start.__doc__ = f"""{_start.__doc__}
    The cluster also becomes this process's current one, and its Client Dask's default
    client (`nbcluster.cluster.handle.start` does neither, for servers and scripts).
    """


def use(name_or_address: str, *, security: Any = None) -> ClusterHandle:
    """Make a running cluster (by name or address) the current one of this process.

    `security` is ``(CA, CERT, KEY)`` for a ``tls://`` scheduler run by someone else.
    """
    from nbcluster import _current

    return _current.use(connect(name_or_address, security=security))


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the sidebar (used by `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "nbcluster"}]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext nbcluster`: register `%cluster` and `%%distribute`."""
    from nbcluster.cluster.launcher import prewarm
    from nbcluster.magics import NbclusterMagics

    ipython.register_magics(NbclusterMagics)
    prewarm()
