"""Kernel side of checkpoints: their folder, a run's start, and their space.

Each run identity (``identity.py``) has a folder ``<nbcluster.checkpoint.path>/<identity>/``
holding one file per item that saved (``worker/checkpoint.py``). Here:

- `attach` gives a trial run's spec its identity and folder; a run that is not
  ``--resume`` first deletes its identity's folder, so a fresh run never loads the
  checkpoints of an earlier one;
- `prune`, on each such start, deletes the folders whose journal is gone (pruned or
  forgotten with it), then the oldest folders until all fit in
  ``nbcluster.checkpoint.max-size``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from dask.utils import parse_bytes

from nbcluster import config
from nbcluster._wire import TrialSpec
from nbcluster.journal import store


def folder() -> Path:
    """The checkpoints' folder.

    Returns
    -------
    pathlib.Path
        ``nbcluster.checkpoint.path`` when set (``~`` expanded), else ``checkpoints`` beside
        the journals' folder.
    """
    configured = config.get("checkpoint.path")
    if configured:
        return Path(os.path.expanduser(str(configured)))
    return store.folder().parent / "checkpoints"


def attach(spec: TrialSpec, identity: str, *, resume: bool) -> None:
    """Key a trial run's checkpoints by `identity`, under `folder()`; see the module docstring.

    Parameters
    ----------
    spec : TrialSpec
        The run's spec, changed in place (before its context is sent).
    identity : str
        The run's journal identity.
    resume : bool
        The run continues an earlier one: its checkpoints are kept for its items to load.
    """
    base = folder()
    spec["identity"], spec["checkpoints"] = identity, str(base)
    if not resume:
        shutil.rmtree(base / identity, ignore_errors=True)
    prune(base, keep=identity)


def prune(base: Path, keep: str | None = None) -> list[str]:
    """Delete checkpoint folders whose journal is gone, then the oldest past the space limit.

    Parameters
    ----------
    base : pathlib.Path
        The checkpoints' folder.
    keep : str, optional
        An identity never deleted (the run starting now).

    Returns
    -------
    list of str
        The identities whose checkpoints were deleted.
    """
    try:
        runs = [p for p in base.iterdir() if p.is_dir()]
    except OSError:
        return []
    deleted = []
    journaled = {p.name for p in runs if store.journals(p.name)}
    sizes: dict[Path, tuple[float, int]] = {}
    for run in runs:
        if run.name == keep:
            continue
        if run.name not in journaled:
            shutil.rmtree(run, ignore_errors=True)
            deleted.append(run.name)
            continue
        with contextlib.suppress(OSError):
            files = list(run.iterdir())
            sizes[run] = (max((f.stat().st_mtime for f in files), default=0.0), sum(f.stat().st_size for f in files))
    limit = int(parse_bytes(config.get("checkpoint.max-size")))
    total = sum(size for _, size in sizes.values())
    for run in sorted(sizes, key=lambda r: sizes[r][0]):  # oldest first
        if total <= limit:
            break
        shutil.rmtree(run, ignore_errors=True)
        total -= sizes[run][1]
        deleted.append(run.name)
    return deleted
