"""`--resume`: a run's identity, which journal it writes, what it takes from an earlier one.

Identity
--------
`fingerprint` is the BLAKE2 hash of, in order: the code (the cell's source, or the function
run), the items after ``--over/--grid/--zip`` evaluation (and how they bind names),
``--seed``, and every captured notebook value. It is deliberately not the kernel, the
session or the notebook's cell id: a new kernel running the same cell on the same inputs
gets the same identity, and a change to any input gives another one, so ``--resume`` never
mixes results computed from different inputs.

Each value is hashed through one pickler (`_Hasher`), the same way wherever it sits (a
captured name, an item, a global a function reads):

- plain data by its pickle (protocol 5; the bytes of large arrays hashed in place, not
  copied);
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

- with ``--resume``, it takes the newest one (its lock: `store.claim`), loads its finished
  items and returns them; the run then submits only the others and appends to that same
  journal. Its one line says how many came back, from when, in what state, and how many
  run now (and why some finished ones run again: too large to journal, or a value that
  cannot be loaded now). A journal another kernel holds, or one this nbcluster cannot read
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

Worked example: a kernel running ``--persist`` over 8 items is killed after 6 arrived. Its
journal holds 6 recipes; the cluster holds 6 published datasets. A new kernel's
``--resume --persist`` finds the journal, adopts the 6 keys (no value moves), runs 2, and
prints ``nbcluster: resumed 6/8 items from the run of 14:02 (killed); running 2``.

Checkpoints (`attach_checkpoints`): each run identity has a folder
``<nbcluster.checkpoint.path>/<identity>/`` holding one file per item that saved
(``worker/checkpoint.py``). A run that is not ``--resume`` first deletes its identity's
folder, so a fresh run never loads an earlier run's checkpoints; each start deletes the
folders whose journal is gone, then the oldest until all fit in
``nbcluster.checkpoint.max-size``.
"""

from __future__ import annotations

import contextlib
import dis
import hashlib
import inspect
import io
import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FunctionType, ModuleType
from typing import Any

import cloudpickle

from nbcluster import config
from nbcluster._wire import TrialSpec
from nbcluster.journal import store
from nbcluster.persist import handles
from nbcluster.run.capture import Capture, read_only_array
from nbcluster.run.cell import Cell, Plan
from nbcluster.worker.context import cell_value

VERSION = b"nbcluster-run-3"  # part of every identity: change it when what goes in changes
# A class's attributes that say where it was defined, or hold no content of its own.
_NOT_CLASS_CONTENT = frozenset({"__dict__", "__weakref__", "__module__", "__firstlineno__", "__static_attributes__"})
NOT_FOUND = "no journal of this run (the same code, items and captured values) was found"


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
    try:
        parts = [("cell", cell.source.lstrip("\n").encode()) if cell is not None else ("function", value_hash(fn)),
                 ("binding", repr((plan.mode, plan.names, plan.target, plan.positional, seed)).encode()),
                 ("items", value_hash(plan.items))]  # fmt: skip
        for name, value in sorted(captured.direct.items()):
            # A plain array's pickle holds nothing of the kernel's: the digest it is shipped by is
            # its content's, already computed.
            shipped = name in captured.large and read_only_array(value)
            parts.append((f"module {name}", captured.modules[name].encode()) if name in captured.modules else
                         (f"value {name}", bytes.fromhex(captured.large[name][1]) if shipped else value_hash(value)))
    except Exception:  # an input no pickler can take: no identity, no journal
        return None
    h = hashlib.blake2b(VERSION, digest_size=16)
    for tag, data in parts:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def value_hash(value: Any, seen: dict[int, bytes] | None = None) -> bytes:
    """The stable hash of one value, as the identity takes it (see the module docstring).

    Parameters
    ----------
    value : Any
        A captured value, a function, or the items.
    seen : dict, optional
        The notebook functions and classes hashed so far in this hash (by id), so that one
        calling itself ends.

    Returns
    -------
    bytes
        16 bytes: the hash of the value's pickle (its length first) and of its out-of-band
        buffers, the same in any kernel for the same value.

    Raises
    ------
    Exception
        The pickler's, when the value cannot be pickled.

    Examples
    --------
    >>> value_hash([1, 2]) == value_hash([1, 2]) != value_hash([1, 3])
    True
    """
    out, buffers = io.BytesIO(), list[pickle.PickleBuffer]()
    _Hasher(out, {} if seen is None else seen, buffers).dump(value)
    h = hashlib.blake2b(len(out.getbuffer()).to_bytes(8, "little") + out.getbuffer(), digest_size=16)
    for b in buffers:
        h.update(b.raw())
    return h.digest()


