"""The on-disk registry of running clusters: how every front end finds every cluster.

One JSON file per cluster, `<runtime dir>/<name>.json`, mode 0600 in a 0700 folder, beside
the cluster's TLS credentials (`<name>.cert.pem`, `<name>.key.pem`) and its supervisor's log
(`<name>.log`). The runtime dir is `$NBCLUSTER_RUNTIME_DIR`, else `nbcluster/` under
Jupyter's runtime dir.

A name is claimed by creating its entry with `O_EXCL`, by the supervisor itself, so two
processes starting clusters at once never get the same name and every entry names a live
process from its first byte (`state: "starting"` until the scheduler is up). An entry whose
supervisor process is gone is stale: whoever reads it deletes it, with its credentials.
Supervisor pids are checked together with their start time, so a reused pid never keeps a
dead cluster listed. An entry that another user owns, that others could write, or that is a
symlink is refused with a warning and left in place (`_read_trusted`): entries name the
credentials and dashboard address that front ends will use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import stat
import threading
from pathlib import Path
from typing import cast

import psutil

from nbcluster._wire import RegistryEntry
from nbcluster.errors import RuntimeDirError

#: A cluster's entry is NAME + ENTRY in the registry folder.
ENTRY = ".json"
# The .scheduler-*.pem files hold credentials a backend brings (a gateway's), beside our own.
SUFFIXES = (
    ENTRY,
    ".cert.pem",
    ".key.pem",
    ".scheduler-ca.pem",
    ".scheduler-cert.pem",
    ".scheduler-key.pem",
    ".log",
)
log = logging.getLogger("nbcluster")


def runtime_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The registry folder, created 0700 on first use.

    Parameters
    ----------
    override : path, optional
        A folder to use; else ``NBCLUSTER_RUNTIME_DIR``, else Jupyter's runtime folder's
        ``nbcluster``.

    Returns
    -------
    Path
        The folder.

    Raises
    ------
    RuntimeDirError
        When it cannot be created or written (the message says what to do).
    """
    if override is not None:
        path = Path(override)
    elif os.environ.get("NBCLUSTER_RUNTIME_DIR"):
        path = Path(os.environ["NBCLUSTER_RUNTIME_DIR"])
    else:
        from jupyter_core.paths import jupyter_runtime_dir

        path = Path(jupyter_runtime_dir()) / "nbcluster"
    fix = "make it writable by you, or set NBCLUSTER_RUNTIME_DIR to a folder of yours"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise RuntimeDirError(
            f"cannot create the cluster registry folder {path} ({error.strerror}): {fix}"
        ) from None
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise RuntimeDirError(f"cannot write to the cluster registry folder {path}: {fix}")
    return path


def write_private(path: Path, data: str | bytes, *, exclusive: bool = False) -> None:
    """Write a file only this user can read: every registry entry and credential goes here.

    Not `jupyter_core.paths.secure_write`: claiming a name needs `O_EXCL`, which it lacks.
    The file is 0600 from its first byte (created so, and re-set in case it existed).

    Parameters
    ----------
    path : Path
        The file.
    data : str or bytes
        Its content (str is written as UTF-8).
    exclusive : bool
        Fail if the file exists (`FileExistsError`) instead of replacing its content.
    """
    with os.fdopen(open_private(path, exclusive=exclusive), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def open_private(path: Path, *, exclusive: bool = False, append: bool = False) -> int:
    """A descriptor for writing a 0600 file (see `write_private`).

    Parameters
    ----------
    path : Path
        The file.
    exclusive : bool
        Fail if it exists.
    append : bool
        Append instead of truncating: for logs that several writers share, such as a
        supervisor's start log.

    Returns
    -------
    int
        The open descriptor.
    """
    flags = (
        os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC) | (os.O_APPEND if append else 0)
    )
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def claim(directory: Path, name: str, entry: RegistryEntry) -> bool:
    """Create `name`'s entry if no live cluster holds the name.

    Parameters
    ----------
    directory : Path
        The registry folder.
    name : str
        The cluster's name.
    entry : RegistryEntry
        Its first entry (state ``starting``).

    Returns
    -------
    bool
        False when a live cluster already holds the name.
    """
    path = directory / f"{name}{ENTRY}"
    for _ in range(2):
        try:
            write_private(path, json.dumps(entry), exclusive=True)
            return True
        except FileExistsError:
            if read(directory, name) is not None:
                return False
            # read() pruned a stale entry: the name is free, try once more.
    return False


def update(directory: Path, name: str, entry: RegistryEntry) -> None:
    """Rewrite an entry atomically, so readers never see half a file.

    Parameters
    ----------
    directory : Path
        The registry folder.
    name : str
        The cluster's name.
    entry : RegistryEntry
        The whole new entry.
    """
    tmp = directory / f".{name}{ENTRY}.tmp"
    write_private(tmp, json.dumps(entry))
    os.replace(tmp, directory / f"{name}{ENTRY}")


def remove(directory: Path, name: str) -> None:
    """Delete a cluster's entry and the files beside it (credentials, logs); missing ones are fine.

    Parameters
    ----------
    directory : Path
        The registry folder.
    name : str
        The cluster's name.
    """
    for suffix in SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{name}{suffix}").unlink()


