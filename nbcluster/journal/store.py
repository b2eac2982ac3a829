"""The run journal: every finished item on disk as it reaches the kernel, the run identity
that names it, and what `--resume` takes from it.

A kernel that dies (out of memory, a laptop lid, a hub's idle culler) takes its `Results`
with it. The journal is the kernel's own append-only record of what had arrived, keyed by
what the run computes (`fingerprint`), so that a new kernel running the same cell on the
same inputs finds it and runs only what is missing (`prepare`).

Policy
------
- **Written where results arrive.** The engine hands each delivered batch to `Writer.write`.
  One batch is one record, appended to an ``O_APPEND`` file with one ``os.writev``: a
  ``kill -9`` of the kernel loses at most the batches that had not reached it. There is no
  fsync per batch: a journal protects against a dead kernel, not a dead machine.
- **Values as they came.** A batch of only numbers, strings, bytes and None is written as
  one pickle of the list, and so is a ``--persist`` batch's list of `handles.Recipe` (builtin
  data too; never the values). Any other batch has each value pickled on its own, so that a
  value that cannot be loaded later (its class is gone) re-runs that item alone, and one
  above ``nbcluster.journal.max-item-size`` is left out (and re-run) alone.
- **A journal never breaks a cell.** Any failure to write (a full disk, a folder that
  cannot be written) prints one warning line, and the run goes on unjournaled.
- **One writer at a time.** A run holds an exclusive ``flock`` on its journal while it runs
  (the kernel dying releases it). A run that resumes a journal appends to that same file,
  so it takes the lock first; a second kernel resuming it at once cannot.
- **Private.** The folder (``nbcluster.journal.path``, default ``<Jupyter data
  dir>/nbcluster/journal``) is made 0700, each run's folder in it 0700 and each journal
  0600: they hold results.
- **Found without listing the folder.** The journals of one identity are in a folder of
  their own, so a cell lists only that folder (usually one or two files), at its start
  (`prepare`) and, when it completes, at its end (`Writer.end`); only `runs` and the
  pruning list every run's folder (and the journals an earlier nbcluster kept in the
  journals' folder itself, which `--resume` no longer finds).
- **Bounded.** Before a journal is made, the oldest journals not in use are deleted until
  all fit in ``nbcluster.journal.max-size`` (never a ``--persist`` run's: its values may be
  kept on its cluster, and only `runs.forget` lets them go). A run that completes deletes
  the older journals of its identity (`Writer.end`): it holds every item they could give.
  A run's folder goes with its last journal.

File layout (one file per run, ``<identity>/<identity>-<start µs>-<pid>.journal``)::

    b"NBCLUSTER-JOURNAL\\n"
    one line of JSON: the `Header` (its "format" is checked before anything is unpickled)
    records, each a 4-byte little-endian length and a pickle of a `Batch` or an `End` (an int)

A journal is locked the moment it is made (``O_EXCL``), so a reader that finds it before
its header is written sees a running run. A reader stops at the first record cut short
(the kernel was killed mid-write) or damaged, keeping every whole record before it. The run's state is *running* while its lock is held
(`in_use`), else what its last `End` says (`Loaded.state`), else *killed*.

Identity
--------
`fingerprint` is the BLAKE2 hash of, in order: the code (the cell's source, or the function
run), the items after ``--over/--grid/--zip`` evaluation (and how they bind names),
``--seed``, and every captured notebook value. It is deliberately not the kernel, the
session or the notebook's cell id: a new kernel running the same cell on the same inputs
gets the same identity, and a change to any input gives another one, so ``--resume`` never
mixes results computed from different inputs.

All of it is hashed in one walk of one pickler (`_Hasher`), each value the same way wherever
it sits (a captured name, an item, a global a function reads):

- plain data by its pickle (protocol 5; the bytes of large arrays hashed in place, not
  copied); a large plain array captured by name by the content digest it is shipped by;
- a module by its name; a function or class imported from a module by its module and name;
- a function defined in the notebook (module ``__main__``) by its source text (its code,
  where there is no source), its defaults, its closure's values, and the value of every
  global its code reads (recursively: a notebook function it calls is hashed the same way);
  never its pickle, which holds the kernel's own file name for the cell
  (``/tmp/ipykernel_<pid>/...``) that a new kernel does not share;
- a class defined in the notebook by its name, its bases and its attributes (methods as
  functions above); an instance of it by its class so hashed and its state.

A run with an input that cannot be hashed at all has no identity and is not journaled: a
journal must never stop a run.

Resuming
--------
`prepare` runs once per run, in the kernel, after the job is made and before anything is
submitted. With journaling on (``nbcluster.journal.enabled``) it looks for journals of the
run's identity, newest first:

- with ``--resume``, it takes the newest one (its lock), loads its finished items and
  returns them; the run then submits only the others and appends to that same journal.
  Its one line says how many came back, from when, in what state, and how many run now
  (and why some finished ones run again: too large to journal, or a value that cannot be
  loaded now). A journal another kernel holds, or one this nbcluster cannot read
  (damaged, another format), gives one line saying so, and the run runs fresh in a journal
  of its own: the other journal is left as it was;
- without it, a newest journal that is unfinished (killed or interrupted, not in use) makes
  one hint line naming ``--resume``, and the run runs fresh;
- no journal: nothing is said, unless ``--resume`` asked for one: then one line says that
  none was found (or that the run cannot be journaled, or journaling is off), and the run
  runs every item.

`--persist` runs journal their handles' recipe, not their values (`handles.Recipe`); their
identity is their cell's with ``persist`` added, so a run with and one without never share
a journal. Their `--resume` asks the cluster which of those keys some worker still holds
(`handles.adopt`), takes those as the new run's handles, and runs the rest: a value lost
with its worker, or on another cluster, simply runs again, and the line says how many.

Worked example: 1000 items, the kernel killed after 734 arrived. The journal holds a header
and, say, 40 `Batch` records for 734 items, no `End`. A new kernel's ``--resume`` finds it
(same identity), takes its lock, loads the 734 values into the new run's state, submits the
other 266, prints ``nbcluster: resumed 734/1000 items from the run of 14:02 (killed);
running 266``, and appends their batches and the `End` to the same file.

A trial run's checkpoints are keyed by its identity too (`runs.attach_checkpoints`).
"""

