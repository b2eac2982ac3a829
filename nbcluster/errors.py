"""The exceptions nbcluster raises for mistakes a user can fix.

Every front end (magics, CLI, sidebar, Python API) shows an `NbclusterError` as its message
alone: one line that says what is wrong and what to do. Anything else escaping nbcluster is a
bug in nbcluster, not in the user's input.
"""

from __future__ import annotations


class NbclusterError(Exception):
    """A problem the user can fix; ``str(error)`` is the whole message, and it says how.

    Every error nbcluster raises on purpose is one of its subclasses (a bad argument, an
    unknown cluster, a cluster that failed to start or was lost), so one ``except`` catches
    them all; the magics show only the message, never a traceback.

    Examples
    --------
    >>> try:
    ...     nbcluster.connect("nope")
    ... except nbcluster.NbclusterError as error:
    ...     print(error)
    no cluster named 'nope'. ... Start it with `%cluster start --name nope`.
    """


class BadArgument(NbclusterError, ValueError):
    """An argument, flag or value is malformed or out of range."""


class ClusterNotFound(NbclusterError, LookupError):
    """No running cluster has that name (or address)."""


class ClusterUnreachable(NbclusterError, ConnectionError):
    """A cluster is registered or named, but its scheduler does not answer."""


class NoCluster(NbclusterError):
    """An operation needs a current cluster and this process has none."""


class ClusterFailed(NbclusterError, RuntimeError):
    """A cluster could not be started; the message includes the supervisor's reason."""


class _RunEnded(NbclusterError):
    """A run ended before all its items did; `results` holds what finished before."""

    def __init__(self, message: str, results: object = None):
        super().__init__(message)
        self.results = results

    def _render_traceback_(self) -> list[str]:
        # IPython shows this one line instead of a traceback of nbcluster's waiting loop.
        return [f"{type(self).__name__}: {self.args[0]}"]


class ClusterLost(_RunEnded, ClusterUnreachable):
    """The cluster went away while a cell ran; `results` holds what finished before."""


class ClusterCannotRun(_RunEnded, RuntimeError):
    """The cluster cannot load nbcluster's tasks (nbcluster is missing where they are
    unpickled); `results` holds what finished before, and `retry()` runs the rest."""


class WorkerKilled(NbclusterError, RuntimeError):
    """An item's worker process died each time it ran the item (a crash, or out of memory).

    The item's failure record carries this; the rest of the run goes on.
    """


# -- run/ and the commands (lean17) ------------------------------------------------------------
# The worker imports this module (for `Lost`): it stays free of imports.


class TrialStopped(Exception):
    """Raised inside an item by `nbcluster.report` once the item has been told to stop.

    A stopper (``--stop``), ``--timeout``, `Results.stop` or Ctrl-C told it so. Let it
    propagate: the item then ends *stopped*, not failed, keeping the metrics it reported.
    An item that never reports is interrupted with it after ``nbcluster.stop.grace``.

    Examples
    --------
    >>> def train(lr):
    ...     for epoch in range(1, 28):
    ...         nbcluster.report(step=epoch, loss=lr / epoch)  # raises TrialStopped once told
    ...     return lr
    >>> train(0.1)  # outside a run, nothing stops it
    0.1
    """


class Lost(Exception):
    """A scattered value no worker holds any more (worker -> kernel, never shown: the
    kernel sends the value again)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


class HandleGone(NbclusterError):
    """A `--persist` handle whose value no cluster holds any more (stopped, lost, released)."""


class RemoteError(NbclusterError):
    """Stands in for an item's exception that could not be brought back from the worker;
    `str()` is the original's `Type: message`."""


class NotReady(NbclusterError):
    """An item asked for has not finished yet (or was cancelled)."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows the one line, not the frames of Results' own indexing.
        return [f"NotReady: {self.args[0]}"]


class Interrupted(KeyboardInterrupt):
    """The user stopped a waiting cell; outstanding items were cancelled on the cluster.

    A KeyboardInterrupt (not an `NbclusterError`): a user's `except Exception:` around a
    run must not swallow Ctrl-C. `results` holds what finished.
    """

    def __init__(self, message: str, results: object):
        super().__init__(message)
        self.results = results

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback of nbcluster's waiting loop.
        return [f"Interrupted: {self.args[0]}"]


class HelpShown(Exception):
    """`--help` was asked for: the front end prints `text` (argparse would print and exit)."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


# -- settings (config_schema.py)
class SettingWarning(UserWarning):
    """A key under `nbcluster.` in Dask's config that is no setting (a typo): it is ignored."""

# cluster/ and metrics/ (moved here from cluster/registry.py)
class RuntimeDirError(NbclusterError, OSError):
    """The registry folder cannot be created or written."""


# cluster/ (moved here from cluster/limits.py)
class LimitExceeded(BadArgument):
    """A requested size is above a limit; the message names it and how to raise it."""


# run/ (persist23: worker/held.py)
class NotRecomputed(NbclusterError, RuntimeError):
    """A persisted value Dask lost with its worker, whose recomputation ran its item and
    failed (or did not reach it): the item's task raises this, never hands on a `None`."""
