"""The exceptions nbcluster raises for mistakes a user can fix.

Every front end (magics, CLI, sidebar, Python API) shows an `NbclusterError` as its message
alone: one line that says what is wrong and what to do. Anything else escaping nbcluster is a
bug in nbcluster, not in the user's input.
"""

from __future__ import annotations


class NbclusterError(Exception):
    """A user-fixable problem; `str(error)` is the whole message."""


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


class ClusterLost(ClusterUnreachable):
    """The cluster went away while a cell ran; `results` holds what finished before."""

    def __init__(self, message: str, results: object = None):
        super().__init__(message)
        self.results = results

    def _render_traceback_(self) -> list[str]:
        # IPython shows this one line instead of a traceback of nbcluster's waiting loop.
        return [f"ClusterLost: {self.args[0]}"]


class ClusterCannotRun(NbclusterError, RuntimeError):
    """The cluster cannot load nbcluster's tasks (nbcluster is missing where they are
    unpickled); `results` holds what finished before, and `retry()` runs the rest."""

    def __init__(self, message: str, results: object = None):
        super().__init__(message)
        self.results = results

    def _render_traceback_(self) -> list[str]:
        return [f"ClusterCannotRun: {self.args[0]}"]


class WorkerKilled(NbclusterError, RuntimeError):
    """An item's worker process died each time it ran the item (a crash, or out of memory).

    The item's failure record carries this; the rest of the run goes on.
    """


# cluster/ and metrics/ (moved here from cluster/registry.py)
class RuntimeDirError(NbclusterError, OSError):
    """The registry folder cannot be created or written."""


# cluster/ (moved here from cluster/limits.py)
class LimitExceeded(BadArgument):
    """A requested size is above a limit; the message names it and how to raise it."""
