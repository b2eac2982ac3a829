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
A value set in config is a decision (an instructor's cap on a shared hub): ``--force`` does
not lift it, and the message says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
from dask.utils import format_bytes, parse_bytes

from nbcluster import config
from nbcluster.errors import BadArgument

#: Machine-derived caps on processes and threads, per core.
PER_CORE = 4
#: What `--force` allows at most, per core, when the config sets no cap of its own.
FORCE_CEILING = 64


class LimitExceeded(BadArgument):
    """A requested size is above a limit; the message names it and how to raise it."""


@dataclass(frozen=True)
class Machine:
    """What the limits are derived from (a parameter, so tests can describe any machine)."""

    cores: int
    memory: int

    @classmethod
    def here(cls) -> Machine:
        return cls(cores=psutil.cpu_count() or 1, memory=psutil.virtual_memory().total)


@dataclass(frozen=True)
class Limit:
    key: str  # the config key under nbcluster.limits.
    value: int | None  # None: no cap (memory under --force)
    configured: bool  # set in Dask config, so --force does not lift it
    derived: str  # how the machine value comes about, for the message


def limit(key: str, machine: Machine, *, force: bool = False) -> Limit:
    """The limit in force for `key` ("max-workers", "max-threads" or "max-memory")."""
    setting = config.get(f"limits.{key}")
    if setting is not None:
        value = (
            int(parse_bytes(setting))
            if key == "max-memory" and isinstance(setting, str)
            else config.count(f"limits.{key}", 1)
        )
        return Limit(key, value, True, "")
    if key == "max-memory":
        return Limit(key, None if force else machine.memory, False, "its RAM")
    per_core = FORCE_CEILING if force else PER_CORE
    return Limit(key, per_core * machine.cores, False, f"{per_core} x {machine.cores} cores")


def default_workers(machine: Machine | None = None) -> int:
    """CPU workers when none are asked for: `nbcluster.defaults.workers`, else one per core."""
    setting = config.count("defaults.workers")
    if setting is not None:
        return setting
    return (machine or Machine.here()).cores


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

    `request` is the user's own words for what was asked ("--workers 1000", "scale 500",
    "--max 64"); the message starts with it. GPU workers have one thread each.
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
        sizes["max-memory"] = (
            total,
            f"{format_bytes(total)} of worker memory ({processes} x {format_bytes(memory)})",
        )
    for key, (size, described) in sizes.items():
        cap = limit(key, machine, force=force)
        if cap.value is None or size <= cap.value:
            continue
        shown = format_bytes(cap.value) if key == "max-memory" else str(cap.value)
        setting = f"nbcluster.limits.{key}"
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
