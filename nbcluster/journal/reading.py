"""Reading a run's journal back: its format, its records, what it holds (`load`), where.

The file layout and the writer are `store.py`'s; this module is what a reader needs: the
journals' folder and its listing (`folder`, `journals`, `in_use`), the header and record
types, `read_header` (which refuses another format before anything is
unpickled), `records` (which stops at the first record cut short), `load`, and
`ended_complete` (whether a journal's last record says its run finished).
"""

from __future__ import annotations

import collections
import fcntl
import functools
import importlib.metadata
import json
import os
import pickle
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

from dask.utils import parse_bytes

from nbcluster import config

FORMAT = 2  # bump when a record's shape changes: an older reader then refuses the file
MAGIC = b"NBCLUSTER-JOURNAL\n"
SUFFIX = ".journal"
_LENGTH = struct.Struct("<I")


@functools.cache
def _version() -> str:
    # Not `nbcluster.__version__`: the package imports the kernel side lazily, and this module
    # must not import the package's __init__ back (tests/test_imports.py).
    try:
        return importlib.metadata.version("nbcluster")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Header(TypedDict):
    """The first line of a journal: what run it is, in JSON (readable without unpickling)."""

    format: int
    nbcluster: str  # the version that wrote it, for the refusal message
    identity: str
    total: int  # items in the run
    first_line: str  # the cell's first line (or the function's name), for `runs`
    started: float  # wall-clock time
    persist: bool  # a --persist run: its records hold recipes (`handles.Recipe`), not values
    cluster: str | None  # --persist: the cluster's name (or address) the values are on


class Failure(TypedDict):
    """A failed item as its batch's record keeps it: one line, never a traceback."""

    error: str  # "ValueError: not yet": the exception's type and message, as the cell shows them
    params: str  # "x=3, lr=0.1" (`plan.describe`)


class Failed(Failure):
    """A failed item read back (`Loaded.failed`): with the worker that ran it, and when."""

    worker: str | None  # its name (its address when it has none); None: the kernel, or nbcluster itself
    at: float


class Batch(TypedDict):
    """One delivered batch."""

    kind: Literal["batch"]
    at: float  # when it reached the kernel
    where: str  # "the cluster" or "the kernel" (--local)
    worker: tuple[str, str] | None  # (address, name) of the worker that ran it; None: the kernel ran it
    indices: Sequence[int]  # a range for a contiguous batch
    errors: dict[int, Failure]  # the items that failed, by item index: re-run on resume
    plain: bytes | None  # the values pickled as one list, when all are builtin data (`worker/plain.py`)
    pickled: list[bytes | None] | None  # else one pickle per item; None: left out (too large)
    held: list[Any] | None  # --persist: each item's `handles.Recipe` (None: not published), never its value
    outputs: dict[int, list[list[Any]]]  # what items printed, by item index


class End(TypedDict):
    """A start of the run ended (the run, or a retry)."""

    kind: Literal["end"]
    at: float
    done: int
    total: int


class Refused(Exception):
    """A journal this nbcluster cannot read (another format): one line says so."""


@dataclass
class Loaded:
    """What a journal holds, read back."""

    path: Path
    header: Header
    values: dict[int, Any] = field(default_factory=dict)  # item -> value (--persist: its Recipe), for done items
    outputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    failed: dict[int, Failed] = field(default_factory=dict)  # failed and never done, by item
    workers: dict[str, int] = field(default_factory=dict)  # worker name (or "the kernel") -> items done there
    left_out: int = 0  # done, but too large to journal
    unloadable: int = 0  # done, but the value cannot be loaded now (its class is gone)
    ended: End | None = None  # the last End record; None: the kernel died mid-run
    size: int = 0

    @property
    def state(self) -> str:
        """The run's state as its journal records it, for listings.

        Returns
        -------
        str
            ``"complete"`` (its last `End` had every item done), ``"failed"`` (every item ran,
            and some raised), ``"interrupted"`` (an `End` with items not run: cancelled, or its
            cluster lost), or ``"killed"`` (no `End` after the last batch: the kernel died
            mid-run). Whether it is *running* is `in_use`'s to say.
        """
        if self.ended is None:
            return "killed"
        done, total = self.ended["done"], self.header["total"]
        if done == total:
            return "complete"
        return "failed" if done + len(self.failed) >= total else "interrupted"