class _Hasher(cloudpickle.Pickler):
    """cloudpickle, with notebook functions and classes replaced by their stable hash."""

    def __init__(self, file: Any, seen: dict[int, bytes], buffers: list[pickle.PickleBuffer]):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.seen = seen

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, ModuleType):
            return str, (f"module {obj.__name__}",)
        if getattr(obj, "__module__", None) == "__main__" and isinstance(obj, FunctionType | type):
            return str, (self._notebook(obj).hex(),)
        return super().reducer_override(obj)

    def _notebook(self, obj: Any) -> bytes:
        """The hash of a notebook function or class: what it is, not where its kernel keeps it."""
        if id(obj) in self.seen:
            return self.seen[id(obj)]
        self.seen[id(obj)] = f"recursive {obj.__qualname__}".encode()  # a function that calls itself
        if isinstance(obj, type):
            members = {k: v for k, v in vars(obj).items() if k not in _NOT_CLASS_CONTENT}
            parts: Any = ("class", obj.__qualname__, obj.__bases__, sorted(members.items()))
        else:
            reads = sorted((n, obj.__globals__[n]) for n in _globals_read(obj.__code__) if n in obj.__globals__)
            closure = [cell_value(c) for c in obj.__closure__ or ()]
            parts = ("function", _source(obj), obj.__defaults__, obj.__kwdefaults__, closure, reads)
        self.seen[id(obj)] = value_hash(parts, self.seen)
        return self.seen[id(obj)]


def _globals_read(code: CodeType) -> set[str]:
    """The names `code` (and the code nested in it) loads as globals, and nothing else.

    Not ``co_names``, which also holds attribute names and the names a function imports
    for itself (``import os`` inside it): a kernel that happens to have a global ``os`` (or
    ``write``) would then hash differently from one that has not, and a new kernel would
    not find the journal of the same run.
    """
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    return names.union(*(_globals_read(c) for c in code.co_consts if isinstance(c, CodeType)))


def _source(fn: FunctionType) -> bytes:
    """A notebook function's source; its code where there is none (a lambda typed at a prompt)."""
    with contextlib.suppress(OSError, TypeError):
        return inspect.getsource(fn).encode()
    return _code(fn.__code__)


def _code(code: CodeType) -> bytes:
    """Bytecode, names and constants, nested code included, without file names or positions."""
    consts = b"".join(_code(c) if isinstance(c, CodeType) else repr(c).encode() for c in code.co_consts)
    return code.co_code + repr((code.co_names, code.co_varnames)).encode() + consts


def label(cell: Cell | None, fn: Any) -> str:
    """What `runs` shows of the run: the cell's first line, or the function's name.

    Parameters
    ----------
    cell : Cell or None
        The cell run, or None for a function.
    fn : Any
        The function (or module) run, when there is no cell.

    Returns
    -------
    str
        The cell's first non-blank line (at most 80 characters), else ``name()`` of the
        function.
    """
    if cell is not None:
        return next((line.strip()[:80] for line in cell.source.splitlines() if line.strip()), "")
    return fn.__name__ if isinstance(fn, ModuleType) else f"{getattr(fn, '__qualname__', type(fn).__name__)}()"


