"""`--resume`: which journal a run writes, and what it takes from an earlier one.

`prepare` runs once per run, in the kernel, after the job is made and before anything is
submitted. With journaling on (``nbcluster.journal.enabled``) it looks for journals of the
run's identity (`identity.py`), newest first:

- with ``--resume``, it takes the newest one (its lock: `journal.claim`), loads its finished
  items and returns them; the run then submits only the others and appends to that same
  journal. The one line it prints says how many came back, from when, in what state, and
  how many run now (and why some finished ones run again: too large to journal, or a value
  that cannot be loaded now). A journal another kernel holds, or one this nbcluster cannot
  read, gives one line saying so, and the run runs fresh in a journal of its own;
- without it, a newest journal that is unfinished (killed or interrupted, not in use) makes
  one hint line naming ``--resume``, and the run runs fresh;
- no journal: nothing is said, unless ``--resume`` asked for one: then one line says that
  none was found (or that the run cannot be journaled, or journaling is off), and the run
  runs every item.

`--persist` runs journal their handles' recipe, not their values (`handles.Recipe`: the
key, the dataset that keeps it on the scheduler, the worker's description); their identity
is their cell's with ``persist`` added, so a run with and one without never share a journal.
Their `--resume` asks the cluster which of those keys some worker still holds
(`handles.adopt`), takes those as the new run's handles, and runs the rest: a value lost
with its worker, on a cluster that restarted, or on another cluster, simply runs again.
The line then says how many of the finished items the cluster no longer held. A
`--persist` run that reads persisted handles (chained) is not journaled (its values are
made from handles the identity does not fingerprint, which a new kernel would not have),
nor are `--everywhere` runs (their items are the workers of the moment).

Worked example: a kernel running ``--persist`` over 8 items is killed after 6 arrived. Its
journal holds 6 recipes; the cluster holds 6 published datasets. A new kernel's
``--resume --persist`` finds the journal, adopts the 6 keys (no value moves), runs 2, and
prints ``nbcluster: resumed 6/8 items from the run of 14:02 (killed); running 2``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbcluster.journal import store as journal
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


def persisted(identity: str) -> str:
    """The identity of the ``--persist`` run of the cell whose identity is `identity`.

    Parameters
    ----------
    identity : str
        The run's identity without ``--persist`` (`identity.fingerprint`).

    Returns
    -------
    str
        Another identity of the same length: a journal of values and one of recipes never match.
    """
    return hashlib.blake2b(f"{identity}:persist".encode(), digest_size=len(identity) // 2).hexdigest()


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
    if identity is None or not journal.enabled():  # with --persist too: nothing is published
        if not resume:
            return Resumption()
        why = (
            "this run is not journaled (--everywhere, a --persist run reading persisted results, "
            "or an input that cannot be pickled)"
            if journal.enabled() else "journaling is off (nbcluster.journal.enabled)"
        )  # fmt: skip
        return Resumption(line=f"nbcluster: --resume: {why}: running all {total} items")
    if persist:
        identity = persisted(identity)
    base = journal.folder()
    found = journal.journals(identity, where=base)
    chosen: Resumption | None = None
    line = None
    if resume and found:
        chosen = _take(found[0], total, client if persist else None)
        if chosen is None:
            line = _busy_or_refused(found[0], total)
    elif found:
        line = _hint(found[0], total)
    elif resume:
        line = (
            f"nbcluster: --resume: no journal of this run (the same code, items and captured values) "
            f"was found: running all {total} items"
        )
    if chosen is None:
        made = journal.create(identity, total, first_line, cluster=cluster if persist else None, where=base)
        chosen = Resumption(made, line=line)
    if persist and chosen.writer is not None:
        chosen.publish = handles.dataset_prefix(chosen.writer.path.name)
        chosen.writer.before_superseding = _unpublishing(client)
    return chosen


def _unpublishing(client: Any) -> Any:
    """What a complete --persist run does before deleting older journals: drop their datasets."""

    def unpublish(paths: list[Path]) -> None:
        handles.unpublish(client, [handles.dataset_prefix(p.name) for p in paths])

    return unpublish


def _take(path: Any, total: int, client: Any) -> Resumption | None:
    """Claim and load the journal; `client`: a --persist journal, whose held values are adopted."""
    writer = journal.claim(path)
    if writer is None:
        return None
    try:
        loaded = journal.load(path)
    except (journal.Refused, OSError):
        writer.release()
        return None
    if loaded.header["total"] != total or bool(loaded.header.get("persist")) != (client is not None):
        writer.release()
        return None
    if client is None:
        return Resumption(writer, loaded.values, loaded.outputs, resumed_line(loaded, total))
    try:
        adopted, lost = handles.adopt(client, loaded.values)
    except Exception:  # the scheduler cannot be asked: nothing is adopted, every item runs
        adopted, lost = {}, len(loaded.values)
    outputs = {i: o for i, o in loaded.outputs.items() if i in adopted}
    return Resumption(writer, dict(adopted), outputs, resumed_line(loaded, total, done=len(adopted), lost=lost))


def resumed_line(loaded: Loaded, total: int, *, done: int | None = None, lost: int = 0) -> str:
    """``resumed 734/1000 items from the run of 14:02 (killed); running 266``.

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
    line = (
        f"nbcluster: resumed {done}/{total} items from the run of {journal.when(loaded)} "
        f"({loaded.state}); running {total - done}"
    )
    again = []
    if loaded.left_out:
        why = "not published on the cluster" if loaded.header.get("persist") else "over nbcluster.journal.max-item-size"
        again.append(f"{loaded.left_out} finished but {why}")
    if loaded.unloadable:
        again.append(f"{loaded.unloadable} whose value cannot be loaded now (its class or module is gone)")
    if lost:
        again.append(f"{lost} finished whose value the cluster no longer holds")
    if again:
        line += f" ({'; '.join(again)})"
    return line


def _busy_or_refused(path: Any, total: int) -> str:
    fresh = f"running all {total} items fresh"
    if journal.in_use(path):
        return f"nbcluster: --resume: another run is using this cell's journal right now: {fresh}"
    try:
        loaded = journal.load(path, values=False)
    except journal.Refused as e:
        return f"nbcluster: --resume: {e}: {fresh}"
    except OSError as e:
        return f"nbcluster: --resume: the journal {path.name} cannot be read ({e.strerror or e}): {fresh}"
    return f"nbcluster: --resume: the journal of {journal.when(loaded)} is of another run ({loaded.header['total']} items): {fresh}"


def _hint(path: Any, total: int) -> str | None:
    if journal.ended_complete(path) or journal.in_use(path):
        return None
    try:
        loaded = journal.load(path, values=False)
    except (journal.Refused, OSError):
        return None
    done = len(loaded.values)
    if loaded.state == "complete" or done == 0:
        return None
    how = f"had {len(loaded.failed)} failed" if loaded.state == "failed" else f"was {loaded.state}"
    return (
        f"nbcluster: the run of this cell at {journal.when(loaded)} {how} with {done}/{total} "
        f"items done; running it fresh (--resume would run only the {total - done} missing)"
    )