def _started(path: Path) -> int:
    try:
        return int(path.name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return 0


def read_header(data: bytes, path: Path) -> tuple[Header, int]:
    """The header and the offset of the first record; `Refused` for another format.

    Parameters
    ----------
    data : bytes
        The journal file's contents.
    path : pathlib.Path
        Its path: its name gives the start time the messages name.

    Returns
    -------
    header : Header
        The run the journal is of.
    offset : int
        Where its first record starts in `data`.

    Raises
    ------
    Refused
        When it is not an nbcluster journal, its header is damaged, or another version of
        nbcluster wrote it in another format.
    """
    when = _when(_started(path) / 1000)
    if not data.startswith(MAGIC):
        raise Refused(f"the journal {path.name} is not an nbcluster journal")
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC) : end if end >= 0 else len(data)])
    except ValueError:
        raise Refused(f"the journal of {when} has a damaged header") from None
    if end < 0 or not isinstance(header, dict):
        raise Refused(f"the journal of {when} has a damaged header")
    if header.get("format") != FORMAT:
        raise Refused(
            f"the journal of {when} was written by nbcluster {header.get('nbcluster', '?')} "
            f"(journal format {header.get('format')}), which this nbcluster {_version()} cannot read"
        )
    return header, end + 1  # type: ignore[return-value]  # checked field by field is not worth it: format matched


def records(data: bytes, offset: int) -> Iterator[Batch | End]:
    """Each whole record from `offset`; stops at one cut short (or damaged).

    Parameters
    ----------
    data : bytes
        The journal file's contents.
    offset : int
        Where the first record starts (from `read_header`).

    Yields
    ------
    Batch or End
        Each whole record, in the order written.
    """
    view = memoryview(data)
    while offset + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, offset)
        start = offset + _LENGTH.size
        if start + length > len(data):
            return  # the kernel was killed mid-write
        try:
            record = pickle.loads(view[start : start + length])
        except Exception:
            return  # damaged: nothing after it can be trusted either
        yield record
        offset = start + length


#: Journals this process ended with every item done or found so, the newest last (a bounded
#: memory): each run of a cell asks `ended_complete` of its newest journal, which reads the whole
#: file (5 MB after a million items) to find its last record; a cell run again and again asks
#: it of the same journal each time. A complete journal stays
#: complete: resuming one finishes it complete again.
_ENDED_COMPLETE: collections.OrderedDict[Path, None] = collections.OrderedDict()
_KEEP_ENDED = 256


def ended_complete(path: Path) -> bool:
    """Whether the journal's last record says its run finished every item.

    Only that record is unpickled: the other records are stepped over by their lengths. A
    fresh run of a cell asks this of the previous journal before any hint (`resume._hint`),
    and a complete one, the usual case, then costs no read of its values.

    Parameters
    ----------
    path : pathlib.Path
        The journal file.

    Returns
    -------
    bool
        True when its last whole record is an `End` with every item done; False for any
        other journal, and for one that cannot be read.
    """
    if path in _ENDED_COMPLETE:
        return True  # this process ended it so; a complete journal stays complete
    try:
        data = path.read_bytes()
        _header, offset = read_header(data, path)
    except (Refused, OSError):
        return False
    last = None
    while offset + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, offset)
        if offset + _LENGTH.size + length > len(data):
            break  # cut short: the last whole record is the one before
        last, offset = offset, offset + _LENGTH.size + length
    if last is None:
        return False
    record = next(records(data, last), None)
    complete = record is not None and record["kind"] == "end" and record["done"] == record["total"]
    if complete:
        _remember_complete(path)
    return complete


