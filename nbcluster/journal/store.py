"""The run journal: every finished item on disk as it reaches the kernel, for `--resume`.

A kernel that dies (out of memory, a laptop lid, a hub's idle culler) takes its `Results`
with it. The journal is the kernel's own append-only record of what had arrived, keyed by
what the run computes (`resume.fingerprint`), so that a new kernel running the same cell on the
same inputs finds it and runs only what is missing (`resume.py`).

Policy
------
- **Written where results arrive.** The engine hands each delivered batch to `Writer.write`.
  One batch is one record, appended to an ``O_APPEND`` file with one ``os.writev``: a
  ``kill -9`` of the kernel loses at most the batches that had not reached it. There is no
  fsync per batch: a journal protects against a dead kernel, not a dead machine.
- **Values as they came.** A batch of only numbers, strings, bytes and None is written as
  one pickle of the list. Any other batch has each value pickled
  on its own, so that a value that cannot be loaded later (its class is gone) re-runs that
  item alone, and one above ``nbcluster.journal.max-item-size`` is left out (and re-run)
  alone. A ``--persist`` batch holds each item's `handles.Recipe`, never its value.
- **A journal never breaks a cell.** Any failure to write (a full disk, a folder that
  cannot be written) prints one warning line, and the run goes on unjournaled.
- **One writer at a time.** A run holds an exclusive ``flock`` on its journal while it runs
  (the kernel dying releases it). A run that resumes a journal appends to that same file,
  so it takes the lock first (`claim`); a second kernel resuming it at once cannot.
- **Private.** The folder (``nbcluster.journal.path``, default ``<Jupyter data
  dir>/nbcluster/journal``) is made 0700 and each journal 0600: they hold results.
- **Bounded.** Before a journal is made, the oldest journals not in use are deleted until
  all fit in ``nbcluster.journal.max-size`` (never a ``--persist`` run's: its values may be
  kept on its cluster, and only `runs.forget` lets them go). A run that completes deletes
  the older journals of its identity (`Writer.end`): it holds every item they could give.

File layout (one file per run, ``<identity>-<start µs>-<pid>.journal``)::

    b"NBCLUSTER-JOURNAL\\n"
    one line of JSON: the `Header` (its "format" is checked before anything is unpickled)
    records, each a 4-byte little-endian length and a pickle of a `Batch` or an `End`

A journal is locked the moment it is made (``O_EXCL``), so a reader that finds it before
its header is written sees a running run. A reader stops at the first record cut short
(the kernel was killed mid-write) or damaged, keeping every whole record before it. The run's state is *running* while its lock is held
(`in_use`), else what its last `End` says (`Loaded.state`), else *killed*.

Worked example: 1000 items, the kernel killed after 734 arrived. The journal holds a header
and, say, 40 `Batch` records for 734 items, no `End`. A new kernel's ``--resume`` finds it
(same identity), takes its lock, loads the 734 values into the new run's state, submits the
other 266, and appends their batches and the `End` to the same file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pickle
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

import cloudpickle
from dask.utils import parse_bytes

from nbcluster import config
from nbcluster._version import __version__
from nbcluster.run.cell import describe

FORMAT = 2  # bump when a record's shape changes: an older reader then refuses the file
MAGIC = b"NBCLUSTER-JOURNAL\n"
SUFFIX = ".journal"
#: Types whose values load in any process: a batch of only these is pickled as one list.
_ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_LEFT_OUT, _GONE = object(), object()  # a value not journaled; one that cannot be loaded now


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
    plain: bytes | None  # the values as the worker pickled them, one list of builtin data
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
    """A journal this nbcluster cannot read (not a journal, damaged, another format): one line says so."""


@dataclass
class Loaded:
    """What a journal holds, read back (`load`)."""

    path: Path
    header: Header
    values: dict[int, Any] = field(default_factory=dict)  # item -> value (--persist: its Recipe), for done items
    outputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    failed: dict[int, Failed] = field(default_factory=dict)  # failed and never done, by item
    workers: Counter[str] = field(default_factory=Counter)  # worker name (or "the kernel") -> items done there
    left_out: int = 0  # done, but too large to journal (--persist: not published)
    unloadable: int = 0  # done, but the value cannot be loaded now (its class is gone)
    ended: End | None = None  # the last End record; None: the kernel died mid-run
    size: int = 0

    @property
    def state(self) -> str:
        """``"complete"``, ``"failed"`` (every item ran, some raised), ``"interrupted"`` (an
        `End` with items not run) or ``"killed"`` (no `End` after the last batch); whether it
        is *running* is `in_use`'s to say."""
        if self.ended is None:
            return "killed"
        done, total = self.ended["done"], self.header["total"]
        return "complete" if done == total else "failed" if done + len(self.failed) >= total else "interrupted"

    @property
    def when(self) -> str:
        """When the run started, for messages (`when`)."""
        return when(self.header["started"])


