"""The journaled runs, listed and forgotten: `%distribute runs`, `nbcluster runs [--forget]`.

A run's ID is the start of its identity (`identity.py`): the journals of one cell run on
the same inputs share it, and forgetting an ID deletes them all. A journal in use (its run
is going on, here or in another kernel) is listed as *running* and never deleted.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from nbcluster.distribute import journal
from nbcluster.distribute.capture import human
from nbcluster.errors import BadArgument

ID_LENGTH = 8


def table(where: Path | None = None) -> str:
    """One line per journal, newest first: ID, when, the cell's first line, done/total, size, state.

    Parameters
    ----------
    where : pathlib.Path, optional
        The journals' folder; the configured one (`journal.folder`) when None.

    Returns
    -------
    str
        The table with a line on ``--resume`` and forgetting; or one line saying there are no
        journaled runs, and where it looked.
    """
    rows = []
    for path in journal.journals(where=where):
        ident = path.name[:ID_LENGTH]
        try:
            loaded = journal.load(path, values=False)
        except journal.Refused as e:
            rows.append((ident, journal._when(journal._started(path) / 1000), str(e), "", "", "unreadable"))
            continue
        except OSError:
            continue  # deleted while listing
        state = "running" if journal.in_use(path) else loaded.state
        first = loaded.header["first_line"]
        rows.append((ident, journal.when(loaded), first[:40], f"{len(loaded.values)}/{loaded.header['total']}",
                     human(loaded.size), state))  # fmt: skip
    if not rows:
        return f"No journaled runs (in {where or journal.folder()})."
    head = ("ID", "WHEN", "CELL", "DONE", "SIZE", "STATE")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    return "\n".join([*lines, "`%%distribute ... --resume` picks up a run; `nbcluster runs --forget ID` deletes one."])


def forget(ids: list[str], every: bool, where: Path | None = None) -> str:
    """Delete the journals of the runs `ids` (or `every` one); what was done, as one line.

    Parameters
    ----------
    ids : list of str
        Run IDs as `table` shows them (a journal's name starts with its ID).
    every : bool
        ``--all``: every journal.
    where : pathlib.Path, optional
        The journals' folder; the configured one when None.

    Returns
    -------
    str
        How many were forgotten, and how many stayed because they are running now.

    Raises
    ------
    nbcluster.errors.BadArgument
        For both IDs and `every`, neither, or an ID that names no journal.
    """
    if every and ids:
        raise BadArgument("give run IDs or --all, not both")
    if not every and not ids:
        raise BadArgument("say which runs to forget: their IDs (from `runs`), or --all")
    found = journal.journals(where=where)
    unknown = [i for i in ids if not any(p.name.startswith(i) for p in found)]
    if unknown:
        raise BadArgument(f"no journaled run {', '.join(map(repr, unknown))}: `runs` lists their IDs")
    deleted = busy = 0
    for path in found:
        if not every and not any(path.name.startswith(i) for i in ids):
            continue
        if journal.in_use(path):
            busy += 1
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            deleted += 1
    line = f"Forgot {deleted} journaled run{'s' if deleted != 1 else ''}."
    if busy:
        line += f" {busy} in use (running now) stayed."
    return line


def line_magic(words: list[str]) -> str | None:
    """`%distribute runs` and `%distribute forget ID...|--all`; None for any other line.

    Parameters
    ----------
    words : list of str
        The line magic's words.

    Returns
    -------
    str or None
        What to print: the table, or what `forget` did.

    Raises
    ------
    nbcluster.errors.BadArgument
        From `forget`, for IDs it cannot take.
    """
    if words[:1] == ["runs"] and len(words) == 1:
        return table()
    if words[:1] == ["forget"]:
        every = "--all" in words[1:]
        return forget([w for w in words[1:] if w != "--all"], every)
    return None