from __future__ import annotations

import contextlib
import dis
import errno
import fcntl
import hashlib
import inspect
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
from types import CodeType, FunctionType, ModuleType, SimpleNamespace
from typing import Any, TypedDict

import cloudpickle
from dask.utils import parse_bytes

from nbcluster import config
from nbcluster._version import __version__
from nbcluster.persist import handles
from nbcluster.run.capture import Capture, read_only_array
from nbcluster.run.cell import Cell, Plan, describe
from nbcluster.worker.context import cell_value

FORMAT = 3  # bump when a record's shape changes: an older reader then refuses the file
MAGIC = b"NBCLUSTER-JOURNAL\n"
SUFFIX = ".journal"
#: Types whose values load in any process: a batch of only these is pickled as one list.
_ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_LEFT_OUT, _GONE = object(), object()  # a value not journaled; one that cannot be loaded now
VERSION = b"nbcluster-run-5"  # part of every identity: change it when what goes in changes
# A class's attributes that say where it was defined, or hold no content of its own.
_NOT_CLASS_CONTENT = frozenset({"__dict__", "__weakref__", "__module__", "__firstlineno__", "__static_attributes__"})


class Header(TypedDict):
    """The first line of a journal: what run it is, in JSON (readable without unpickling); its
    identity and when it started are in the journal's name."""

    format: int
    nbcluster: str  # the version that wrote it, for the refusal message
    total: int  # items in the run
    first_line: str  # the cell's first line (or the function's name), for `runs`
    cluster: str | None  # a --persist run: the cluster's name (or address) its values are on; else None


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

    at: float  # when it reached the kernel
    where: str  # "the cluster" or "the kernel" (--local)
    worker: tuple[str, str] | None  # (address, name) of the worker that ran it; None: the kernel ran it
    indices: Sequence[int]  # a range for a contiguous batch
    errors: dict[int, Failure]  # the items that failed, by item index: re-run on resume
    # One pickle of the list of values when they are builtin data only (--persist: of each item's
    # `handles.Recipe`, None where not published); else one pickle per value (None: left out, too large).
    values: bytes | list[bytes | None]
    outputs: dict[int, list[list[Any]]]  # what items printed, by item index


