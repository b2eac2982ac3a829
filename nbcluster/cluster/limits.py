"""How big a local cluster may be: one rule, checked before anything is spawned.

A typo (1000 for 10, or a form field with an extra zero) must not take a machine down, so
every way of sizing a local cluster - `start`, `scale`, `adapt --max`, from the magic, the
CLI, the REST API or Python - goes through `check`. It runs twice: in the requesting
process before a supervisor is asked for anything, and in the supervisor's own handlers, so a
direct scheduler RPC cannot bypass it.

The three limits, each a Dask config key under ``nbcluster.limits.``:

- ``max-workers``: worker processes (CPU and GPU workers together); default 4 x cores;
- ``max-threads``: threads of all workers together; default 4 x cores;
- ``max-memory``: memory per worker x workers, when ``--memory`` is given; default the
  machine's RAM (without ``--memory`` Dask gives each worker a share of RAM, which fits).

``null`` (the default) means the value derived from this machine. ``force=True`` (``--force``)
lifts the machine-derived values, up to `FORCE_CEILING` x cores processes and threads, which
nothing but the config passes: it keeps even a forced typo from filling the process table.
A value set in config is a decision: ``--force`` does not lift it, and the message says so.

Site ceilings. A value in the site config (``/etc/dask``, ``$DASK_ROOT_CONFIG``: see
`config.site`) is an administrator's, an instructor's cap on a shared hub: the limit in
force is the smallest of the site files' values and the user's own (their files,
``DASK_CONFIG``, ``dask.config.set``, what a kernel forwards to its supervisor), so a user
can lower it and never raise it, and the message names the site file. The same holds for
``nbcluster.defaults.workers`` (`default_workers`), and for ``nbcluster.limits.dashboard``,
a switch: ``false`` in a site file turns ``--dashboard`` off for everyone (`check_dashboard`).

This guards against mistakes, not against a user set on getting round it: the checks run in
the user's own processes, which the user controls. Hard limits are the spawner's (cgroups,
containers): see the docs' user guide, "On a shared JupyterHub".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil
from dask.utils import format_bytes, parse_bytes

from nbcluster import config
from nbcluster.errors import BadArgument, LimitExceeded

#: Machine-derived caps on processes and threads, per core.
PER_CORE = 4
#: What `--force` allows at most, per core, when the config sets no cap of its own.
FORCE_CEILING = 64


@dataclass(frozen=True)
class Machine:
    """What the limits are derived from (a parameter, so tests can describe any machine)."""

    cores: int
    memory: int

    @classmethod
    def here(cls) -> Machine:
        """This machine's cores and RAM.

        Returns
        -------
        Machine
            From psutil.
        """
        return cls(cores=psutil.cpu_count() or 1, memory=psutil.virtual_memory().total)


@dataclass(frozen=True)
class Limit:
    """One cap in force: its value, and where it comes from (for the refusal's message)."""

    key: str  # the config key under nbcluster.limits.
    value: int | None  # None: no cap (memory under --force)
    configured: bool  # set in Dask config, so --force does not lift it
    derived: str  # how the machine value comes about, for the message
    site: Path | None = None  # the site file whose value this is, if it is one


def _size(key: str, value: object, where: str) -> int:
    if key != "max-memory":
        number = config.as_count(f"limits.{key}", value, 1, where)
        assert number is not None
        return number
    try:
        # `value` is whatever the config file holds: int() of a wrong type raises the
        # TypeError turned into the message below, which is the check.
        return int(parse_bytes(value)) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise BadArgument(
            f"nbcluster.limits.max-memory is {value!r} in {where}: set it to a size such as 64GiB, "
            "or remove it for the default"
        ) from None


def configured(key: str) -> Limit | None:
    """The limit for `key` set in config: the smallest of the site files' values and the
    user's own (a tie names the site file).

    Parameters
    ----------
    key : str
        ``max-workers``, ``max-threads`` or ``max-memory``.

    Returns
    -------
    Limit or None
        None when no config sets it.
    """
    candidates: list[tuple[int, int, Path | None]] = [
        (_size(key, v.value, str(v.path)), 0, v.path) for v in config.site(f"limits.{key}")
    ]
    own = config.get(f"limits.{key}")
    if own is not None:
        candidates.append((_size(key, own, "Dask config"), 1, None))
    if not candidates:
        return None
    value, _, path = min(candidates, key=lambda c: c[:2])
    return Limit(key, value, True, "", path)


def limit(key: str, machine: Machine, *, force: bool = False) -> Limit:
    """The limit in force for `key` ("max-workers", "max-threads" or "max-memory").

    Parameters
    ----------
    key : str
        The limit's name.
    machine : Machine
        What the machine-derived limits come from.
    force : bool
        ``--force``: lifts the machine-derived limits (to a higher ceiling; memory: none),
        never a configured one.

    Returns
    -------
    Limit
        The configured limit if there is one, else the machine's.
    """
    chosen = configured(key)
    if chosen is not None:
        return chosen
    if key == "max-memory":
        return Limit(key, None if force else machine.memory, False, "its RAM")
    per_core = FORCE_CEILING if force else PER_CORE
    return Limit(key, per_core * machine.cores, False, f"{per_core} x {machine.cores} cores")


def default_workers(cores: int, threads: int = 1) -> int:
    """CPU workers of a start without ``--workers``.

    `nbcluster.defaults.workers` (a site file's value is the most a user's own can be),
    else one per `cores`; and never more than a limit set in config allows at `threads`
    threads each, so that a plain start on a hub whose cap is 2 gets 2 workers instead of
    a refusal.

    Parameters
    ----------
    cores : int
        The cores to use (one worker each by default).
    threads : int
        Threads per worker (``--threads``).

    Returns
    -------
    int
        At least 1.
    """
    values = [config.as_count("defaults.workers", v.value, 0, str(v.path)) for v in config.site("defaults.workers")]
    values.append(config.count("defaults.workers"))
    chosen = [v for v in values if v is not None]
    workers = min(chosen) if chosen else cores
    for key, per_worker in (("max-workers", 1), ("max-threads", threads)):
        cap = configured(key)
        if cap is not None and cap.value is not None:
            workers = min(workers, max(cap.value // per_worker, 1))
    return workers


def dashboard_allowed() -> Path | str | None:
    """Where ``--dashboard`` was turned off, if it was.

    Returns
    -------
    Path, str or None
        None if ``--dashboard`` may be used, else a site file's path, or "Dask config".
    """
    for v in config.site("limits.dashboard"):
        if not _switch(v.value, str(v.path)):
            return v.path
    if not _switch(config.get("limits.dashboard"), "Dask config"):
        return "Dask config"
    return None


def _switch(value: object, where: str) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"  # DASK_NBCLUSTER__LIMITS__DASHBOARD=false
    if value is None or isinstance(value, bool):
        return value is not False
    raise BadArgument(f"nbcluster.limits.dashboard is {value!r} in {where}: set it to true or false")


def check_dashboard() -> None:
    """Raise `LimitExceeded` if ``--dashboard`` is turned off (`nbcluster.limits.dashboard`)."""
    where = dashboard_allowed()
    if where is None:
        return
    by = f"by this machine's administrator in {where}" if isinstance(where, Path) else "in Dask config"
    raise LimitExceeded(
        f"--dashboard is turned off {by} (nbcluster.limits.dashboard: false): start without --dashboard; "
        "the live graphs of the notebook and the sidebar need no dashboard"
    )


def check(
    request: str,
    workers: int,
    threads: int = 1,
    memory: int | None = None,
    *,
    gpu_workers: int = 0,
    force: bool = False,
    machine: Machine | None = None,
) -> None:
    """Raise `LimitExceeded` if `workers` CPU workers (+ `gpu_workers`) break a limit.

    Each GPU worker counts as one thread, whatever its ``--gpu-threads``: GPU trials mostly
    wait on their device.

    Parameters
    ----------
    request : str
        The user's own words for what was asked ("--workers 1000", "scale 500",
        "--max 64"); the message starts with it.
    workers : int
        CPU workers.
    threads : int
        Threads per CPU worker.
    memory : int, optional
        Memory per worker, in bytes.
    gpu_workers : int
        GPU workers.
    force : bool
        ``--force`` (see `limit`).
    machine : Machine, optional
        Default: `Machine.here`.

    Raises
    ------
    LimitExceeded
        Naming the limit, where it comes from, and what to do.
    """
    machine = machine or Machine.here()
    processes = workers + gpu_workers
    total_threads = workers * threads + gpu_workers
    sizes = {
        "max-workers": (processes, f"{processes} worker processes"),
        "max-threads": (total_threads, f"{total_threads} threads ({workers} workers x {threads})"),
    }
    if memory is not None:
        total = memory * processes
        sizes["max-memory"] = (total, f"{format_bytes(total)} of worker memory ({processes} x {format_bytes(memory)})")
    for key, (size, described) in sizes.items():
        cap = limit(key, machine, force=force)
        if cap.value is None or size <= cap.value:
            continue
        shown = format_bytes(cap.value) if key == "max-memory" else str(cap.value)
        setting = f"nbcluster.limits.{key}"
        if cap.site is not None:
            raise LimitExceeded(
                f"{request} means {described}, above the limit of {shown} that this machine's administrator "
                f"set in {cap.site} ({setting}); neither your own config nor --force can raise it: ask for less"
            )
        if cap.configured:
            raise LimitExceeded(
                f"{request} means {described}, above the limit of {shown} set in Dask config ({setting}); "
                "--force does not lift a limit set in config: ask for less, or have the setting raised"
            )
        if force:
            raise LimitExceeded(
                f"{request} means {described}, above {shown} ({cap.derived}), the most --force allows; "
                f"set {setting} in Dask config to go further"
            )
        raise LimitExceeded(
            f"{request} means {described}, above this machine's limit of {shown} ({cap.derived}): "
            f"ask for less, add --force, or raise {setting} in Dask config"
        )
