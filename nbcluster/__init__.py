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

from typing import TYPE_CHECKING, Any

from nbcluster import _lazy
from nbcluster import config as _config  # noqa: F401 - registers nbcluster's Dask config defaults
from nbcluster._version import __version__ as __version__
from nbcluster.errors import NbclusterError  # imports nothing: as cheap as a name
from nbcluster.errors import TrialStopped as TrialStopped

if TYPE_CHECKING:
    from nbcluster._current import current, start
    from nbcluster.cluster.handle import ClusterHandle, clusters, connect
    from nbcluster.run.api import distribute, everywhere, ranks, wait
    from nbcluster.run.results import Results
    from nbcluster.run.stoppers import Stopper
    from nbcluster.run.transport import Needs
    from nbcluster.worker.checkpoint import checkpoint
    from nbcluster.worker.local import worker_local
    from nbcluster.worker.rank import rank, world_size
    from nbcluster.worker.trial import report, should_stop

__all__ = [
    "ClusterHandle",
    "NbclusterError",
    "Needs",
    "Results",
    "Stopper",
    "TrialStopped",
    "checkpoint",
    "clusters",
    "connect",
    "current",
    "distribute",
    "everywhere",
    "load_ipython_extension",
    "rank",
    "ranks",
    "report",
    "should_stop",
    "start",
    "use",
    "wait",
    "worker_local",
    "world_size",
]
# public name -> the module that defines it
_LAZY = {
    "ClusterHandle": "nbcluster.cluster.handle",
    "clusters": "nbcluster.cluster.handle",
    "connect": "nbcluster.cluster.handle",
    "current": "nbcluster._current",
    "start": "nbcluster._current",
    "Results": "nbcluster.run.results",
    "distribute": "nbcluster.run.api",
    "everywhere": "nbcluster.run.api",
    "Needs": "nbcluster.run.transport",
    "wait": "nbcluster.run.api",
    "worker_local": "nbcluster.worker.local",
    "Stopper": "nbcluster.run.stoppers",
    "report": "nbcluster.worker.trial",
    "checkpoint": "nbcluster.worker.checkpoint",
    "should_stop": "nbcluster.worker.trial",
    "ranks": "nbcluster.run.api",
    "rank": "nbcluster.worker.rank",
    "world_size": "nbcluster.worker.rank",
}


__getattr__, __dir__ = _lazy.attributes(__name__, _LAZY, globals(), __all__)


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
    workers will be forked from), so that the first ``%cluster start`` is quick, and loads
    the kernel side of a run (the engine, the widgets) now, so that the first
    ``%%distribute`` cell does not wait for those imports. Not in a background thread: a
    ``multiprocessing.Pool`` forked while that thread held an import lock would deadlock
    in its first import.

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
    _load_kernel_side()


#: What a kernel's first ``%%distribute`` cell imports (0.2 s of a first cell that takes about
#: a second): loaded by ``%load_ext`` instead. By name: this is a warm-up, not a dependency of
#: the package on them.
KERNEL_SIDE = ("nbcluster.run.api", "nbcluster.widgets")


def _load_kernel_side() -> None:
    import importlib

    for name in KERNEL_SIDE:
        importlib.import_module(name)
