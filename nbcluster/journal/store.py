"""The run journal: every finished item on disk as it reaches the kernel, for `--resume`.

A kernel that dies (out of memory, a laptop lid, a hub's idle culler) takes its `Results`
with it. The journal is the kernel's own append-only record of what had arrived, keyed by
what the run computes (`identity.py`), so that a new kernel running the same cell on the
same inputs finds it and runs only what is missing.

Policy
------
- **Written where results arrive.** The engine hands each delivered batch to `Writer.write`
  (the driver thread for cluster items, the main thread for ``--local`` ones). One batch is
  one record, written with one ``os.write`` on an ``O_APPEND`` file: a ``kill -9`` of the
  kernel loses at most the batches that had not reached it (the operating system keeps what
  was written; there is no fsync per batch, which would cost milliseconds each: a journal
  protects against a dead kernel, not a dead machine).
- **Cheap for tiny items.** A batch whose values are all builtin data (numbers, strings,
  lists, tuples, dicts, sets of them: what always loads again) is pickled as one list, at
  C speed (`worker/plain.py`), by the worker: its bytes are written as they came. A batch
  with any other value (a class of the user's, an array) has each value pickled on its own
  (protocol 5, arrays copied once), so that one value that cannot be loaded later (its
  class is gone) re-runs that item alone, and one above ``nbcluster.journal.max-item-size``
  is left out (and re-run) alone.
- **Written from the start.** A run's journal is made when the run starts, and each batch
  is appended as it arrives; completing the run supersedes the older journals of its
  identity.
- **A journal never breaks a cell.** Any failure to write (a full disk, a folder that
  cannot be written) prints one warning line, and the run goes on unjournaled.
- **One writer at a time.** A run holds an exclusive ``flock`` on its journal while it
  runs (the kernel dying releases it). A run that resumes a journal appends to that same
  file, so it takes the lock first; a second kernel resuming it at once cannot, and runs
  fresh in a journal of its own, saying so.

File layout (one file per run, ``<identity>-<start ms>-<pid>.journal``, mode 0600, in a
0700 folder: `nbcluster.journal.path`, default ``<Jupyter data dir>/nbcluster/journal``)::

    b"NBCLUSTER-JOURNAL\\n"
    one line of JSON: the `Header` (its "format" is checked before anything is unpickled)
    records, each a 4-byte little-endian length and a pickle of a `Batch` or an `End`

A journal appears under its name only once it is locked and holds its header: it is made under a hidden name (a leading dot) and linked (renamed, on a file system without
hard links). A reader stops at the first record that is cut short (the kernel was killed
in the middle of a write), keeping every whole record before it. The run's state, for
listings, is:
*running* while its lock is held, else the state of its last `End` record (*complete* when
every item was done, *interrupted* otherwise: cancelled, failed items, cluster lost), else
*killed* (the kernel died mid-run).

Worked example: 1000 items, the kernel killed after 734 arrived. The journal holds a
header and, say, 40 `Batch` records for 734 items, no `End`. A new kernel's ``--resume``
finds it (same identity), takes its lock, loads the 734 values into the new run's state,
submits the other 266, and appends their batches and the `End` to the same file.

Space: before a journal is created, the oldest journals are deleted (those not in use)
until all of them together fit in ``nbcluster.journal.max-size`` A run that completes deletes the
older journals of its identity (`superseded`): it holds every item they could give back.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pickle
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from nbcluster.journal.reading import (
    _LENGTH,
    FORMAT,
    MAGIC,
    SUFFIX,
    Batch,
    End,
    Failure,
    Header,
    Loaded,
    Refused,
    _remember_complete,
    _size,
    _started,
    _version,
    _when,
    enabled,
    ended_complete,
    folder,
    in_use,
    journals,
    load,
    read_header,
    when,
)
from nbcluster.run.plan import describe
from nbcluster.worker.plain import plain as worker_plain

# The journal's readers (resume, runs, the tests) know its reading side (`reading.py`) as `store` too.
__all__ = [
    "FORMAT",
    "HALF_MADE_S",
    "MAGIC",
    "PRUNE_S",
    "SUFFIX",
    "Loaded",
    "Refused",
    "Writer",
    "_size",
    "_started",
    "_when",
    "claim",
    "create",
    "enabled",
    "ended_complete",
    "failure",
    "folder",
    "in_use",
    "journals",
    "load",
    "prune",
    "read_header",
    "superseded",
    "when",
]


class Writer:
    """Appends one run's batches to its journal; see the module docstring.

    Made by `create` (a new journal) or `claim` (one being resumed). `write` never raises:
    the first failure prints one warning line and turns the writer off.
    """

    def __init__(self, path: Path, fd: int | None, max_item: int):
        self.path = path
        self._fd = fd
        self._max_item = max_item
        self.broken = False
        # --persist: told the older journals a complete run deletes, first (to unpublish their values).
        self.before_superseding: Callable[[list[Path]], None] | None = None
        # The driver thread writes; whichever thread ends the run closes: never both at once.
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        """True while the writer holds its journal: from `create`, `claim` or `reopen` to `end` or `release`."""
        return self._fd is not None

    def write(
        self,
        indices: Sequence[int],
        values: Sequence[Any],
        failed: dict[int, Failure],
        outputs: dict[int, list[list[Any]]],
        where: str,
        ran_on: tuple[str, str] | None = None,
        held: list[Any] | None = None,
    ) -> None:
        """Append one delivered batch (`values[j]` is item `indices[j]`'s value).

        Parameters
        ----------
        indices : Sequence of int
            The batch's items.
        values : Sequence
            Their values, in the same order (a failed item's is ignored).
        failed : dict of int to Failure
            The items of the batch that failed, by item index, each with its error's one line
            (`failure`): their values are not journaled, so a resume runs them again.
        outputs : dict of int to list
            What the items printed, by item index (as `worker.output` collects it).
        where : str
            ``"the cluster"`` or ``"the kernel"`` (``--local``).
        ran_on : tuple of (str, str), optional
            The address and name of the worker that ran the batch; None when the kernel ran
            it, or failed its items itself.
        held : list, optional
            A ``--persist`` batch: each item's `handles.Recipe` (None where it has none),
            journaled instead of `values`, which are handles.
        """
        with self._lock:
            if self._fd is None:
                return
            blob = self._record(indices, values, failed, outputs, where, ran_on, held)
            if blob is not None and self._fd is not None:
                try:
                    _append(self._fd, blob)
                except Exception as e:
                    self._give_up(e)

    def _record(
        self,
        indices: Sequence[int],
        values: Sequence[Any],
        failed: dict[int, Failure],
        outputs: dict[int, list[list[Any]]],
        where: str,
        ran_on: tuple[str, str] | None,
        held: list[Any] | None,
    ) -> bytes | None:
        """The batch's record, pickled; None (and no journal from now on) if it cannot be."""
        try:
            n = len(values)
            if n < len(indices):  # a stopped batch: the items it did not reach are not in it
                indices = indices[:n]
            plain, pickled = None, None
            if held is None:
                plain = worker_plain(values, self._max_item)
                if plain is None:
                    pickled = [self._pickle(v) for v in values]
            record: Batch = {
                "kind": "batch", "at": time.time(), "where": where, "worker": ran_on, "indices": indices,
                "errors": failed, "plain": plain, "pickled": pickled, "held": held, "outputs": outputs,
            }  # fmt: skip
            return pickle.dumps(record, protocol=5)
        except Exception as e:
            self._give_up(e)
            return None

    def _pickle(self, value: Any) -> bytes | None:
        try:
            blob = pickle.dumps(value, protocol=5)
        except Exception:
            try:  # a lambda, a notebook class instance pickle refuses
                blob = cloudpickle.dumps(value, protocol=5)
            except Exception:
                return None
        return blob if len(blob) <= self._max_item else None

    def end(self, done: int, total: int) -> None:
        """The start is over: mark it so, and let go of the journal (another run may take it).

        Parameters
        ----------
        done : int
            Items done in the run so far.
        total : int
            Items in the run: when every one is done, the run's older journals are deleted
            (`superseded`).
        """
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            try:
                record: End = {"kind": "end", "at": time.time(), "done": done, "total": total}
                _append(fd, pickle.dumps(record, protocol=5))
            except Exception as e:
                self._warn(e)
            finally:
                os.close(fd)  # releases the lock
        if done == total:
            if not self.broken:
                _remember_complete(self.path)
            superseded(self.path, self.before_superseding)

    def release(self) -> None:
        """Let go of the journal without marking it (a claim that was not used after all)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def reopen(self) -> None:
        """A retry: take the journal again (one line, and no journal, if another run has it)."""
        if self._fd is not None or self.broken or not self.path.exists():
            return  # still open, or gone
        try:
            fd = _lock(os.open(self.path, os.O_WRONLY | os.O_APPEND))
            with self._lock:
                self._fd = fd
        except BlockingIOError:
            print("nbcluster: another run is using this run's journal now: the retry is not journaled",
                  file=sys.stderr)  # fmt: skip
        except OSError as e:
            self._give_up(e)

    def _give_up(self, e: BaseException) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._warn(e)

    def _warn(self, e: BaseException) -> None:
        if not self.broken:
            self.broken = True
            print(f"nbcluster: {_journal_failed(e, self.path)}: the run goes on without a journal "
                  "(--resume cannot pick it up)", file=sys.stderr)  # fmt: skip

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


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
    line = f"{error.type_name}: {message[0]}" if message else str(error.type_name)
    return {"error": line, "params": describe(error.params)}


def _journal_failed(e: BaseException, path: Path) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"cannot write the run's journal in {path.parent} ({e.strerror})"
    return f"cannot write the run's journal ({type(e).__name__}: {e})"


def _append(fd: int, blob: bytes) -> None:
    head = _LENGTH.pack(len(blob))
    written = os.writev(fd, [head, blob])  # one system call, and no copy of a batch's megabytes
    if written < len(head) + len(blob):  # a short write (a signal, a nearly full disk): finish it or fail
        data = head + blob
        while written < len(data):
            written += os.write(fd, data[written:])


def _lock(fd: int) -> int:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ensure_folder(base: Path) -> None:
    with contextlib.suppress(OSError):
        st = os.stat(base)
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o777 == 0o700:
            return  # as it should be: one stat, where making it was three system calls and an exception
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if base.stat().st_mode & 0o777 != 0o700:
        os.chmod(base, 0o700)  # a folder made by hand (or by umask) must not show others the values


def create(
    identity: str, total: int, first_line: str, *, cluster: str | None = None, where: Path | None = None,
) -> Writer | None:  # fmt: skip
    """A new journal for a run (pruning old ones to fit); None, with one line, if it cannot be.

    Parameters
    ----------
    identity : str
        The run's identity (`identity.fingerprint`).
    total : int
        Items in the run.
    first_line : str
        What listings show of the run (`identity.first_line`).
    cluster : str, optional
        A ``--persist`` run: the name (or address) of the cluster its values stay on; its
        journal then holds recipes, not values.
    where : pathlib.Path, optional
        The journals' folder, as the caller just read it; `folder()` when None.

    Returns
    -------
    Writer or None
        A writer holding the new journal's lock; None when it cannot be written
        (one warning line says why, and the run goes on).
    """
    base = where or folder()
    started = time.time()
    path = base / f"{identity}-{int(started * 1000)}-{os.getpid()}{SUFFIX}"
    header: Header = {
        "format": FORMAT, "nbcluster": _version(), "identity": identity, "total": total,
        "first_line": first_line, "started": started, "persist": cluster is not None, "cluster": cluster,
    }  # fmt: skip
    data = MAGIC + json.dumps(header).encode() + b"\n"
    max_item = _size("journal.max-item-size")
    try:
        fd = _make(path, data, [])
    except Exception as e:
        print(f"nbcluster: {_journal_failed(e, path)}: the run goes on without a journal "
              "(--resume cannot pick it up)", file=sys.stderr)  # fmt: skip
        return None
    return Writer(path, fd, max_item)


def _make(path: Path, header: bytes, held: list[bytes]) -> int:
    """Create the journal `path` (pruning old ones to fit) with `header` and `held` records: its
    locked descriptor. Nothing is left behind when it fails.

    The file is made, locked and written under a hidden name, then linked to `path`: a
    reader (a listing, another kernel's ``--resume``, a prune) that found `path` unlocked
    and empty in between would take a starting run for a killed one. The link, like
    ``O_EXCL``, fails if `path` exists.
    """
    base = path.parent
    _ensure_folder(base)
    _prune_now_and_then(_size("journal.max-size"), base)
    hidden = base / f".{path.name}"
    fd = _lock(os.open(hidden, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        try:
            if os.write(fd, header) != len(header):
                raise OSError(28, "No space left on device")
            for record in held:
                _append(fd, record)
            try:
                os.link(hidden, path)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP) or path.exists():
                    raise
                os.rename(hidden, path)  # a file system without hard links: the name is this run's own
        finally:
            with contextlib.suppress(OSError):
                hidden.unlink()
    except OSError:
        os.close(fd)
        raise
    return fd


#: A process prunes a folder at most this often (seconds): pruning lists and stats every
#: journal there, a cost of every small cell that grows with the journals, and journals grow
#: only by what runs write meanwhile.
PRUNE_S = 30.0
_PRUNED: dict[tuple[Path, int], float] = {}  # (folder, limit) -> when this process last pruned it


def _prune_now_and_then(limit: int, base: Path) -> None:
    now = time.monotonic()
    last = _PRUNED.get((base, limit))
    if last is None or now - last >= PRUNE_S:
        _PRUNED[(base, limit)] = now
        prune(limit, base)


def claim(path: Path) -> Writer | None:
    """Take a journal to resume it (its lock); None if another run holds it.

    Parameters
    ----------
    path : pathlib.Path
        The journal to resume.

    Returns
    -------
    Writer or None
        A writer appending to it, holding its lock; None when another run holds it or it is
        gone.
    """
    try:
        fd = _lock(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError:  # BlockingIOError: in use; or it was just deleted
        return None
    return Writer(path, fd, _size("journal.max-item-size"))


def prune(limit: int, base: Path | None = None) -> list[Path]:
    """Delete the oldest journals not in use until the rest fit in `limit` bytes.

    A ``--persist`` run's journal is never pruned: its values may still be held on its
    cluster for ``--resume``, and only `runs.forget` (or a later complete run of the same
    cell) lets them go before deleting it. Such a journal holds recipes only, a few bytes
    an item. A hidden journal that a kernel killed while making it left behind (older than
    `HALF_MADE_S`) is deleted too.

    Parameters
    ----------
    limit : int
        The bytes all journals together may take (``nbcluster.journal.max-size``).
    base : pathlib.Path, optional
        The journals' folder; `folder()` when None.

    Returns
    -------
    list of pathlib.Path
        The journals deleted.
    """
    base = base or folder()
    deleted = _left_half_made(base)
    found = journals(where=base)  # newest first
    sizes = {}
    for path in found:
        with contextlib.suppress(OSError):
            sizes[path] = path.stat().st_size
    total = sum(sizes.values())
    for path in reversed(found):
        if total <= limit:
            break
        if path not in sizes or in_use(path) or _keeps_values(path):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            total -= sizes[path]
            deleted.append(path)
    return deleted


#: A hidden journal (`_make`'s, before its link) older than this was left by a kernel killed
#: while making it: one being made now is seconds old at most.
HALF_MADE_S = 600.0


def _left_half_made(base: Path) -> list[Path]:
    """Delete the hidden journals that kernels killed in `_make` left behind."""
    deleted = []
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(base) as listing:
        for e in listing:
            if not (e.name.startswith(".") and e.name.endswith(SUFFIX)):
                continue
            path = base / e.name
            with contextlib.suppress(OSError):
                if now - e.stat().st_mtime > HALF_MADE_S and not in_use(path):
                    path.unlink()
                    deleted.append(path)
    return deleted


def _keeps_values(path: Path) -> bool:
    """Whether `path` is a ``--persist`` run's journal (its header says so)."""
    try:
        with open(path, "rb") as f:
            header, _ = read_header(f.read(64 * 1024), path)
    except (OSError, Refused):
        return False
    return bool(header.get("persist"))


def superseded(path: Path, before: Callable[[list[Path]], None] | None = None) -> list[Path]:
    """Delete the other journals of `path`'s run that no run is using.

    Called when the run in `path` completes: it holds every item, so an older journal of the
    same identity (killed, interrupted, or complete) can only ever be resumed to less. Without
    this, every run of a cell would leave a journal until `max-size` pruned it.

    Parameters
    ----------
    path : pathlib.Path
        The journal of the run that completed.
    before : callable, optional
        Called with the journals about to be deleted, first (a ``--persist`` run unpublishes
        the values they left on the cluster); its failure deletes nothing.

    Returns
    -------
    list of pathlib.Path
        The journals deleted.
    """
    others = [p for p in journals(path.name.split("-", 1)[0], where=path.parent) if p != path and not in_use(p)]
    if others and before is not None:
        try:
            before(others)
        except Exception:
            return []  # their values stay listed by `runs`, to forget by hand
    deleted = []
    for other in others:
        with contextlib.suppress(OSError):
            other.unlink()
            deleted.append(other)
    return deleted