# -- the folder ---------------------------------------------------------------------------
def folder() -> Path:
    """The journals' folder (made 0700 on first write).

    Returns
    -------
    pathlib.Path
        ``nbcluster.journal.path`` when set (``~`` expanded), else
        ``<Jupyter data dir>/nbcluster/journal``.
    """
    if configured := config.get("journal.path"):
        return Path(os.path.expanduser(str(configured)))
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "nbcluster" / "journal"


def enabled() -> bool:
    """Whether runs are journaled: the ``nbcluster.journal.enabled`` setting.

    Returns
    -------
    bool
        The setting, a bool or the text ``"true"`` (from an environment variable).
    """
    return str(config.get("journal.enabled")).strip().lower() == "true"


def size(key: str) -> int:
    """A size setting, in bytes.

    Parameters
    ----------
    key : str
        The setting under ``nbcluster.``, as ``"journal.max-size"``; its value a number of
        bytes or a text like ``"64 MiB"``.

    Returns
    -------
    int
        Its bytes.
    """
    return int(parse_bytes(config.get(key)))


def journals(identity: str | None = None, where: Path | None = None) -> list[Path]:
    """The journal files (of one identity), newest first.

    Parameters
    ----------
    identity : str, optional
        Only the journals of runs with this identity (`fingerprint`); every journal
        when None.
    where : pathlib.Path, optional
        The folder to look in; `folder()` when None.

    Returns
    -------
    list of pathlib.Path
        The journals, newest start first; [] when the folder cannot be read.
    """
    base, prefix = where or folder(), f"{identity}-" if identity else ""
    with contextlib.suppress(OSError):  # no folder yet
        found = [base / n for n in os.listdir(base) if n.endswith(SUFFIX) and n.startswith(prefix) and n.count("-") >= 2]
        return sorted(found, key=started, reverse=True)
    return []


def started(path: Path) -> float:
    """When the run of the journal `path` started, read from its name.

    Parameters
    ----------
    path : pathlib.Path
        A journal file.

    Returns
    -------
    float
        Epoch seconds; 0 when the name holds none.
    """
    with contextlib.suppress(ValueError, IndexError):
        t = int(path.name.rsplit("-", 2)[-2])
        return t / 1e6 if t > 1e14 else t / 1e3  # microseconds; milliseconds in journals of nbcluster 0.1
    return 0.0


def when(t: float) -> str:
    """The time `t` for messages, in local time.

    Parameters
    ----------
    t : float
        Epoch seconds.

    Returns
    -------
    str
        ``14:02`` today, else ``Nov 30 14:02``.
    """
    lt = time.localtime(t)
    return time.strftime("%H:%M" if time.strftime("%Y%m%d", lt) == time.strftime("%Y%m%d") else "%b %d %H:%M", lt)


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
        os.close(_locked(path))  # closing releases the lock taken here
    except OSError as e:
        return isinstance(e, BlockingIOError)  # else: gone, or not ours to open
    return False