def process_alive(pid: int | None, started: float | None = None) -> bool:
    """Whether a process runs.

    Parameters
    ----------
    pid : int or None
        Its pid (None or 0: no process).
    started : float, optional
        Its start time (``psutil``'s), so that a reused pid is not taken for it.

    Returns
    -------
    bool
        True if `pid` runs (not a zombie) and, when `started` is given, is the same process as then.
    """
    if not pid:
        return False
    key = (pid, started)
    with _PIDFDS_LOCK:
        kept = _PIDFDS.get(key)
        if kept is not None:
            if not _exited(kept):
                return True  # the process it was opened on runs: one poll, where psutil read /proc twice
            del _PIDFDS[key]
            os.close(kept[0])
            return False
    try:
        fd = os.pidfd_open(pid)  # before the check: the check then vouches for the process it holds
    except (AttributeError, OSError):
        fd = None
    alive = _psutil_alive(pid, started)
    if fd is not None:
        if alive:
            _keep_pidfd(key, fd)
        else:
            os.close(fd)
    return alive


#: (pid, start time) -> a pidfd of that process (and a poll of it), seen running as itself when
#: it was opened: it becomes readable when the process exits (a zombie too), and a reused pid is
#: another process. Asked on every read of a cluster's entry: the sidebar's polls, `%cluster list`.
_PIDFDS: dict[tuple[int, float | None], tuple[int, select.poll]] = {}
_PIDFDS_LOCK = threading.Lock()


def _psutil_alive(pid: int, started: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _exited(kept: tuple[int, select.poll]) -> bool:
    return bool(kept[1].poll(0))


def _keep_pidfd(key: tuple[int, float | None], fd: int) -> None:
    watch = select.poll()
    watch.register(fd, select.POLLIN)
    with _PIDFDS_LOCK:
        # Sweep: the processes kept that exited since (clusters stopped) give their descriptors back.
        for old in [k for k, kept in _PIDFDS.items() if _exited(kept)]:
            os.close(_PIDFDS.pop(old)[0])
        if key in _PIDFDS:  # another thread kept one meanwhile
            os.close(fd)
        else:
            _PIDFDS[key] = (fd, watch)


def _read_trusted(path: Path) -> str | None:
    """The text of an entry this user wrote and nobody else can change; None otherwise.

    An entry names credential files and a dashboard address that front ends will use, so
    one that another user owns, or that others may write, is refused (with a warning, once)
    and left alone: it is not ours to delete. O_NOFOLLOW: a planted symlink is refused too.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:  # ELOOP: a symlink
        _warn_once(path, None, f"cannot be opened safely ({error.strerror})")
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            _warn_once(path, st, f"belongs to another user (uid {st.st_uid})")
            return None
        if st.st_mode & 0o077:
            _warn_once(
                path, st, f"is readable or writable by others (mode {stat.S_IMODE(st.st_mode):o}, not 600)"
            )
            return None
        chunks = []  # os.read, not a text file object: its set-up was most of this read's time
        while chunk := os.read(fd, max(st.st_size + 1, 4096)):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


_warned: set[tuple[str, int, float]] = set()


def _warn_once(path: Path, st: os.stat_result | None, why: str) -> None:
    # Readers poll the registry (the sidebar twice a second): one warning per file version.
    key = (str(path), st.st_ino if st else 0, st.st_mtime if st else 0.0)
    if key not in _warned:
        _warned.add(key)
        log.warning(
            "nbcluster: ignoring registry entry %s: it %s; remove it if you do not know it", path, why
        )


def read(directory: Path, name: str) -> RegistryEntry | None:
    """The live entry for `name`, pruning it if its supervisor is gone.

    Parameters
    ----------
    directory : Path
        The registry folder.
    name : str
        The cluster's name.

    Returns
    -------
    RegistryEntry or None
        None when there is no live entry.
    """
    path = directory / f"{name}{ENTRY}"
    text = _read_trusted(path)
    if text is None:
        return None
    try:
        entry = json.loads(text)
    except json.JSONDecodeError:
        entry = None
    if not isinstance(entry, dict):
        # Entries are written atomically, so a broken one was left by a crash.
        remove(directory, name)
        return None
    if not process_alive(entry.get("supervisor_pid"), entry.get("supervisor_started")):
        remove(directory, name)
        return None
    entry.setdefault("external", False)  # the tag, missing from an entry written before it existed
    # A file this user wrote and nobody else can change (`_read_trusted`), in the
    # supervisor's format: tests/test_wire.py checks a real one against the type.
    return cast(RegistryEntry, entry)


def entries(directory: Path, *, include_starting: bool = False) -> list[RegistryEntry]:
    """Every live cluster, oldest first; stale entries are pruned on the way.

    Parameters
    ----------
    directory : Path
        The registry folder.
    include_starting : bool
        Also entries whose cluster is still starting.

    Returns
    -------
    list of RegistryEntry
        Oldest first.
    """
    found = []
    for path in directory.glob(f"*{ENTRY}"):
        entry = read(directory, path.name.removesuffix(ENTRY))
        if entry and (include_starting or entry.get("state") == "running"):
            found.append(entry)
    return sorted(found, key=lambda e: e.get("created", 0))