def _remember_complete(path: Path) -> None:
    _ENDED_COMPLETE[path] = None
    _ENDED_COMPLETE.move_to_end(path)
    while len(_ENDED_COMPLETE) > _KEEP_ENDED:
        _ENDED_COMPLETE.popitem(last=False)


def load(path: Path, *, values: bool = True) -> Loaded:
    """Read a journal; `values=False` counts the items without unpickling their values.

    Parameters
    ----------
    path : pathlib.Path
        The journal file.
    values : bool
        False to only count the items (for listings); their values are then not unpickled.

    Returns
    -------
    Loaded
        The header, the done items' values and outputs, the failed items, and the counts of
        items left out (too large) or that cannot be loaded now.

    Raises
    ------
    Refused
        When the file is not a journal this nbcluster can read (see `read_header`).
    OSError
        When the file cannot be read.
    """
    data = path.read_bytes()
    header, offset = read_header(data, path)
    loaded = Loaded(path, header, size=len(data))
    done = loaded.values
    left_out: set[int] = set()
    unloadable: set[int] = set()
    for record in records(data, offset):
        try:
            _take(record, loaded, values, left_out, unloadable)
        except (KeyError, TypeError, IndexError, AttributeError):
            break  # a record of the wrong shape: damaged, like a cut one
    loaded.left_out = len(left_out - done.keys())
    loaded.unloadable = len(unloadable - done.keys())
    for i in loaded.failed.keys() & done.keys():
        del loaded.failed[i]
    return loaded


def _take(record: Batch | End, loaded: Loaded, values: bool, left_out: set[int], unloadable: set[int]) -> None:
    """Add one record to `loaded`: the first delivery of an item counts (as in `RunState`)."""
    done = loaded.values
    if record["kind"] == "end":
        loaded.ended = record
        return
    loaded.ended = None  # a retry after an End went on: its End comes later, or never
    failed = record["errors"]
    ran_on = record["worker"]
    name = ran_on[1] if ran_on is not None else record["where"]
    indices = record["indices"]
    pickled: list[bytes | None] = record["pickled"] or []
    plain = record["held"] if record["held"] is not None else None
    if plain is None and record["plain"] is not None:
        plain = pickle.loads(record["plain"])
    before = len(done)
    for j, i in enumerate(indices):
        if i in failed:
            loaded.failed[i] = {**failed[i], "worker": name if ran_on is not None else None, "at": record["at"]}
        elif i in done:
            continue  # a second delivery (a re-run batch): the first one counted
        elif plain is not None:
            if plain[j] is None and record["held"] is not None:
                left_out.add(i)  # persisted but not published: nothing to adopt
            else:
                done[i] = plain[j]
        elif (blob := pickled[j]) is None:
            left_out.add(i)
        elif not values:
            done[i] = None
        else:
            try:
                done[i] = pickle.loads(blob)
            except Exception:  # its class is gone, its module not installed: re-run it
                unloadable.add(i)
    if len(done) > before:
        loaded.workers[name] = loaded.workers.get(name, 0) + len(done) - before
    for i, chunks in record["outputs"].items():
        if i in done:
            loaded.outputs[i] = chunks


# -- writing ----------------------------------------------------------------------------------
def _when(started: float) -> str:
    """14:02 today, else Nov 30 14:02."""
    t = time.localtime(started)
    same_day = time.strftime("%Y%m%d", t) == time.strftime("%Y%m%d")
    return time.strftime("%H:%M" if same_day else "%b %d %H:%M", t)


def when(loaded: Loaded) -> str:
    """When the journal's run started, for messages: ``14:02`` today, else ``Nov 30 14:02``.

    Parameters
    ----------
    loaded : Loaded
        A journal read back.

    Returns
    -------
    str
        The start time, in local time.
    """
    return _when(loaded.header["started"])


