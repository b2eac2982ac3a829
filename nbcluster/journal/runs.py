"""The journaled runs, listed, shown and forgotten: `%cluster runs [ID] [--forget]`, `nbcluster runs [ID] [--forget]`;
and what a trial run keeps beside its journal: its checkpoints.

A run's ID is the start of its identity (`store.fingerprint`): the journals of one cell run on
the same inputs share it, and forgetting an ID deletes them all. A journal in use (its run
is going on, here or in another kernel) is listed as *running* and never deleted.

A `--persist` run's journal holds recipes, and its values are on a cluster (published
datasets, `handles.py`): the listing asks that cluster what it still holds for each such
run (the HELD column: how many values, their size, on which cluster), and forgetting one
drops them there too (`handles.unpublish`), so a killed kernel's values do not stay on the
workers until the cluster stops.

Checkpoints (`attach_checkpoints`): each run identity has a folder
``<nbcluster.checkpoint.path>/<identity>/`` holding one file per item that saved
(``worker/checkpoint.py``). A run that is not ``--resume`` first deletes its identity's
folder, so a fresh run never loads an earlier run's checkpoints; each start deletes the
folders whose journal is gone (pruned or forgotten), then the oldest until all fit in
``nbcluster.checkpoint.max-size``.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dask.utils import parse_bytes

from nbcluster import config
from nbcluster._wire import TrialSpec
from nbcluster.errors import BadArgument
from nbcluster.journal import store
from nbcluster.persist import handles
from nbcluster.run.cell import human

ID_LENGTH = 8

#: A cluster's name (or address) -> a connected client of it, or None when it is not running:
#: the API layer's lookup (`nbcluster._current.client_of`), passed in by the faces.
ClientOf = Callable[[str], Any]


def table(client_of: ClientOf) -> str:
    """One line per journal, newest first: ID, when, the cell's first line, done/total, failed,
    size, what a --persist run holds on its cluster, state.

    Parameters
    ----------
    client_of : callable
        A cluster's name -> its client, or None when it is not running (`ClientOf`).

    Returns
    -------
    str
        The table with a line on ``--resume`` and forgetting; or one line saying there are no
        journaled runs, and where it looked.
    """
    client_of = functools.cache(client_of)  # each cluster asked once per listing
    rows = [["ID", "WHEN", "CELL", "DONE", "FAILED", "SIZE", "HELD", "STATE"]]
    for path, loaded in _read(store.journals()):
        rows.append([path.name[:ID_LENGTH], loaded.when, loaded.header["first_line"][:40],
                     f"{len(loaded.values)}/{loaded.header['total']}", str(len(loaded.failed)), human(loaded.size),
                     _held(path, loaded, client_of), "running" if store.in_use(path) else loaded.state]
                    if isinstance(loaded, store.Loaded)  # why an unreadable one is, in full, is `show`'s to say
                    else [path.name[:ID_LENGTH], store.when(store.started(path)),
                          "(another format, or damaged: show it for why)", "", "", "", "", "unreadable"])  # fmt: skip
    if len(rows) == 1:
        return f"No journaled runs (in {store.folder()})."
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    return "\n".join([
        *("  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip() for r in rows),
        "`%%distribute ... --resume` picks up a run; `%cluster runs ID` (`nbcluster runs ID`) shows its failed "
        "items; `%cluster runs ID --forget` deletes it.",
    ])  # fmt: skip


def _read(paths: list[Path]) -> Iterator[tuple[Path, store.Loaded | store.Refused]]:
    """Each journal read without its values, or why it cannot be; one deleted meanwhile is skipped."""
    for path in paths:
        with contextlib.suppress(OSError):
            try:
                yield path, store.load(path, values=False)
            except store.Refused as e:
                yield path, e


def _held(path: Path, loaded: store.Loaded, client_of: ClientOf) -> str:
    """``6 (1.2 MB) on pc``: what a --persist run's values hold on its cluster now; "" for other runs."""
    if not (name := loaded.header["cluster"]):
        return ""
    if (client := client_of(name)) is None:
        return f"? (cannot reach {name})"
    try:
        names = handles.published(client, [handles.dataset_prefix(path.name)])
    except Exception:
        return f"? ({name} did not answer)"
    kept = [r for r in loaded.values.values() if r and r["dataset"] in names]
    return f"{len(kept)} ({human(sum(r['held']['nbytes'] for r in kept))}) on {name}" if kept else f"none on {name}"