#: A start of the run ended (the run, or a retry): the record is the number of items done so far
#: (of the header's total).
End = int


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
    size: int = 0
    #: "complete", "failed" (every item ran, some raised), "interrupted" (an `End` with items not
    #: run) or "killed" (no `End` after the last batch); whether it is *running* is `in_use`'s to say.
    state: str = "killed"
    when: str = ""  # when the run started (its journal's name says), for messages (`when`)


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


def journals(identity: str | None = None, where: Path | None = None) -> list[Path]:
    """The journal files (of one identity), newest first.

    Parameters
    ----------
    identity : str, optional
        Only the journals of runs with this identity (`fingerprint`): its folder's, the
        only one listed. Every journal when None (every folder's, and those of an
        nbcluster that kept them all in one folder).
    where : pathlib.Path, optional
        The journals' folder; `folder()` when None.

    Returns
    -------
    list of pathlib.Path
        The journals, newest start first; [] when there is no such folder, or it cannot be read.
    """
    base = where or folder()  # a run's folder; or each one, and the journals an earlier nbcluster kept in `base` itself
    found = base.glob(f"{identity}/*{SUFFIX}") if identity else [*base.glob(f"*/*{SUFFIX}"), *base.glob(f"*{SUFFIX}")]
    return sorted(found, key=started, reverse=True)


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
        return int(path.name.rsplit("-", 2)[-2]) / 1e6
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
        self.path, self._broken, self._max_item = path, False, parse_bytes(config.get("journal.max-item-size"))
        self._fd: int | None = fd
        self.client: Any = None  # --persist: the run's client, to unpublish the values of the journals it supersedes
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
        # Builtin data only is one pickle of the list (loadable whatever the notebook defines); a --persist
        # batch's recipes always are, whatever their size.
        whole = held if held is not None else list(values) if set(map(type, values)) <= _ATOMS else None
        kept = None if whole is None else _pickled(whole, sys.maxsize if held is not None else self._max_item)
        with self._lock:
            self._append(Batch(at=time.time(), where=where, worker=ran_on, indices=indices[: len(values)],
                               errors=failed, outputs=outputs,
                               values=kept if kept is not None else [_pickled(v, self._max_item) for v in values]))

    def end(self, done: int, total: int) -> None:
        """The start is over: mark it so, and let go of the journal (another run may take it).

        Parameters
        ----------
        done : int
            Items done in the run so far.
        total : int
            Items in the run: when every one is done, the run's older journals that no run is
            using are deleted (with `client`, their values on the cluster are dropped first; a
            failure to drop them deletes none).
        """
        with self._lock:
            if self._fd is None:
                return
            self._append(End(done))
            self.release()  # and with it the journal's lock
        # Complete, it holds every item: an older journal of its identity (in its folder) can only be resumed to less.
        if done == total and (others := [p for p in self.path.parent.glob(f"*{SUFFIX}")
                                         if p != self.path and not in_use(p)]):  # fmt: skip
            with contextlib.suppress(Exception):  # a failure keeps them: their values stay listed by `runs`
                if self.client is not None:
                    handles.unpublish(self.client, [handles.dataset_prefix(p.name) for p in others])
                delete(others)

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
    why = f"in {path.parent.parent} ({e.strerror})" if isinstance(e, OSError) and e.strerror else f"({type(e).__name__}: {e})"
    return f"nbcluster: cannot write the run's journal {why}: the run goes on without a journal (--resume cannot pick it up)"


