"""This process's current cluster: the one `%%distribute` and plain Dask code use.

The current cluster is process state (like Dask's default client), so it lives here and
nowhere else. Whether it is still running is asked on every use, so a cluster stopped from
the sidebar or another kernel is noticed at once: of the operating system first (is its
registry entry the same file as when it was last read, and does its supervisor still run,
`_Seen`), and of the registry when either has changed, since only then can the answer differ.
"""

from __future__ import annotations

import functools
import os
import select
import threading
from pathlib import Path
from typing import Any

import dask
from distributed import Client

from nbcluster._compat import set_global_client
from nbcluster.cluster import registry
from nbcluster.cluster.handle import ClusterHandle, connect
from nbcluster.cluster.handle import start as start_cluster
from nbcluster.errors import NoCluster

_current: ClusterHandle | None = None
# One handle (so one Client) per cluster name for this process: connecting again for every
# cell would leak clients.
_handles: dict[str, ClusterHandle] = {}


class _Seen:
    """A running cluster's entry file and supervisor, as found when its entry was last read.

    Both are asked of the operating system at each use, nothing is kept in their place: the
    entry is unchanged while its file is the same file with the same status (every change
    to an entry is a new file renamed into place, `registry.update`), and the supervisor
    runs while its pidfd does not poll readable (it does once the process exits).
    """

    def __init__(self, handle: ClusterHandle, path: Path, status: tuple[int, ...], pidfd: int) -> None:
        self.handle, self.path, self.status, self.pidfd = handle, path, status, pidfd
        self.exits = select.poll()
        self.exits.register(pidfd, select.POLLIN)

    def unchanged(self) -> bool:
        return _status(self.path) == self.status and not self.exits.poll(0)

    def close(self) -> None:
        os.close(self.pidfd)


def _status(path: Path) -> tuple[int, ...] | None:
    """What tells one version of an entry file from another; None once it is removed."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_uid, st.st_mode)


def _pidfd(pid: int | None) -> int | None:
    try:
        return os.pidfd_open(pid) if pid else None
    except (AttributeError, OSError):  # no pidfds here, or gone: the registry answers alone
        return None


_seen: _Seen | None = None
_seen_lock = threading.Lock()  # a cell and a run's journal may ask at once


def _alive(handle: ClusterHandle) -> bool:
    """Whether `handle`'s cluster still runs, as its entry says (see `_Seen` for when that is asked)."""
    global _seen
    if not handle.managed or handle.directory is None:
        return True
    with _seen_lock:
        if _seen is not None and _seen.handle is handle and _seen.unchanged():
            return True
        if _seen is not None:
            _seen.close()
            _seen = None
        path = handle.directory / f"{handle.name}{registry.ENTRY}"
        supervisor = handle.entry.get("supervisor_pid")
        pid = supervisor if isinstance(supervisor, int) else None
        pidfd = _pidfd(pid)  # opened before the registry's check, which then vouches for its process
        status = _status(path)
        entry = registry.read(handle.directory, handle.name)
        alive = bool(entry and entry.get("address") == handle.address and entry.get("state") == "running")
        if pidfd is not None:
            if alive and status is not None and entry and entry.get("supervisor_pid") == pid:
                _seen = _Seen(handle, path, status, pidfd)
            else:
                os.close(pidfd)
        return alive


def remember(handle: ClusterHandle) -> ClusterHandle:
    """The process-wide handle for this cluster (reusing its Client if we have one).

    Parameters
    ----------
    handle : ClusterHandle
        A handle just made for a cluster (by `connect` or a start).

    Returns
    -------
    ClusterHandle
        The handle this process already holds for the same cluster (name and address), with
        `handle`'s registry entry; else `handle` itself, now remembered.
    """
    known = _handles.get(handle.name)
    if known is not None and known.address == handle.address:
        known.entry, known.reused = handle.entry, handle.reused
        return known
    if known is not None:
        known.close_client()
    _handles[handle.name] = handle
    return handle