def _locked(path: Path, flags: int = 0) -> int:
    """The journal opened to append, holding its lock (BlockingIOError: another run holds it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- writing --------------------------------------------------------------------------------
class Writer:
    """Appends one run's batches to its journal; see the module docstring.

    Made by `create` (a new journal) or `prepare` (one being resumed). `write` never raises:
    the first failure prints one warning line and turns the writer off.
    """

    def __init__(self, path: Path, fd: int):
        self.path, self._broken, self._max_item = path, False, size("journal.max-item-size")
        self._fd: int | None = fd
        # --persist: told the older journals a complete run deletes, first (to unpublish their values).
        self.before_superseding: Callable[[list[Path]], object] | None = None
        self._lock = threading.RLock()  # the driver thread writes; whichever thread ends the run closes

    def write(self, indices: Sequence[int], values: Sequence[Any], failed: dict[int, Failure],
              outputs: dict[int, list[list[Any]]], where: str, ran_on: tuple[str, str] | None, held: list[Any] | None,
              ) -> None:  # fmt: skip
        """Append one delivered batch (`values[j]` is item `indices[j]`'s value).

        Parameters
        ----------
        indices : Sequence of int
            The batch's items (a stopped batch's values may be fewer: only those are written).
        values : Sequence
            Their values, in the same order (a failed item's is ignored).
        failed : dict of int to Failure
            The items of the batch that failed, by item index, each with its error's one line
            (`failure`): a resume runs them again.
        outputs : dict of int to list
            What the items printed, by item index.
        where : str
            ``"the cluster"`` or ``"the kernel"`` (``--local``).
        ran_on : tuple of (str, str) or None
            The address and name of the worker that ran the batch; None when the kernel ran
            it, or failed its items itself.
        held : list or None
            A ``--persist`` batch: each item's `handles.Recipe` (None where it has none),
            journaled instead of `values`, which are handles.
        """
        with self._lock:
            # A batch of builtin data only is one pickle (loadable whatever the notebook defines).
            plain = _pickled(list(values), self._max_item) if held is None and set(map(type, values)) <= _ATOMS else None
            each = [_pickled(v, self._max_item) for v in values] if held is None and plain is None else None
            self._append(Batch(kind="batch", at=time.time(), where=where, worker=ran_on, indices=indices[: len(values)],
                               errors=failed, plain=plain, pickled=each, held=held, outputs=outputs))  # fmt: skip

    def end(self, done: int, total: int) -> None:
        """The start is over: mark it so, and let go of the journal (another run may take it).

        Parameters
        ----------
        done : int
            Items done in the run so far.
        total : int
            Items in the run: when every one is done, the run's older journals that no run is
            using are deleted (`before_superseding` is told them first; its failure deletes none).
        """
        with self._lock:
            if self._fd is None:
                return
            self._append({"kind": "end", "at": time.time(), "done": done, "total": total})
            self.release()  # and with it the journal's lock
        # Complete, it holds every item: an older journal of its identity can only be resumed to less.
        if done == total and (others := [p for p in journals(self.path.name.split("-", 1)[0], where=self.path.parent)
                                         if p != self.path and not in_use(p)]):  # fmt: skip
            with contextlib.suppress(Exception):  # a failure keeps them: their values stay listed by `runs`
                if self.before_superseding is not None:
                    self.before_superseding(others)  # --persist: unpublish their values first
                _delete(others)

    def release(self) -> None:
        """Let go of the journal without marking it (a claim that was not used after all)."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)

    def reopen(self) -> None:
        """A retry: take the journal again (one line, and no journal, if another run has it)."""
        if self._fd is not None or self._broken or not self.path.exists():
            return
        try:
            self._fd = _locked(self.path)  # no other thread has it yet
        except BlockingIOError:
            print("nbcluster: another run is using this run's journal now: the retry is not journaled", file=sys.stderr)
        except OSError as e:
            self._give_up(e)

    def _append(self, record: Batch | End) -> None:
        if self._fd is None:
            return
        try:
            blob = pickle.dumps(record, protocol=5)
            _write(self._fd, [len(blob).to_bytes(4, "little"), blob])
        except Exception as e:
            self._give_up(e)

    def _give_up(self, e: BaseException) -> None:
        self.release()  # so it is said once: nothing is written, and `reopen` takes nothing, after it
        self._broken = True
        print(_cannot_write(e, self.path), file=sys.stderr)


def _pickled(value: Any, limit: int) -> bytes | None:
    """`value`'s pickle (cloudpickle's for a lambda or a notebook class); None if over `limit` or none."""
    for dumps in (pickle.dumps, cloudpickle.dumps):
        with contextlib.suppress(Exception):
            blob = dumps(value, protocol=5)
            return blob if len(blob) <= limit else None
    return None


def _write(fd: int, parts: list[bytes]) -> None:
    """One system call, and no copy of a batch's megabytes. A short write (a nearly full
    disk) ends the journal: a record cut short is where every reader stops."""
    if os.writev(fd, parts) != sum(map(len, parts)):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def failure(error: Any) -> Failure:
    """A failed item's journal entry: its error in one line, and its parameters.

    Parameters
    ----------
    error : nbcluster.run.tracebacks.ItemError
        The item's error, as the run's `Results` holds it.

    Returns
    -------
    Failure
        ``{"error": "ValueError: not yet", "params": "x=3"}``: the exception's type and the
        first line of its message, as the cell shows them; no traceback.
    """
    message = str(error.message).strip().splitlines()
    return {"error": f"{error.type_name}: {message[0]}" if message else str(error.type_name), "params": describe(error.params)}


def _cannot_write(e: BaseException, path: Path) -> str:
    why = f"in {path.parent} ({e.strerror})" if isinstance(e, OSError) and e.strerror else f"({type(e).__name__}: {e})"
    return f"nbcluster: cannot write the run's journal {why}: the run goes on without a journal (--resume cannot pick it up)"


def create(identity: str, total: int, first_line: str, *, cluster: str | None = None) -> Writer | None:
    """A new journal for a run (pruning old ones to fit); None, with one line, if it cannot be.

    Parameters
    ----------
    identity : str
        The run's identity (`fingerprint`).
    total : int
        Items in the run.
    first_line : str
        What listings show of the run (`label`).
    cluster : str, optional
        A ``--persist`` run: the name (or address) of the cluster its values stay on; its
        journal then holds recipes, not values.

    Returns
    -------
    Writer or None
        A writer holding the new journal's lock; None when it cannot be written (one
        warning line says why, and the run goes on).
    """
    base, now = folder(), time.time()
    path = base / f"{identity}-{int(now * 1e6)}-{os.getpid()}{SUFFIX}"
    header = Header(format=FORMAT, nbcluster=__version__, identity=identity, total=total, first_line=first_line,
                    started=now, persist=cluster is not None, cluster=cluster)  # fmt: skip
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(base, 0o700)  # a folder made by hand (or under a umask) must not show others the values
        if now - _pruned.get(bound := (base, size("journal.max-size")), 0.0) >= PRUNE_EVERY_S:
            _pruned[bound] = now
            prune(bound[1], base)
        fd = _locked(path, os.O_CREAT | os.O_EXCL)
        try:
            _write(fd, [MAGIC, json.dumps(header).encode() + b"\n"])
        except OSError:
            os.close(fd)
            path.unlink()
            raise
        return Writer(path, fd)
    except Exception as e:
        print(_cannot_write(e, path), file=sys.stderr)
        return None


def claim(path: Path) -> Writer:
    """Take a journal to resume it.

    Parameters
    ----------
    path : pathlib.Path
        The journal file.

    Returns
    -------
    Writer
        A writer appending to it, holding its lock.

    Raises
    ------
    OSError
        BlockingIOError when another run holds it; another when it is gone.
    """
    return Writer(path, _locked(path))


#: A run's start prunes its folder at most this often (seconds) under one size bound: a folder
#: of a user's many small journals costs a listing and a stat per journal, several ms, too much
#: for every cell. A new bound (``nbcluster.journal.max-size``) prunes at the next start.
PRUNE_EVERY_S = 30.0
_pruned: dict[tuple[Path, int], float] = {}  # (folder, bound) -> when this process last pruned it


def prune(limit: int, base: Path) -> list[Path]:
    """Delete the oldest journals not in use (never a ``--persist`` run's) until the rest fit in `limit` bytes.

    Parameters
    ----------
    limit : int
        The bytes all journals together may take (``nbcluster.journal.max-size``).
    base : pathlib.Path
        The journals' folder.

    Returns
    -------
    list of pathlib.Path
        The journals it deleted (or found deleted already), oldest first.
    """
    sizes = {}
    for path in reversed(journals(where=base)):  # oldest first
        with contextlib.suppress(OSError):  # deleted meanwhile
            sizes[path] = path.stat().st_size
    total, old = sum(sizes.values()), []
    for path, n in sizes.items():
        if total > limit and not in_use(path) and not ((header := read_header(path)) and header["persist"]):
            old.append(path)
            total -= n
    return _delete(old)


def _delete(paths: list[Path]) -> list[Path]:
    for path in paths:
        with contextlib.suppress(OSError):  # gone already, or not ours to delete
            path.unlink()
    return paths


# -- reading --------------------------------------------------------------------------------
def parse_header(data: bytes, path: Path) -> tuple[Header, int]:
    """The header of the journal `path` whose contents are `data`, and where its records start.

    Parameters
    ----------
    data : bytes
        The journal's contents, from its start (the whole header at least).
    path : pathlib.Path
        The journal file, for messages.

    Returns
    -------
    tuple of (Header, int)
        The header, and the offset of its first record in `data`.

    Raises
    ------
    Refused
        When its header is damaged (or it is no journal at all), or another version of
        nbcluster wrote it in another format; its message is the one line a user sees.
    """
    end, header = data.find(b"\n", len(MAGIC)), None
    with contextlib.suppress(ValueError):
        header = json.loads(data[len(MAGIC) : end]) if data.startswith(MAGIC) and end >= 0 else None
    if not isinstance(header, dict):
        raise Refused(f"the journal of {when(started(path))} has a damaged header")
    if header.get("format") != FORMAT:
        raise Refused(f"the journal of {when(started(path))} was written by nbcluster {header.get('nbcluster', '?')} "
                      f"(journal format {header.get('format')}), which this nbcluster {__version__} cannot read")
    return header, end + 1  # type: ignore[return-value]  # the format matched: its fields are this version's


def read_header(path: Path) -> Header | None:
    """The header of the journal `path`, read from its start only.

    Parameters
    ----------
    path : pathlib.Path
        The journal file.

    Returns
    -------
    Header or None
        None if it cannot be read or is no journal of this version.
    """
    with contextlib.suppress(OSError, Refused), open(path, "rb") as f:
        return parse_header(f.read(64 * 1024), path)[0]
    return None


def _frames(data: bytes, offset: int) -> Iterator[memoryview]:
    """Each whole record's bytes from `offset`; stops at one cut short (the kernel was killed mid-write)."""
    while offset + 4 <= len(data):
        length = int.from_bytes(data[offset : offset + 4], "little")
        offset += 4 + length
        if offset > len(data):
            return
        yield memoryview(data)[offset - length : offset]


def ended_complete(path: Path) -> bool:
    """Whether the journal's last record is an `End` with every item done (False if unreadable).

    Only that record is unpickled: a fresh run asks this of its cell's previous journal
    (`prepare`), and a complete one, the usual case, then costs no read of its values.

    Parameters
    ----------
    path : pathlib.Path
        The journal file.

    Returns
    -------
    bool
        True when its run ended with every item done.
    """
    with contextlib.suppress(Exception):
        data = path.read_bytes()
        *_, last = _frames(data, parse_header(data, path)[1])
        record = pickle.loads(last)
        return bool(record["kind"] == "end" and record["done"] == record["total"])
    return False


def _values(record: Batch, values: bool) -> list[Any]:
    """The batch's values by position, `_LEFT_OUT` or `_GONE` where there is none to take."""
    if record["plain"] is not None:
        return list(pickle.loads(record["plain"]))
    if record["held"] is not None:
        return [_LEFT_OUT if r is None else r for r in record["held"]]  # not published: nothing to adopt
    return [_LEFT_OUT if b is None else _unpickle(b) if values else None for b in record["pickled"] or ()]


def _unpickle(blob: bytes) -> Any:
    with contextlib.suppress(Exception):  # its class is gone, its module not installed: re-run it
        return pickle.loads(blob)
    return _GONE


def load(path: Path, *, values: bool = True) -> Loaded:
    """Read a journal; `values=False` counts the items without unpickling each item's value.

    Parameters
    ----------
    path : pathlib.Path
        The journal file.
    values : bool
        False to only count the items (for listings).

    Returns
    -------
    Loaded
        The header, the done items' values and outputs (an item's first delivery counts),
        the failed items, and the counts of items left out (too large) or that cannot be
        loaded now; every whole record up to one cut short or damaged.

    Raises
    ------
    Refused
        When the file is not a journal this nbcluster can read (see `parse_header`).
    OSError
        When the file cannot be read.
    """
    data = path.read_bytes()
    header, offset = parse_header(data, path)
    loaded = Loaded(path, header, size=len(data))
    done, missing = loaded.values, {_LEFT_OUT: set[int](), _GONE: set[int]()}
    with contextlib.suppress(Exception):  # a damaged record (or one of the wrong shape): nothing after it is trusted
        for frame in _frames(data, offset):
            record = pickle.loads(frame)
            loaded.ended = record if record["kind"] == "end" else None  # a retry's batch after an End: its End comes later
            if loaded.ended is not None:
                continue
            failed, ran_on, before = record["errors"], record["worker"], len(done)
            name = ran_on[1] if ran_on is not None else record["where"]
            for i, value in zip(record["indices"], _values(record, values), strict=False):
                if i in failed:
                    loaded.failed[i] = {"error": failed[i]["error"], "params": failed[i]["params"],
                                        "worker": name if ran_on else None, "at": record["at"]}  # fmt: skip
                elif i not in done and (value is _LEFT_OUT or value is _GONE):
                    missing[value].add(i)
                elif i not in done:  # a second delivery (a re-run batch): the first one counted
                    done[i] = value
            if len(done) > before:
                loaded.workers[name] += len(done) - before
            loaded.outputs.update((i, chunks) for i, chunks in record["outputs"].items() if i in done)
    loaded.left_out, loaded.unloadable = (len(missing[m] - done.keys()) for m in (_LEFT_OUT, _GONE))
    loaded.failed = {i: f for i, f in loaded.failed.items() if i not in done}
    return loaded
