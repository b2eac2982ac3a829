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
- no journal: nothing is said.

`--persist` runs are not journaled (their values stay on the workers; a journal of their
recipe is not built yet), nor are `--everywhere` runs (their items are the workers of
the moment).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nbcluster.distribute import journal
from nbcluster.distribute.journal import Loaded, Writer


@dataclass
class Resumption:
    """What `prepare` decided: the writer (None: not journaled), the items taken over, a line."""

    writer: Writer | None = None
    values: dict[int, Any] = field(default_factory=dict)
    outputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    line: str | None = None


def prepare(identity: str | None, total: int, first_line: str, *, resume: bool, persist: bool) -> Resumption:
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
        ``--persist``: such runs are never journaled.

    Returns
    -------
    Resumption
        The writer for this run's journal (the resumed one, a new one, or None), the items
        taken over with their output, and the line to print: what was resumed, why it could
        not be, or that an earlier run could be resumed.
    """
    if persist:
        line = "nbcluster: --persist runs are not journaled, so --resume has nothing to pick up: running every item"
        return Resumption(line=line if resume else None)
    if identity is None or not journal.enabled():
        return Resumption()
    found = journal.journals(identity)
    if resume and found:
        taken = _take(found[0], total, first_line)
        if taken is not None:
            return taken
        line = _busy_or_refused(found[0], total)
        return Resumption(writer=journal.create(identity, total, first_line), line=line)
    hint = _hint(found[0], total) if found else None
    return Resumption(writer=journal.create(identity, total, first_line), line=hint)


def _take(path: Any, total: int, first_line: str) -> Resumption | None:
    writer = journal.claim(path)
    if writer is None:
        return None
    try:
        loaded = journal.load(path)
    except (journal.Refused, OSError):
        writer.release()
        return None
    if loaded.header["total"] != total:
        writer.release()
        return None
    return Resumption(writer, loaded.values, loaded.outputs, resumed_line(loaded, total))


def resumed_line(loaded: Loaded, total: int) -> str:
    """``resumed 734/1000 items from the run of 14:02 (killed); running 266``.

    Parameters
    ----------
    loaded : Loaded
        The journal taken over.
    total : int
        Items in the run.

    Returns
    -------
    str
        The line, naming also the finished items that run again (too large to journal, or
        their value cannot be loaded now).
    """
    done = len(loaded.values)
    line = (
        f"nbcluster: resumed {done}/{total} items from the run of {journal.when(loaded)} "
        f"({loaded.state}); running {total - done}"
    )
    again = []
    if loaded.left_out:
        again.append(f"{loaded.left_out} finished but over nbcluster.journal.max-item-size")
    if loaded.unloadable:
        again.append(f"{loaded.unloadable} whose value cannot be loaded now (its class or module is gone)")
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
    if journal.in_use(path) or journal.ended_complete(path):
        return None
    try:
        loaded = journal.load(path, values=False)
    except (journal.Refused, OSError):
        return None
    done = len(loaded.values)
    if loaded.state == "complete" or done == 0:
        return None
    return (
        f"nbcluster: the run of this cell at {journal.when(loaded)} was {loaded.state} with {done}/{total} "
        f"items done; running it fresh (--resume would run only the {total - done} missing)"
    )
