"""Backend profiles: named places a cluster can run, kept in Dask's config.

A profile is ``nbcluster.profiles.NAME: {backend, description, options}`` (defaults in
``nbcluster.yaml``; users add theirs in ``~/.config/dask/*.yaml`` or ``DASK_`` variables).
`backend` picks a Dask deployment class (`BACKENDS`), and `options` are that class's keyword
arguments, so a profile reads like the Dask call it stands for: ``SLURMCluster(**options)``.

Profiles are read when asked for, never cached: a `dask.config.set` in a notebook shows in
the next `%cluster start`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from nbcluster import config
from nbcluster.errors import BadArgument


@dataclass(frozen=True)
class Backend:
    """Where a backend's deployment class lives, and the extra that installs it."""

    module: str
    cls: str
    extra: str | None = None
    #: Imported too, to check the extra is whole (SSHCluster lives in distributed but needs asyncssh).
    needs: str | None = None

    def check(self) -> None:
        """A missing package is one line with the pip command. Found, not imported: a
        front end checks this in any thread, and dask-jobqueue sets a signal handler on
        import, which only the main thread may (the supervisor imports it there)."""
        for package in (self.module.split(".")[0], self.needs):
            if package and importlib.util.find_spec(package) is None:
                raise BadArgument(f"this profile needs {package}: `pip install 'nbcluster[{self.extra}]'`")

    def load(self) -> type:
        """The deployment class (in the supervisor's main thread).

        Returns
        -------
        type
            e.g. `dask_jobqueue.SLURMCluster`.

        Raises
        ------
        BadArgument
            When its extra is not installed (the message names it).
        """
        self.check()
        cls: type = getattr(importlib.import_module(self.module), self.cls)
        return cls


def _jobqueue(cls: str) -> Backend:
    return Backend("dask_jobqueue", cls, "jobqueue")


BACKENDS: dict[str, Backend | None] = {
    "local": None,  # nbcluster's own SpecCluster (speccluster.py)
    "slurm": _jobqueue("SLURMCluster"),
    "pbs": _jobqueue("PBSCluster"),
    "sge": _jobqueue("SGECluster"),
    "lsf": _jobqueue("LSFCluster"),
    "htcondor": _jobqueue("HTCondorCluster"),
    "gateway": Backend("dask_gateway", "GatewayCluster", "gateway"),
    "ssh": Backend("distributed.deploy.ssh", "SSHCluster", "ssh", needs="asyncssh"),
    "kubernetes": Backend("dask_kubernetes.operator", "KubeCluster", "kubernetes"),
}
JOBQUEUE = ("slurm", "pbs", "sge", "lsf", "htcondor")


@dataclass(frozen=True)
class Profile:
    """A named place to run clusters (``nbcluster.profiles.NAME``): its backend and options."""

    name: str
    backend: str
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    #: How many workers a course's notebooks start on it (``workers:`` beside ``options``);
    #: None: the machine decides (`nbcluster.teaching.workers`).
    workers: int | None = None

    @property
    def local(self) -> bool:
        """Whether it runs on this machine (the ``local`` backend)."""
        return self.backend == "local"

    def check_installed(self) -> None:
        """Check the backend's extra is installed.

        Raises
        ------
        BadArgument
            When it is not (the message says what to install).
        """
        backend = BACKENDS[self.backend]
        if backend is not None:
            backend.check()

    def deployment_class(self) -> type:
        """The Dask deployment class of a non-local profile.

        Returns
        -------
        type
            What `Backend.load` returns.
        """
        backend = BACKENDS[self.backend]
        assert backend is not None, "the local backend has no Dask deployment class"
        return backend.load()

    def to_dict(self) -> dict[str, Any]:
        """What a listing shows (the options stay out: they may hold credentials).

        Returns
        -------
        dict
            ``name``, ``backend``, ``description``.
        """
        return {"name": self.name, "backend": self.backend, "description": self.description}


def _declared() -> dict[str, Any]:
    return dict(config.get("profiles") or {})


def _parse(name: str, raw: Any) -> Profile:
    where = f"profile {name!r} (nbcluster.profiles.{name} in Dask config)"
    if not isinstance(raw, dict):
        raise BadArgument(f"{where} must be a mapping with backend, description and options")
    backend = raw.get("backend", "local")
    if backend not in BACKENDS:
        raise BadArgument(f"{where} names an unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    options = raw.get("options") or {}
    if not isinstance(options, dict):
        raise BadArgument(f"{where}: options must be a mapping of keyword arguments, not {options!r}")
    workers = raw.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise BadArgument(f"{where}: workers must be a whole number of at least 1, not {workers!r}")
    return Profile(name, backend, str(raw.get("description") or ""), dict(options), workers)


def get(name: str | None) -> Profile:
    """The profile called `name`, checked.

    Parameters
    ----------
    name : str or None
        A profile's name; None for ``local``.

    Returns
    -------
    Profile
        Parsed from Dask config.

    Raises
    ------
    BadArgument
        For an unknown name (listing the known ones) or a malformed profile.
    """
    name = name or "local"
    declared = _declared()
    if name not in declared:
        raise BadArgument(
            f"unknown profile {name!r}: known profiles are {', '.join(sorted(declared)) or 'none'}; "
            "define it under nbcluster.profiles in Dask config (see `nbcluster profiles`)"
        )
    return _parse(name, declared[name])


def all() -> list[Profile]:
    """Every usable profile, ``local`` first (see `checked` for the malformed ones).

    Returns
    -------
    list of Profile
        The profiles of Dask config that parse.
    """
    return checked()[0]


def checked() -> tuple[list[Profile], list[str]]:
    """The usable profiles, ``local`` first, and what is wrong with each malformed one: a
    listing shows those too, rather than leave a profile the user wrote out silently.

    Returns
    -------
    tuple of (list of Profile, list of str)
        The profiles, and one message per malformed one.
    """
    found, mistakes = [], []
    for name, raw in _declared().items():
        try:
            found.append(_parse(name, raw))
        except BadArgument as e:
            mistakes.append(str(e))
    return sorted(found, key=lambda p: (p.name != "local", p.name)), mistakes