def folder() -> Path:
    """The journals' folder (made 0700 on first write).

    Returns
    -------
    pathlib.Path
        ``nbcluster.journal.path`` when set (``~`` expanded), else
        ``<Jupyter data dir>/nbcluster/journal``.
    """
    global _FOLDER
    configured = config.get("journal.path")
    key = (str(configured) if configured else "", *(os.environ.get(v) for v in _FOLDER_VARIABLES))
    if _FOLDER is None or _FOLDER[0] != key:
        if configured:
            _FOLDER = (key, Path(os.path.expanduser(str(configured))))
        else:
            from jupyter_core.paths import jupyter_data_dir

            _FOLDER = (key, Path(jupyter_data_dir()) / "nbcluster" / "journal")
    return _FOLDER[1]


#: What the folder depends on besides the setting: the variables jupyter_core's data folder
#: reads (it resolves the home folder's real path, ~0.1 ms of every run), and HOME for ``~``.
_FOLDER_VARIABLES = ("JUPYTER_DATA_DIR", "JUPYTER_PLATFORM_DIRS", "XDG_DATA_HOME", "HOME")
#: The setting and those variables, and the folder they gave.
_FOLDER: tuple[tuple[str | None, ...], Path] | None = None


def enabled() -> bool:
    """Whether runs are journaled (the ``nbcluster.journal.enabled`` setting).

    Returns
    -------
    bool
        The setting, as a bool or the string ``"true"``.
    """
    value = config.get("journal.enabled")
    return value if isinstance(value, bool) else str(value).strip().lower() == "true"


def _size(key: str) -> int:
    return int(parse_bytes(config.get(key)))


def journals(identity: str | None = None, where: Path | None = None) -> list[Path]:
    """The journal files (of one identity), newest first.

    Parameters
    ----------
    identity : str, optional
        Only the journals of runs with this identity (`identity.fingerprint`); every journal
        when None.
    where : pathlib.Path, optional
        The folder to look in; `folder()` when None.

    Returns
    -------
    list of pathlib.Path
        The journals, newest start first; [] when the folder cannot be read.
    """
    base = where or folder()
    by_identity = _listing(base)
    if identity:
        found = by_identity.get(identity, [])
    else:
        found = [name for names in by_identity.values() for name in names]
    return sorted((base / name for name in found), key=_started, reverse=True)


#: A folder's last listing: (its inode, its mtime in ns, when the listing began, the journals'
#: names by identity). Each run lists its identity's journals (a cost that grows with their
#: number); the folder's mtime changes with every file made or deleted in
#: it, so an unchanged one means the same names. Only a listing begun over `_STILL_S` after
#: that mtime is kept: a file system's mtime can be coarse (a clock tick), and a file made in
#: the same tick as the last change would not move it.
_LISTED: dict[Path, tuple[int, int, float, dict[str, list[str]]]] = {}
_STILL_S = 1.0


def _listing(base: Path) -> dict[str, list[str]]:
    try:
        st = os.stat(base)
    except OSError:
        return {}
    kept = _LISTED.get(base)
    if kept is not None and kept[:2] == (st.st_ino, st.st_mtime_ns) and kept[2] - st.st_mtime_ns / 1e9 > _STILL_S:
        return kept[3]
    began = time.time()
    by_identity: dict[str, list[str]] = {}
    try:
        with os.scandir(base) as listing:
            for e in listing:
                name = e.name
                if name.startswith(".") or not name.endswith(SUFFIX):
                    continue
                identity, dash, rest = name.partition("-")
                if dash and "-" in rest:  # <identity>-<start ms>-<pid>.journal
                    by_identity.setdefault(identity, []).append(name)
    except OSError:
        return {}
    _LISTED[base] = (st.st_ino, st.st_mtime_ns, began, by_identity)
    return by_identity


def in_use(path: Path) -> bool:
    """Whether a run holds the journal's lock (it is running, in this kernel or another).

    Parameters
    ----------
    path : pathlib.Path
        A journal file.

    Returns
    -------
    bool
        True while some run holds its lock; False otherwise, also when it cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


# -- reading ----------------------------------------------------------------------------------
