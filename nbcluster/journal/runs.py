"""The journaled runs, listed, shown and forgotten: `%cluster runs [ID] [--forget]`, `nbcluster runs [ID] [--forget]`.

A run's ID is the start of its identity (`identity.py`): the journals of one cell run on
the same inputs share it, and forgetting an ID deletes them all. A journal in use (its run
is going on, here or in another kernel) is listed as *running* and never deleted.

A `--persist` run's journal holds recipes, and its values are on a cluster (published
datasets, `handles.py`): the listing asks that cluster what it still holds for each such
run (the HELD column: how many values, their size, on which cluster), and forgetting one
drops them there too (`handles.unpublish`), so a killed kernel's values do not stay on the
workers until the cluster stops.

`show(ID)` is one run's journal in full: where its items ran (per worker), and each failed
item with its parameters, worker, time and error line (what `--resume` runs again).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbcluster.errors import BadArgument
from nbcluster.journal import store as journal
from nbcluster.persist import handles
from nbcluster.run.capture import human

ID_LENGTH = 8

#: A cluster's name (or address) -> a connected client of it, or None when it is not running:
#: the API layer's lookup (`nbcluster._current.client_of`), passed in by the faces.
ClientOf = Callable[[str], Any]


def table(client_of: ClientOf, where: Path | None = None) -> str:
    """One line per journal, newest first: ID, when, the cell's first line, done/total, failed, size,
    what a --persist run holds on its cluster, state.

    Parameters
    ----------
    client_of : callable
        A cluster's name -> its client, or None when it is not running (`ClientOf`).
    where : pathlib.Path, optional
        The journals' folder; the configured one (`journal.folder`) when None.

    Returns
    -------
    str
        The table with a line on ``--resume`` and forgetting; or one line saying there are no
        journaled runs, and where it looked.
    """
    rows = []
    clusters = _Clusters(client_of)
    for path in journal.journals(where=where):
        ident = path.name[:ID_LENGTH]
        try:
            loaded = journal.load(path, values=False)
        except journal.Refused:
            # Why, in full, is `show`'s to say: a sentence would widen every row of the table.
            why = "(another format, or damaged: show it for why)"
            rows.append((ident, journal._when(journal._started(path) / 1000), why, "", "", "", "", "unreadable"))
            continue
        except OSError:
            continue  # deleted while listing
        state = "running" if journal.in_use(path) else loaded.state
        first = loaded.header["first_line"]
        rows.append((ident, journal.when(loaded), first[:40], f"{len(loaded.values)}/{loaded.header['total']}",
                     str(len(loaded.failed)), human(loaded.size), clusters.held(path, loaded), state))  # fmt: skip
    if not rows:
        return f"No journaled runs (in {where or journal.folder()})."
    head = ("ID", "WHEN", "CELL", "DONE", "FAILED", "SIZE", "HELD", "STATE")
    return "\n".join([
        *_columns(head, rows),
        "`%%distribute ... --resume` picks up a run; `%cluster runs ID` (`nbcluster runs ID`) shows its failed "
        "items; `%cluster runs ID --forget` deletes it.",
    ])  # fmt: skip


class _Clusters:
    """The clients of the clusters --persist journals name, each connected once per listing."""

    def __init__(self, client_of: ClientOf) -> None:
        self._client_of = client_of
        self._clients: dict[str, Any] = {}

    def client(self, name: str) -> Any:
        """A client of cluster `name`; None when it is not running (its values went with it)."""
        if name not in self._clients:
            self._clients[name] = self._client_of(name)
        return self._clients[name]

    def held(self, path: Path, loaded: journal.Loaded) -> str:
        """``6 (1.2 MB) on pc``: what a --persist run's values hold on its cluster now; "" for other runs."""
        name = loaded.header.get("cluster")
        if not loaded.header.get("persist") or not name:
            return ""
        client = self.client(name)
        if client is None:
            return f"? (cannot reach {name})"
        try:
            names = handles.published(client, [handles.dataset_prefix(path.name)])
        except Exception:
            return f"? ({name} did not answer)"
        kept = [r for r in loaded.values.values() if r and r["dataset"] in names]
        return f"{len(kept)} ({human(sum(r['held']['nbytes'] for r in kept))}) on {name}" if kept else f"none on {name}"


