"""nbcluster: interactive distributed computing for Jupyter, on Dask.

>>> import nbcluster
>>> cluster = nbcluster.start(workers=2)      # or `%load_ext nbcluster` + `%cluster start`
>>> cluster.client.submit(sum, [1, 2]).result()
3
>>> cluster.stop()

The public names are loaded on first use (PEP 562): a Dask worker unpickling an item
imports `nbcluster` too, and must not pay for the kernel side (Dask's Client, IPython,
the widgets, the cluster handle) that it never runs.
"""

from __future__ import annotations

import os as _os
import sys
import types
from typing import TYPE_CHECKING, Any

from nbcluster._start_up import START_UP_VARIABLE as _START_UP

# A process forked from one of nbcluster's own has the collector on whatever happens (a
# worker, should the forkserver's imports fail).
if _os.environ.pop(_START_UP, None) is not None:
    import gc as _gc

    _gc.disable()
    _os.register_at_fork(after_in_child=_gc.enable)

# A supervisor launched for a local cluster (cluster/launcher.py) starts the forkserver its
# workers will be forked from before anything else, Dask's config below included, with the
# workers' environment as the launcher predicted it (cluster/forkserver.py).
if _os.environ.get("NBCLUSTER_FORKSERVER_AHEAD") is not None:
    from nbcluster.cluster import forkserver as _forkserver

    _forkserver.start_as_launched()

from nbcluster import _lazy
from nbcluster import config as _config  # noqa: F401 - registers nbcluster's Dask config defaults
from nbcluster.errors import NbclusterError  # imports nothing: as cheap as a name

if TYPE_CHECKING:
    from nbcluster._current import current, start
    from nbcluster.cluster.handle import ClusterHandle, clusters, connect
    from nbcluster.distribute.results import Results
    from nbcluster.distribute.run import distribute, wait

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

# public name -> the module that defines it
_LAZY = {
    "ClusterHandle": "nbcluster.cluster.handle",
    "clusters": "nbcluster.cluster.handle",
    "connect": "nbcluster.cluster.handle",
    "current": "nbcluster._current",
    "start": "nbcluster._current",
    "Results": "nbcluster.distribute.results",
    "distribute": "nbcluster.distribute.run",
    "wait": "nbcluster.distribute.run",
}


__getattr__, __dir__ = _lazy.attributes(__name__, _LAZY, globals(), __all__)


class _Package(types.ModuleType):
    """`nbcluster` itself: `nbcluster.distribute` stays the function.

    Importing a submodule sets it as an attribute of its package, once, when it is first
    loaded: the subpackage `nbcluster.distribute` would then hide the function of that name
    (when it was eager, the function's import simply came after). Refused here, the name
    is left to `__getattr__`, which loads the function.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "distribute" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def use(name_or_address: str, *, security: Any = None) -> ClusterHandle:
    """Make a running cluster (by name or address) the current one of this process.

    Its Client becomes Dask's default client, so plain Dask code runs there too
    (``%cluster use NAME`` in a notebook).

    Parameters
    ----------
    name_or_address : str
        A name from `clusters`, or a scheduler address such as ``tls://host:8786``.
    security : tuple of str, optional
        ``(CA, CERT, KEY)``: PEM files for a ``tls://`` scheduler run by someone else.

    Returns
    -------
    ClusterHandle
        The cluster, now `current`.

    Raises
    ------
    nbcluster.errors.ClusterNotFound
        No running cluster of that name.

    Examples
    --------
    By name, a cluster started elsewhere (``nbcluster start`` in a terminal, say):

    >>> nbcluster.use("local").name
    'local'

    By address, a scheduler someone else runs:

    >>> # not executed: it needs a TLS scheduler on another host; tests/test_external.py runs one
    >>> nbcluster.use("tls://host:8786", security=("ca.pem", "cert.pem", "key.pem"))  # doctest: +SKIP
    """
    from nbcluster import _current

    return _current.attach(name_or_address, security=security)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the sidebar (used by `jupyter labextension develop`)."""
    return [{"src": "labextension", "dest": "nbcluster"}]


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%cluster`` and ``%%distribute``: what ``%load_ext nbcluster`` calls.

    It also starts a spare supervisor process in the background (with the process its
    workers will be forked from), so that the first ``%cluster start`` is quick.

    Parameters
    ----------
    ipython : IPython.core.interactiveshell.InteractiveShell
        The shell to register the magics in.

    Examples
    --------
    >>> get_ipython().run_line_magic("load_ext", "nbcluster")
    """
    from nbcluster.cluster.launcher import prewarm
    from nbcluster.magics import NbclusterMagics, forget_shown_after_cells

    ipython.register_magics(NbclusterMagics)
    forget_shown_after_cells(ipython)
    prewarm()