def use(handle: ClusterHandle) -> ClusterHandle:
    """Make `handle` the current cluster and its Client Dask's default client.

    Parameters
    ----------
    handle : ClusterHandle
        The cluster to use from now on.

    Returns
    -------
    ClusterHandle
        The remembered handle (see `remember`), now current.
    """
    global _current
    handle = remember(handle)
    client = handle.client
    set_global_client(client)
    dask.config.set(scheduler="dask.distributed")
    _current = handle
    return handle


def forget(name: str) -> None:
    """Drop a stopped cluster; if it was current, there is no current cluster any more.

    Parameters
    ----------
    name : str
        The cluster's name. An unknown name is not an error.
    """
    global _current, _seen
    handle = _handles.pop(name, None)
    with _seen_lock:
        if _seen is not None and _seen.handle.name == name:
            _seen.close()
            _seen = None
    if handle is not None:
        handle.close_client()
    if _current is not None and _current.name == name:
        # Its client was closed above, which is what takes it off Dask's defaults.
        _current = None


def current() -> ClusterHandle | None:
    """The current cluster: the one `%%distribute` and Dask's default client use.

    Returns
    -------
    ClusterHandle or None
        None when there is none, also when it has stopped since it was chosen.

    Examples
    --------
    >>> cluster = nbcluster.start()
    >>> nbcluster.current().name
    'local'
    """
    if _current is not None and not _alive(_current):
        forget(_current.name)
    return _current


def handle_for(cluster: str | None = None) -> ClusterHandle:
    """The named cluster's handle, or the current one.

    Parameters
    ----------
    cluster : str, optional
        A cluster's name or ``tls://`` address; None for the current cluster.

    Returns
    -------
    ClusterHandle
        Its remembered handle.

    Raises
    ------
    NoCluster
        When `cluster` is None and there is no current cluster (the message says how to get one).
    ClusterNotFound
        When no running cluster has that name.
    """
    if cluster is not None:
        return remember(connect(cluster))
    handle = current()
    if handle is None:
        raise NoCluster(
            "no cluster is running for this kernel: start one with `%cluster start` "
            "(or `nbcluster.start()`), or pick one with `%cluster use NAME`"
        )
    return handle


def client_for(cluster: str | None = None) -> Client:
    """The `distributed.Client` of the named cluster, or of the current one.

    Parameters
    ----------
    cluster : str, optional
        As in `handle_for`.

    Returns
    -------
    distributed.Client
        The handle's connected client.

    Raises
    ------
    NoCluster
        As `handle_for` does.
    """
    return handle_for(cluster).client


def client_of(name: str) -> Client | None:
    """A client of the cluster named (or at the address) `name`, or None when it is not running.

    This process's own client when it has one (a cluster given to `distribute` as a client has
    no name, only an address), else a connection, remembered.

    Parameters
    ----------
    name : str
        A cluster's name or scheduler address, as a journal records it.

    Returns
    -------
    distributed.Client or None
        None when the cluster is not running any more, or not reachable from here.
    """
    for handle in list(_handles.values()):
        if name in (handle.name, handle.address) and handle.client.status == "running":
            return handle.client
    try:
        return handle_for(name).client
    except Exception:  # not running any more, or not reachable from here
        return None


@functools.wraps(start_cluster)
def start(*args: Any, **kwargs: Any) -> ClusterHandle:
    return use(start_cluster(*args, client=True, **kwargs))


# The same docstring, with what this start does besides (before its numpydoc sections).
start.__doc__ = (start_cluster.__doc__ or "").replace(
    "\n    Parameters\n",
    "\n    The cluster also becomes this process's current one, and its Client Dask's default\n"
    "    client (`nbcluster.cluster.handle.start` does neither, for servers and scripts).\n"
    "\n    Parameters\n",
    1,
)


def attach(name_or_address: str, *, security: Any = None) -> ClusterHandle:
    """Make a running cluster (by name or address) the current one: `nbcluster.use`.

    Parameters
    ----------
    name_or_address : str
        A registered cluster's name, or a scheduler's ``tls://`` address.
    security : optional
        For an address: a `distributed.Security`, or paths (CA, certificate, key).

    Returns
    -------
    ClusterHandle
        The current cluster's handle.
    """
    return use(connect(name_or_address, security=security))