def _columns(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]


def show(ident: str, where: Path | None = None) -> str:
    """One run's journals in full: counts, where its items ran, and each failed item's error.

    Parameters
    ----------
    ident : str
        A run ID as `table` shows it (or any start of one).
    where : pathlib.Path, optional
        The journals' folder; the configured one when None.

    Returns
    -------
    str
        Per journal of the run (newest first): a line with when, the cell's first line and
        its state; the counts of done, failed and missing items; the items done per worker;
        and one line per failed item (``item 3 (x=3) on worker w1 at 14:02:07: ValueError:
        not yet``), which ``--resume`` runs again.

    Raises
    ------
    nbcluster.errors.BadArgument
        For an ID that names no journal.
    """
    found = [p for p in journal.journals(where=where) if p.name.startswith(ident)]
    if not found:
        raise BadArgument(f"no journaled run {ident!r}: `runs` lists their IDs")
    blocks = []
    for path in found:
        try:
            loaded = journal.load(path, values=False)
        except journal.Refused as e:
            blocks.append(f"{path.name[:ID_LENGTH]}: {e}")
            continue
        except OSError:
            continue  # deleted meanwhile
        blocks.append("\n".join(_shown(path, loaded)))
    return "\n\n".join(blocks)


def _shown(path: Path, loaded: journal.Loaded) -> list[str]:
    state = "running" if journal.in_use(path) else loaded.state
    total, done, failed = loaded.header["total"], len(loaded.values), loaded.failed
    lines = [
        f"Run {path.name[:ID_LENGTH]} of {journal.when(loaded)} ({state}): {loaded.header['first_line']}",
        f"  {done}/{total} done, {len(failed)} failed, {total - done - len(failed)} not run",
    ]
    if loaded.workers:
        ran = ", ".join(f"{name} {n}" for name, n in sorted(loaded.workers.items(), key=lambda kv: -kv[1]))
        lines.append(f"  done where: {ran}")
    if failed:
        lines.append("  failed (--resume runs them again):")
        for i in sorted(failed):
            f = failed[i]
            params = f" ({f['params']})" if f["params"] else ""
            on = f" on worker {f['worker']}" if f["worker"] else ""
            at = time.strftime("%H:%M:%S", time.localtime(f["at"]))
            lines.append(f"    item {i}{params}{on} at {at}: {f['error']}")
    return lines


def forget(ids: list[str], every: bool, client_of: ClientOf, where: Path | None = None) -> str:
    """Delete the journals of the runs `ids` (or `every` one); what was done, as one line.

    Parameters
    ----------
    ids : list of str
        Run IDs as `table` shows them (a journal's name starts with its ID).
    every : bool
        ``--all``: every journal.
    client_of : callable
        A cluster's name -> its client, or None when it is not running (`ClientOf`): where a
        --persist run's values are dropped.
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
    deleted = busy = dropped = 0
    clusters = _Clusters(client_of)
    for path in found:
        if not every and not any(path.name.startswith(i) for i in ids):
            continue
        if journal.in_use(path):
            busy += 1
            continue
        dropped += _drop_values(path, clusters)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            deleted += 1
    line = f"Forgot {deleted} journaled run{'s' if deleted != 1 else ''}."
    if dropped:
        line += f" Dropped {dropped} value{'s' if dropped != 1 else ''} kept on the cluster for --resume."
    if busy:
        line += f" {busy} in use (running now) stayed."
    return line


def _drop_values(path: Path, clusters: _Clusters) -> int:
    """A --persist journal's values on its cluster, unpublished (the workers free them); how many."""
    try:
        data = path.read_bytes()
        header, _ = journal.read_header(data, path)
    except (journal.Refused, OSError):
        return 0
    name = header.get("cluster")
    if not header.get("persist") or not name:
        return 0
    client = clusters.client(name)
    if client is None:
        return 0  # the cluster is not running: its values went with it
    try:
        return handles.unpublish(client, [handles.dataset_prefix(path.name)])
    except Exception:
        return 0
