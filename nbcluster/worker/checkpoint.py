"""Worker side of checkpoints: `nbcluster.checkpoint()` and its `save` / `load`.

An item of a trial run (``worker/trial.py``) saves to ``<folder>/<run identity>/<item>.ckpt``,
the folder and identity coming from the run's `TrialSpec` (``journal/runs.py`` sets
them in the kernel). The identity is the run's journal identity, made from what the run
computes, so ``--resume`` of the same cell, in a new kernel too, finds an unfinished
item's last checkpoint. A run that is not resumed starts with none (the kernel clears its
identity's folder first): a checkpoint never leaks into a fresh run.

A save is written to a temporary file (0600, in a 0700 folder) and renamed over the last,
so a kill in the middle leaves the previous checkpoint whole. Saving never fails the item:
an object that cannot be pickled, or a folder that cannot be written (full, read-only),
prints one warning line to the item's stderr (once a run on each worker) and `save`
returns False. Without a folder (outside a run, a run that is not journaled, ``--local``
without a journal) checkpoints are kept in this process's memory.

A ``--ranks N`` job (``worker/rank.py``) has one checkpoint for the whole job,
``<folder>/<run identity>/job.ckpt``: rank 0 saves it (a save from another rank keeps
nothing and returns False, as a DDP script saves on rank 0 only, all ranks holding the same
weights) and every rank loads it, so ``--resume`` of the job, whose ranks all run again,
continues from the last step rank 0 saved. Ranks on several hosts need
``nbcluster.checkpoint.path`` on a file system they share; without a folder, only rank 0's
process holds it.

This module imports only base modules: it runs on workers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import cloudpickle

from nbcluster.worker import rank, trial

_MEMORY: dict[tuple[str, int], bytes] = {}  # (topic or "", item) -> pickled, where no folder is set
_WARNED: set[str] = set()


class Checkpoint:
    """One item's checkpoint: `save` the state to continue from, `load` it back.

    Made by `checkpoint`; see the module docstring for where it is kept.
    """

    def __init__(self, path: Path | None, key: tuple[str, int], *, saves: bool = True):
        self.path = path
        self._key = key
        self._saves = saves  # False in a rank other than 0: the job's checkpoint is rank 0's

    def save(self, obj: Any) -> bool:
        """Keep `obj` as this item's checkpoint, replacing the last one.

        Parameters
        ----------
        obj : Any
            Anything cloudpickle can pickle: a dict of the epoch and the model's state, say.

        Returns
        -------
        bool
            True when it was kept; False (after one warning line) when `obj` cannot be
            pickled or the folder cannot be written, and False (silently) in a rank of a
            ``--ranks`` job other than rank 0. The item goes on either way.
        """
        if not self._saves:
            return False
        try:
            blob = cloudpickle.dumps(obj)
        except Exception as e:
            _warn(self._key[0], f"nbcluster.checkpoint().save(): cannot pickle a {type(obj).__name__} "
                  f"({type(e).__name__}: {e}); save plain data, such as a model's state_dict()")  # fmt: skip
            return False
        if self.path is None:
            _MEMORY[self._key] = blob
            return True
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.replace(temporary, self.path)
            finally:
                if temporary.exists():
                    temporary.unlink()
        except OSError as e:
            _warn(self._key[0], f"nbcluster.checkpoint().save(): cannot write {self.path.parent} "
                  f"({e.strerror or e}); the item goes on without checkpoints "
                  "(set nbcluster.checkpoint.path to a folder with room)")  # fmt: skip
            return False
        return True

    def load(self) -> Any | None:
        """This item's last saved checkpoint, or None when it has none yet.

        Returns
        -------
        Any or None
            What `save` was last given (by this item in this run, or by the same item of the
            run that ``--resume`` continues).
        """
        if self.path is None:
            blob = _MEMORY.get(self._key)
        else:
            try:
                blob = self.path.read_bytes()
            except OSError:
                return None
        return None if blob is None else cloudpickle.loads(blob)


def checkpoint() -> Checkpoint:
    """The current item's checkpoint: ``.save(obj)`` and ``.load()``.

    Keyed by the run's identity (what it computes, as its journal is) and the item's index:
    ``--resume`` of the same cell, in this kernel or a new one, reruns an unfinished item
    with its last checkpoint loadable, so a trial continues from its last saved epoch.
    Stored under ``nbcluster.checkpoint.path`` (default: beside the journals), 0600.
    In a ``--ranks`` job, one checkpoint for the whole job: saved by rank 0, loaded by every
    rank.

    Returns
    -------
    Checkpoint
        Outside a run, one kept in this process's memory.

    Examples
    --------
    >>> import nbcluster
    >>> ck = nbcluster.checkpoint()
    >>> ck.load() is None
    True
    >>> ck.save({"epoch": 3})
    True
    >>> ck.load()
    {'epoch': 3}
    """
    here = trial.current()
    if here is None:
        return Checkpoint(None, ("", -1))
    spec, index = here
    folder, identity = spec["checkpoints"], spec["identity"]
    job = rank.current()
    name, saves = ("job", job["rank"] == 0) if job is not None else (str(index), True)
    path = None if folder is None or identity is None else Path(folder) / identity / f"{name}.ckpt"
    return Checkpoint(path, (spec["topic"], -1 if job is not None else index), saves=saves)


def _warn(topic: str, line: str) -> None:
    if topic not in _WARNED:
        _WARNED.add(topic)
        print(line, file=sys.stderr)