def create(identity: str, total: int, first_line: str, *, cluster: str | None = None, where: Path | None = None) -> Writer | None:
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
    where : pathlib.Path, optional
        The journals' folder; `folder()` when None.

    Returns
    -------
    Writer or None
        A writer holding the new journal's lock; None when it cannot be written (one
        warning line says why, and the run goes on).
    """
    base, now = where or folder(), time.time()
    path = base / identity / f"{identity}-{int(now * 1e6)}-{os.getpid()}{SUFFIX}"
    header = Header(format=FORMAT, nbcluster=__version__, total=total, first_line=first_line, cluster=cluster)
    try:
        if now - _pruned.get(bound := (base, parse_bytes(config.get("journal.max-size"))), 0.0) >= PRUNE_EVERY_S:
            _pruned[bound] = now
            prune(bound[1], base)  # first: it may delete this identity's folder with its last journal
        # Another kernel's prune deleting the run's folder between these two lines makes this run unjournaled, in one line.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(base, 0o700)  # a folder made by hand (or under a umask) must not show others the values
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


#: A run's start prunes the journals at most this often (seconds) under one size bound: a user's
#: many small journals cost a listing of each run's folder and a stat per journal, several ms, too
#: much for every cell. A new bound (``nbcluster.journal.max-size``) prunes at the next start.
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
        if total > limit and not in_use(path) and not ((header := read_header(path)) and header["cluster"]):
            old.append(path)
            total -= n
    return delete(old)


def delete(paths: list[Path]) -> list[Path]:
    """Delete journals, and each one's run folder once it holds no other.

    Parameters
    ----------
    paths : list of pathlib.Path
        Journal files.

    Returns
    -------
    list of pathlib.Path
        `paths` (one gone already, or not this user's to delete, is left as it is).
    """
    for path in paths:
        with contextlib.suppress(OSError):  # not this user's to delete; or another journal keeps the folder
            path.unlink(missing_ok=True)
            path.parent.rmdir()
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
        end = offset + 4 + int.from_bytes(data[offset : offset + 4], "little")
        if end > len(data):
            return
        yield memoryview(data)[offset + 4 : end]
        offset = end


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
        header, offset = parse_header(data, path)
        *_, last = _frames(data, offset)
        record = pickle.loads(last)
        return bool(isinstance(record, End) and record == header["total"])
    return False


def _values(record: Batch, values: bool, persist: bool) -> list[Any]:
    """The batch's values by position, `_LEFT_OUT` or `_GONE` where there is none to take."""
    if isinstance(record["values"], bytes):  # --persist: a recipe None was not published, nothing to adopt
        kept = pickle.loads(record["values"])
        return [_LEFT_OUT if r is None else r for r in kept] if persist else kept
    return [_LEFT_OUT if b is None else _unpickle(b) if values else None for b in record["values"]]


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
    loaded = Loaded(path, header, size=len(data), when=when(started(path)))
    done, missing = loaded.values, {_LEFT_OUT: set[int](), _GONE: set[int]()}
    ended: End | None = None  # the last record, if an End; None: the kernel died mid-run
    with contextlib.suppress(Exception):  # a damaged record (or one of the wrong shape): nothing after it is trusted
        for frame in _frames(data, offset):
            record = pickle.loads(frame)
            ended = record if isinstance(record, End) else None  # a retry's batch after an End: its End comes later
            if ended is not None:
                continue
            failed, ran_on, before = record["errors"], record["worker"], len(done)
            name = ran_on[1] if ran_on is not None else record["where"]
            for i, value in zip(record["indices"], _values(record, values, header["cluster"] is not None), strict=False):
                if i in failed:
                    loaded.failed[i] = {"error": failed[i]["error"], "params": failed[i]["params"],
                                        "worker": name if ran_on else None, "at": record["at"]}  # fmt: skip
                elif i not in done and (value is _LEFT_OUT or value is _GONE):
                    missing[value].add(i)
                elif i not in done:  # a second delivery (a re-run batch): the first one counted
                    done[i] = value
            if len(done) > before:  # counted per batch, not per item: `runs` reads every journal
                loaded.workers[name] += len(done) - before
            loaded.outputs.update((i, chunks) for i, chunks in record["outputs"].items() if i in done)
    loaded.left_out, loaded.unloadable = (len(missing[m] - done.keys()) for m in (_LEFT_OUT, _GONE))
    loaded.failed = {i: f for i, f in loaded.failed.items() if i not in done}
    if ended is not None:  # the last record is an End
        total, failed = header["total"], len(loaded.failed)
        loaded.state = "complete" if ended == total else "failed" if ended + failed >= total else "interrupted"
    return loaded


# -- identity -------------------------------------------------------------------------------
def fingerprint(plan: Plan, cell: Cell | None, fn: Any, seed: int | None, captured: Capture) -> str | None:
    """The run's identity as 32 hex digits; None if an input cannot be fingerprinted.

    Parameters
    ----------
    plan : Plan
        The run's items and how they bind names.
    cell : Cell or None
        The cell run, or None for a function.
    fn : callable or None
        The function run, when there is no cell.
    seed : int or None
        The run's ``--seed``.
    captured : Capture
        The notebook values the code takes with it.

    Returns
    -------
    str or None
        32 hex digits, the same for the same code, items, seed and captured values (and
        what the notebook functions among them read) in any kernel; None when something
        cannot be pickled to hash (the run is then not journaled).
    """
    code = cell.source.lstrip("\n") if cell is not None else fn
    binding = (plan.mode, plan.names, plan.target, seed)
    try:
        # A plain array's pickle holds nothing of the kernel's: it is hashed by the digest it is shipped by,
        # its content's, already computed.
        shipped = {id(v): bytes.fromhex(captured.large[n][1]) for n, v in captured.direct.items()
                   if n in captured.large and read_only_array(v)}  # fmt: skip
        return value_hash((VERSION, code, binding, plan.items, sorted(captured.direct.items())), shipped).hex()
    except Exception:  # an input no pickler can take: no identity, no journal
        return None


def value_hash(value: Any, seen: dict[int, bytes] | None = None) -> bytes:
    """The stable hash of one value, as the identity takes it (see the module docstring).

    Parameters
    ----------
    value : Any
        A captured value, a function, or the items.
    seen : dict, optional
        Hashes known by object id: the notebook functions and classes hashed so far in this
        hash (so that one calling itself ends), and the large arrays hashed by the digest they
        are shipped by (`fingerprint`).

    Returns
    -------
    bytes
        16 bytes: the hash of the value's pickle's hash and its out-of-band buffers' (the
        bytes of large arrays, hashed in place), the same in any kernel for the same value.

    Raises
    ------
    Exception
        The pickler's, when the value cannot be pickled.

    Examples
    --------
    >>> value_hash([1, 2]) == value_hash([1, 2]) != value_hash([1, 3])
    True
    """
    stream, buffers = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
    _Hasher(stream, {} if seen is None else seen, lambda b: buffers.update(b.raw())).dump(value)
    return hashlib.blake2b(stream.digest() + buffers.digest(), digest_size=16).digest()


class _Hasher(cloudpickle.Pickler):
    """cloudpickle into a hash (`hashed.update`), with notebook functions and classes replaced by
    their stable hash, and any object `seen` holds by its hash there (a shipped array's digest);
    out-of-band buffers go to `buffers`, hashed in place."""

    def __init__(self, hashed: Any, seen: dict[int, bytes], buffers: Callable[[pickle.PickleBuffer], None]):
        super().__init__(SimpleNamespace(write=hashed.update), protocol=5, buffer_callback=buffers)
        self.seen = seen

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, ModuleType):
            return str, (f"module {obj.__name__}",)
        notebook = getattr(obj, "__module__", None) == "__main__" and isinstance(obj, FunctionType | type)
        if notebook and id(obj) not in self.seen:  # a notebook function or class: what it is, not where it is kept
            self.seen[id(obj)] = f"recursive {obj.__qualname__}".encode()  # a function that calls itself
            if isinstance(obj, type):
                members = {k: v for k, v in vars(obj).items() if k not in _NOT_CLASS_CONTENT}
                parts: Any = ("class", obj.__qualname__, obj.__bases__, sorted(members.items()))
            else:
                reads = sorted((n, obj.__globals__[n]) for n in _globals_read(obj.__code__) if n in obj.__globals__)
                closure = [cell_value(c) for c in obj.__closure__ or ()]
                parts = ("function", _source(obj), obj.__defaults__, obj.__kwdefaults__, closure, reads)
            self.seen[id(obj)] = value_hash(parts, self.seen)
        if id(obj) in self.seen:  # a notebook function or class, or a shipped array (`fingerprint`)
            return str, (self.seen[id(obj)].hex(),)
        return super().reducer_override(obj)