def show(ident: str) -> str:
    """One run's journals in full: counts, where its items ran, and each failed item's error.

    Parameters
    ----------
    ident : str
        A run ID as `table` shows it (or any start of one).

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
    blocks = []
    for path, loaded in _read(_named([ident])):
        if not isinstance(loaded, store.Loaded):
            blocks.append(f"{path.name[:ID_LENGTH]}: {loaded}")
            continue
        total, done, failed = loaded.header["total"], len(loaded.values), loaded.failed
        state = "running" if store.in_use(path) else loaded.state
        lines = [f"Run {path.name[:ID_LENGTH]} of {loaded.when} ({state}): {loaded.header['first_line']}",
                 f"  {done}/{total} done, {len(failed)} failed, {total - done - len(failed)} not run"]  # fmt: skip
        if loaded.workers:
            lines.append(f"  done where: {', '.join(f'{name} {n}' for name, n in loaded.workers.most_common())}")
        lines += ["  failed (--resume runs them again):"] if failed else []
        for i, f in sorted(failed.items()):
            params, on = f" ({f['params']})" if f["params"] else "", f" on worker {f['worker']}" if f["worker"] else ""
            lines.append(f"    item {i}{params}{on} at {time.strftime('%H:%M:%S', time.localtime(f['at']))}: {f['error']}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _named(ids: list[str] | None) -> list[Path]:
    """The journals of the runs `ids` (every journal for None); BadArgument for an ID that names none."""
    found = store.journals()
    if unknown := [i for i in ids or () if not any(p.name.startswith(i) for p in found)]:
        raise BadArgument(f"no journaled run {', '.join(map(repr, unknown))}: `runs` lists their IDs")
    return [p for p in found if ids is None or p.name.startswith(tuple(ids))]


def forget(ids: list[str], every: bool, client_of: ClientOf) -> str:
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

    Returns
    -------
    str
        How many were forgotten, and how many stayed because they are running now.

    Raises
    ------
    nbcluster.errors.BadArgument
        For both IDs and `every`, neither, or an ID that names no journal.
    """
    if every == bool(ids):
        raise BadArgument("give run IDs or --all, not both" if every else
                          "say which runs to forget: their IDs (from `runs`), or --all")  # fmt: skip
    named, client_of = _named(None if every else ids), functools.cache(client_of)
    idle, dropped = [p for p in named if not store.in_use(p)], 0  # one in use (running now) stays
    for path in idle:
        if (header := store.read_header(path)) and header["cluster"] and (client := client_of(header["cluster"])):
            with contextlib.suppress(Exception):  # a --persist run on a running cluster: its values are dropped there
                dropped += handles.unpublish(client, [handles.dataset_prefix(path.name)])
    deleted, busy = len(store.delete(idle)), len(named) - len(idle)
    line = f"Forgot {deleted} journaled run{'s' if deleted != 1 else ''}."
    line += f" Dropped {dropped} value{'s' if dropped != 1 else ''} kept on the cluster for --resume." if dropped else ""
    return line + (f" {busy} in use (running now) stayed." if busy else "")


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
    configured, journaled = config.get("checkpoint.path"), store.folder()
    base = Path(str(configured)).expanduser() if configured else journaled.parent / "checkpoints"
    spec["identity"], spec["checkpoints"] = identity, str(base)
    if not resume:
        shutil.rmtree(base / identity, ignore_errors=True)
    # Each other run's (whether its journal is gone, its last save (a save renames into it), its bytes, its folder).
    runs: list[tuple[bool, float, int, Path]] = []
    with contextlib.suppress(OSError):  # none yet, or not a folder: the items say so when they save
        for run in (p for p in base.iterdir() if p.is_dir() and p.name != identity):
            # One deleted meanwhile (another kernel's start) ends the scan: the next start goes on.
            runs.append((bool(store.journals(run.name, journaled)), run.stat().st_mtime,
                         sum(f.stat().st_size for f in run.iterdir()), run))  # fmt: skip
    total, limit = sum(n for *_, n, _ in runs), parse_bytes(config.get("checkpoint.max-size"))
    for kept, _, n, run in sorted(runs):  # those whose journal is gone first, then the oldest
        if not kept or total > limit:
            shutil.rmtree(run, ignore_errors=True)
            total -= n