@dataclass
class Resumption:
    """What `prepare` decided: the writer (None: not journaled), the items taken over, a line."""

    writer: store.Writer | None = None
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
    if identity is None or not store.enabled():  # with --persist too: nothing is published
        why = ("this run is not journaled (--everywhere, a --persist run reading persisted results, or an input "
               "that cannot be pickled)" if store.enabled() else "journaling is off (nbcluster.journal.enabled)")  # fmt: skip
        return Resumption(line=f"nbcluster: --resume: {why}: running all {total} items" if resume else None)
    if persist:  # another identity of the same length: a journal of values and one of recipes never match
        identity = hashlib.blake2b(f"{identity}:persist".encode(), digest_size=len(identity) // 2).hexdigest()
    found = store.journals(identity)
    chosen = _take(found[0], total, client if persist else None) if resume and found else None
    if not isinstance(chosen, Resumption):  # a line says why the journal could not be taken, or that there is none
        line = (f"nbcluster: --resume: {chosen}: running all {total} items fresh" if chosen
                else f"nbcluster: --resume: {NOT_FOUND}: running all {total} items" if resume
                else _hint(found[0], total) if found else None)  # fmt: skip
        chosen = Resumption(store.create(identity, total, shown, cluster=cluster if persist else None), line=line)
    if persist and chosen.writer is not None:
        chosen.publish = handles.dataset_prefix(chosen.writer.path.name)
        chosen.writer.before_superseding = lambda paths: handles.unpublish(
            client, [handles.dataset_prefix(p.name) for p in paths])  # fmt: skip
    return chosen


def _take(path: Path, total: int, client: Any) -> Resumption | str:
    """Claim and load the journal (`client`: a --persist one, whose held values are adopted); why not, if it cannot be."""
    try:
        loaded, writer = store.load(path), store.claim(path)
    except BlockingIOError:
        return "another run is using this cell's journal right now"
    except (store.Refused, OSError) as e:  # damaged, another format, or deleted meanwhile
        return f"the journal {path.name} cannot be read ({e.strerror or e})" if isinstance(e, OSError) else str(e)
    adopted, lost = loaded.values, 0
    if client is not None:
        try:
            adopted, lost = handles.adopt(client, loaded.values)
        except Exception:  # the scheduler cannot be asked: nothing is adopted, every item runs
            adopted, lost = {}, len(loaded.values)
    outputs = {i: o for i, o in loaded.outputs.items() if i in adopted}
    return Resumption(writer, adopted, outputs, resumed_line(loaded, total, len(adopted), lost))


def resumed_line(loaded: store.Loaded, total: int, done: int, lost: int) -> str:
    """``nbcluster: resumed 734/1000 items from the run of 14:02 (killed); running 266``.

    Parameters
    ----------
    loaded : Loaded
        The journal taken over.
    total : int
        Items in the run.
    done : int
        Items taken over: all of the journal's, or (``--persist``) those the cluster still
        held.
    lost : int
        ``--persist``: finished items whose value the cluster no longer holds.

    Returns
    -------
    str
        The line, naming also the finished items that run again (too large to journal, or
        their value cannot be loaded now).
    """
    line = f"nbcluster: resumed {done}/{total} items from the run of {loaded.when} ({loaded.state}); running {total - done}"
    why = "not published on the cluster" if loaded.header.get("persist") else "over nbcluster.journal.max-item-size"
    counts = [(loaded.left_out, f"finished but {why}"), (lost, "finished whose value the cluster no longer holds"),
              (loaded.unloadable, "whose value cannot be loaded now (its class or module is gone)")]  # fmt: skip
    again = "; ".join(f"{n} {what}" for n, what in counts if n)  # `lost` (--persist) and `unloadable` never both
    return f"{line} ({again})" if again else line


def _hint(path: Path, total: int) -> str | None:
    """The line naming ``--resume`` when the cell's last run did not finish; None otherwise."""
    if store.ended_complete(path) or store.in_use(path):
        return None  # a complete journal (the usual case) costs a read of its last record only
    with contextlib.suppress(store.Refused, OSError):
        loaded = store.load(path, values=False)
        if loaded.state != "complete" and (done := len(loaded.values)):
            how = f"had {len(loaded.failed)} failed" if loaded.state == "failed" else f"was {loaded.state}"
            return (f"nbcluster: the run of this cell at {loaded.when} {how} with {done}/{total} "
                    f"items done; running it fresh (--resume would run only the {total - done} missing)")  # fmt: skip
    return None


def attach_checkpoints(spec: TrialSpec, identity: str, *, resume: bool) -> None:
    """Key a trial run's checkpoints by `identity`; see the module docstring.

    Parameters
    ----------
    spec : TrialSpec
        The run's spec, changed in place (before its context is sent).
    identity : str
        The run's journal identity.
    resume : bool
        The run continues an earlier one: its checkpoints are kept for its items to load.
    """
    configured = config.get("checkpoint.path")
    base = Path(os.path.expanduser(str(configured))) if configured else store.folder().parent / "checkpoints"
    spec["identity"], spec["checkpoints"] = identity, str(base)
    if not resume:
        shutil.rmtree(base / identity, ignore_errors=True)
    runs: list[tuple[float, int, Path]] = []  # (its last save, as a save renames into it; its bytes; the folder)
    with contextlib.suppress(OSError):  # none yet, or not a folder: the items say so when they save
        for run in (p for p in base.iterdir() if p.is_dir() and p.name != identity):
            if not store.journals(run.name):  # pruned or forgotten: its checkpoints go with it
                shutil.rmtree(run, ignore_errors=True)
            else:  # one deleted meanwhile (another kernel's start) ends the scan: the next start goes on
                runs.append((run.stat().st_mtime, sum(f.stat().st_size for f in run.iterdir()), run))
    total, limit = sum(n for _, n, _ in runs), store.size("checkpoint.max-size")
    for _, n, run in sorted(runs):  # oldest first
        if total > limit:
            shutil.rmtree(run, ignore_errors=True)
            total -= n