def _globals_read(code: CodeType) -> set[str]:
    """The names `code` (and the code nested in it) loads as globals, and nothing else.

    Not ``co_names``, which also holds attribute names and the names a function imports
    for itself (``import os`` inside it): a kernel that happens to have a global ``os`` (or
    ``write``) would then hash differently from one that has not, and a new kernel would
    not find the journal of the same run.
    """
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    return names.union(*(_globals_read(c) for c in code.co_consts if isinstance(c, CodeType)))


def _source(fn: FunctionType) -> bytes | CodeType:
    """A notebook function's source; its code where there is none (a lambda typed at a prompt, code
    given to ``exec``), hashed whole: its file name (``<stdin>``, ``<string>``) is then no kernel's own."""
    with contextlib.suppress(OSError, TypeError):
        return inspect.getsource(fn).encode()
    return fn.__code__


def label(cell: Cell | None, fn: Any) -> str:
    """What `runs` shows of the run: the cell's first line, or the function's name.

    Parameters
    ----------
    cell : Cell or None
        The cell run, or None for a function.
    fn : Any
        The function run, when there is no cell.

    Returns
    -------
    str
        The cell's first non-blank line (at most 80 characters), else ``name()`` of the
        function.
    """
    if cell is not None:
        return next((line.strip()[:80] for line in cell.source.splitlines() if line.strip()), "")
    return f"{getattr(fn, '__qualname__', type(fn).__name__)}()"  # a callable: `distribute` refuses anything else


