"""`--resume`: which journal a run writes, what it takes from an earlier one, and its checkpoints.

`prepare` runs once per run, in the kernel, after the job is made and before anything is
submitted. With journaling on (``nbcluster.journal.enabled``) it looks for journals of the
run's identity (`identity.py`), newest first:

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
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbcluster import config
from nbcluster._wire import TrialSpec
from nbcluster.journal import store
from nbcluster.journal.store import Loaded, Writer
from nbcluster.persist import handles


@dataclass
class Resumption:
    """What `prepare` decided: the writer (None: not journaled), the items taken over, a line."""

    writer: Writer | None = None
    values: dict[int, Any] = field(default_factory=dict)
    outputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    line: str | None = None
    publish: str | None = None  # --persist: the dataset prefix its new handles are published under


def prepare(
    identity: str | None, total: int, first_line: str, *, resume: bool, persist: bool, client: Any = None,
    cluster: str | None = None,
) -> Resumption:  # fmt: skip
    """Choose the run's journal, and load the earlier run's items with `resume`.

    Parameters
    ----------
    identity : str or None
        The run's identity (`identity.fingerprint`); None when it has none (not journaled).
    total : int
        Items in the run.
    first_line : str
        What listings show of the run.
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
        if not resume:
            return Resumption()
        why = (
            "this run is not journaled (--everywhere, a --persist run reading persisted results, "
            "or an input that cannot be pickled)"
            if store.enabled() else "journaling is off (nbcluster.journal.enabled)"
        )  # fmt: skip
        return Resumption(line=f"nbcluster: --resume: {why}: running all {total} items")
    if persist:  # another identity of the same length: a journal of values and one of recipes never match
        identity = hashlib.blake2b(f"{identity}:persist".encode(), digest_size=len(identity) // 2).hexdigest()
    base = store.folder()
    found = store.journals(identity, where=base)
    chosen = _take(found[0], total, client if persist else None) if resume and found else None
    if not isinstance(chosen, Resumption):
        line: str | None
        if chosen is not None:  # why the journal could not be taken
            line = f"nbcluster: --resume: {chosen}: running all {total} items fresh"
        elif resume:
            line = (f"nbcluster: --resume: no journal of this run (the same code, items and captured values) "
                    f"was found: running all {total} items")  # fmt: skip
        else:
            line = _hint(found[0], total) if found else None
        made = store.create(identity, total, first_line, cluster=cluster if persist else None, where=base)
        chosen = Resumption(made, line=line)
    if persist and chosen.writer is not None:
        chosen.publish = handles.dataset_prefix(chosen.writer.path.name)
        def unpublish(paths: list[Path]) -> None:
            handles.unpublish(client, [handles.dataset_prefix(p.name) for p in paths])

        chosen.writer.before_superseding = unpublish
    return chosen


def _take(path: Path, total: int, client: Any) -> Resumption | str:
    """Claim and load the journal (`client`: a --persist one, whose held values are adopted); why not, if it cannot be."""
    writer = store.claim(path)
    if writer is None:
        return "another run is using this cell's journal right now"
    try:
        loaded = store.load(path)
    except (store.Refused, OSError) as e:
        writer.release()
        return f"the journal {path.name} cannot be read ({e.strerror or e})" if isinstance(e, OSError) else str(e)
    if client is None:
        return Resumption(writer, loaded.values, loaded.outputs, resumed_line(loaded, total))
    try:
        adopted, lost = handles.adopt(client, loaded.values)
    except Exception:  # the scheduler cannot be asked: nothing is adopted, every item runs
        adopted, lost = {}, len(loaded.values)
    outputs = {i: o for i, o in loaded.outputs.items() if i in adopted}
    return Resumption(writer, dict(adopted), outputs, resumed_line(loaded, total, done=len(adopted), lost=lost))


def resumed_line(loaded: Loaded, total: int, *, done: int | None = None, lost: int = 0) -> str:
    """``nbcluster: resumed 734/1000 items from the run of 14:02 (killed); running 266``.

    Parameters
    ----------
    loaded : Loaded
        The journal taken over.
    total : int
        Items in the run.
    done : int, optional
        Items taken over, when not all of the journal's (``--persist``: those the cluster
        still held).
    lost : int
        ``--persist``: finished items whose value the cluster no longer holds.

    Returns
    -------
    str
        The line, naming also the finished items that run again (too large to journal, or
        their value cannot be loaded now).
    """
    done = len(loaded.values) if done is None else done
    line = f"nbcluster: resumed {done}/{total} items from the run of {loaded.when} ({loaded.state}); running {total - done}"
    why = "not published on the cluster" if loaded.header.get("persist") else "over nbcluster.journal.max-item-size"
    again = [
        f"{n} {what}" for n, what in [
            (loaded.left_out, f"finished but {why}"),
            (loaded.unloadable, "whose value cannot be loaded now (its class or module is gone)"),
            (lost, "finished whose value the cluster no longer holds"),
        ] if n
    ]  # fmt: skip
    return f"{line} ({'; '.join(again)})" if again else line


def _hint(path: Path, total: int) -> str | None:
    """The line naming ``--resume`` when the cell's last run did not finish; None otherwise."""
    if store.ended_complete(path) or store.in_use(path):
        return None
    try:
        loaded = store.load(path, values=False)
    except (store.Refused, OSError):
        return None
    done = len(loaded.values)
    if loaded.state == "complete" or done == 0:
        return None
    how = f"had {len(loaded.failed)} failed" if loaded.state == "failed" else f"was {loaded.state}"
    return (
        f"nbcluster: the run of this cell at {loaded.when} {how} with {done}/{total} "
        f"items done; running it fresh (--resume would run only the {total - done} missing)"
    )


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
    try:
        runs = [p for p in base.iterdir() if p.is_dir() and p.name != identity]
    except OSError:  # none yet, or not a folder: the items say so when they save
        return
    sizes: dict[Path, tuple[float, int]] = {}  # run -> (its last save, as a save renames into it; its bytes)
    for run in runs:
        if not store.journals(run.name):  # pruned or forgotten: its checkpoints go with it
            shutil.rmtree(run, ignore_errors=True)
            continue
        with contextlib.suppress(OSError):
            sizes[run] = (run.stat().st_mtime, sum(f.stat().st_size for f in run.iterdir()))
    total, limit = sum(size for _, size in sizes.values()), store._size("checkpoint.max-size")
    for run in sorted(sizes, key=lambda r: sizes[r][0]):  # oldest first
        if total <= limit:
            break
        shutil.rmtree(run, ignore_errors=True)
        total -= sizes[run][1]