@dataclass
class Resumption:
    """What `prepare` decided: the writer (None: not journaled), the items taken over, a line."""

    writer: Writer | None = None
    values: dict[int, Any] = field(default_factory=dict)
    outputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    line: str | None = None
    publish: str | None = None  # --persist: the dataset prefix its new handles are published under


# -- resuming -------------------------------------------------------------------------------
def prepare(identity: str | None, total: int, shown: str, *, resume: bool, persist: bool, client: Any = None,
            cluster: str | None = None) -> Resumption:  # fmt: skip
    """Choose the run's journal, and load the earlier run's items with `resume`.

    Parameters
    ----------
    identity : str or None
        The run's identity (`fingerprint`); None when it has none (not journaled).
    total : int
        Items in the run.
    shown : str
        What listings show of the run (`label`).
    resume : bool
        ``--resume``: take over the newest journal of the same identity, if it can be.
    persist : bool
        ``--persist``: the journal holds the handles' recipes, and a resume adopts the values
        the cluster still holds.
    client : distributed.Client, optional
        With `persist`: the run's client (to adopt values, and to unpublish those of the older
        journals a complete run deletes).
    cluster : str, optional
        With `persist`: the cluster's name, for the journal's header (what `runs` shows).

    Returns
    -------
    Resumption
        The writer for this run's journal (the resumed one, a new one, or None), the items
        taken over with their output, and the line to print: what was resumed, why it could
        not be, or that an earlier run could be resumed.
    """
    on = str(config.get("journal.enabled")).strip().lower() == "true"  # a bool, or "true" from an environment variable
    if identity is None or not on:  # with --persist too: nothing is published
        why = ("this run is not journaled (--everywhere, a --persist run reading persisted results, or an input "
               "that cannot be pickled)" if on else "journaling is off (nbcluster.journal.enabled)")  # fmt: skip
        return Resumption(line=f"nbcluster: --resume: {why}: running all {total} items" if resume else None)
    if persist:  # another identity of the same length: a journal of values and one of recipes never match
        identity = hashlib.blake2b(f"{identity}:persist".encode(), digest_size=len(identity) // 2).hexdigest()
    found = journals(identity, base := folder())
    chosen = _take(found[0], total, client if persist else None) if resume and found else None
    if not isinstance(chosen, Resumption):  # a line says why the journal could not be taken, or that there is none
        line = (f"nbcluster: --resume: {chosen}: running all {total} items fresh" if chosen
                else f"nbcluster: --resume: no journal of this run (the same code, items and captured values) was "
                     f"found: running all {total} items" if resume else _hint(found[0], total) if found else None)
        chosen = Resumption(create(identity, total, shown, cluster=cluster if persist else None, where=base), line=line)
    if persist and chosen.writer is not None:
        chosen.publish = handles.dataset_prefix(chosen.writer.path.name)
        chosen.writer.client = client
    return chosen


def _take(path: Path, total: int, client: Any) -> Resumption | str:
    """Claim and load the journal (`client`: a --persist one, whose held values are adopted); why not, if it cannot be.

    Its line: ``nbcluster: resumed 734/1000 items from the run of 14:02 (killed); running 266``,
    naming also the finished items that run again: too large to journal (or, --persist, not
    published), whose value the cluster no longer holds, or that cannot be loaded now.
    """
    try:
        loaded, writer = load(path), Writer(path, _locked(path))
    except BlockingIOError:
        return "another run is using this cell's journal right now"
    except (Refused, OSError) as e:  # damaged, another format, or deleted meanwhile
        return f"the journal {path.name} cannot be read ({e.strerror or e})" if isinstance(e, OSError) else str(e)
    adopted, lost = loaded.values, 0
    if client is not None:
        try:
            adopted, lost = handles.adopt(client, loaded.values)
        except Exception:  # the scheduler cannot be asked: nothing is adopted, every item runs
            adopted, lost = {}, len(loaded.values)
    outputs = {i: o for i, o in loaded.outputs.items() if i in adopted}
    done = len(adopted)
    line = f"nbcluster: resumed {done}/{total} items from the run of {loaded.when} ({loaded.state}); running {total - done}"
    why = "not published on the cluster" if loaded.header["cluster"] else "over nbcluster.journal.max-item-size"
    counts = [(loaded.left_out, f"finished but {why}"), (lost, "finished whose value the cluster no longer holds"),
              (loaded.unloadable, "whose value cannot be loaded now (its class or module is gone)")]  # fmt: skip
    again = "; ".join(f"{n} {what}" for n, what in counts if n)  # `lost` (--persist) and `unloadable` never both
    return Resumption(writer, adopted, outputs, f"{line} ({again})" if again else line)


def _hint(path: Path, total: int) -> str | None:
    """The line naming ``--resume`` when the cell's last run did not finish; None otherwise."""
    if ended_complete(path) or in_use(path):
        return None  # a complete journal (the usual case) costs a read of its last record only
    with contextlib.suppress(Refused, OSError):
        loaded = load(path, values=False)
        if loaded.state != "complete" and (done := len(loaded.values)):
            how = f"had {len(loaded.failed)} failed" if loaded.state == "failed" else f"was {loaded.state}"
            return (f"nbcluster: the run of this cell at {loaded.when} {how} with {done}/{total} "
                    f"items done; running it fresh (--resume would run only the {total - done} missing)")  # fmt: skip
    return None

