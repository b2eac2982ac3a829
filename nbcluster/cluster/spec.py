"""`ClusterSpec`: what a user asks for when starting a cluster, validated once.

Every front end (magic, CLI, sidebar form, Python API) builds a `ClusterSpec` and nothing
else: validation lives here so they all reject the same inputs with the same message. The
start options are declared here once (`START_OPTIONS`: the `%cluster`/CLI flags, their
help, the REST body's fields), and so are the other rules every front end applies: counts
(`parse_count`), adaptive bounds (`parse_bounds`) and the cluster-name rule
(`NAME_PATTERN`, which the REST routes match and the sidebar gets from the server).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

from dask.utils import format_bytes, parse_bytes

from nbcluster._wire import SpecFields
from nbcluster.cluster import limits, profiles
from nbcluster.errors import BadArgument

#: A cluster name, as a regular expression that Python and JavaScript read alike: the
#: REST routes match it, and the sidebar gets it from the server for its instant hint.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
NAME_RULE = "use letters, digits, '-', '_' or '.', starting with a letter or digit (at most 63 characters)"
DEFAULT_NAME = "local"
GPU_BACKENDS = ("builtin", "dask-cuda")
#: Threads per GPU of a GPU worker by default: four `--gpus 0.25` items share one GPU at once.
#: An item asking a whole GPU still runs alone on it (the `GPU` resource admits one).
GPU_THREADS = 4


@dataclass(frozen=True)
class StartOption:
    """One option of a cluster start: `--FLAG` for `%cluster start` and `nbcluster start`,
    `FIELD` of `ClusterSpec.from_user` and of the REST start body (the flag with `_`)."""

    flag: str
    help: str
    #: Placeholder of the value; empty for a switch (true/false).
    metavar: str = ""

    @property
    def field(self) -> str:
        """The option's name as a Python argument and REST field (``gpu_backend``)."""
        return self.flag.replace("-", "_")

    @property
    def switch(self) -> bool:
        """Whether the option takes no value (``--keep``)."""
        return not self.metavar


#: The one line an old spelling of the GPU-workers option prints (for one release).
RENAMED_GPUS = (
    "`gpus` of a cluster start is now `gpu_workers` (`--gpu-workers` in `%cluster start`): GPU workers "
    "to start; `--gpus` of `%%distribute` stays GPUs per item. The old name goes in the next release."
)
FORCE_HELP = "go past the limits derived from this machine (not those set in config)"

#: The start options, declared once: the `%cluster`/CLI parser, their `--help`, the REST
#: body's fields and the docs' option reference are all made from this.
START_OPTIONS = (
    StartOption(
        "workers", "CPU worker processes (default: one per core, or `nbcluster.defaults.workers`)", "N"
    ),
    StartOption("threads", "threads per worker (default: 1)", "T"),
    StartOption("memory", "memory limit per worker, e.g. 4GiB (default: a share of RAM)", "SIZE"),
    StartOption(
        "gpu-workers", "GPU workers to start: `auto` (one per GPU found) or N (default: none)", "auto|N"
    ),
    StartOption(
        "name", "cluster name (default: local, then local-2, ...; on a profile, the profile's name)", "NAME"
    ),
    StartOption("keep", "keep running after the kernel (or server) that started it exits"),
    StartOption("dashboard", "start Dask's dashboard (opened through Jupyter: the sidebar's Dashboard link)"),
    StartOption("gpu-backend", "GPU worker implementation: builtin (default) or dask-cuda", "NAME"),
    StartOption(
        "gpus-per-worker",
        "GPUs each GPU worker holds (`CUDA_VISIBLE_DEVICES` lists them all; default: 1)",
        "N",
    ),
    StartOption(
        "gpu-threads",
        f"threads per GPU of a GPU worker: fractional `--gpus` items share a GPU (default: {GPU_THREADS})",
        "T",
    ),
    StartOption("profile", "where to run: a profile from `nbcluster profiles` (default: local)", "NAME"),
    StartOption("force", FORCE_HELP),
)


def parse_count(value: Any, what: str, *, minimum: int = 0) -> int:
    """An integer count from user input (int or numeric string).

    Parameters
    ----------
    value : object
        What the user gave.
    what : str
        How the message names it (``--workers``).
    minimum : int
        The smallest allowed.

    Returns
    -------
    int
        The count.

    Raises
    ------
    BadArgument
        For anything else (a bool, a non-integer, a number below `minimum`), naming `what`.
    """
    if isinstance(value, bool):
        raise BadArgument(f"{what} must be a whole number, not {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise BadArgument(f"{what} must be a whole number, not {value!r}")
        value = int(text)
    if not isinstance(value, int):
        raise BadArgument(f"{what} must be a whole number, not {value!r}")
    if value < minimum:
        raise BadArgument(f"{what} must be at least {minimum}, not {value}")
    return value


def parse_bounds(minimum: Any, maximum: Any, names: tuple[str, str] = ("--min", "--max")) -> tuple[int, int]:
    """Adaptive bounds, each a count and the minimum not above the maximum.

    Parameters
    ----------
    minimum, maximum : object
        What the user gave.
    names : tuple of (str, str)
        What the caller's user typed (flags, or a REST body's fields), for the messages.

    Returns
    -------
    tuple of (int, int)
        The bounds.

    Raises
    ------
    BadArgument
        For a bound that is not a count, or a minimum above the maximum.
    """
    lo, hi = parse_count(minimum, names[0]), parse_count(maximum, names[1])
    if lo > hi:
        raise BadArgument(
            f"{names[0]} {lo} is above {names[1]} {hi}: the minimum must not exceed the maximum"
        )
    return lo, hi


def parse_memory(value: Any) -> int | None:
    """Bytes from '4GiB', '500MB' or an int.

    Parameters
    ----------
    value : object
        ``--memory``: a size, an int, ``"auto"`` or None.

    Returns
    -------
    int or None
        Bytes; None means Dask's default share of RAM.

    Raises
    ------
    BadArgument
        For something that is not a size, or below 64 MiB.
    """
    if value is None or value == "auto":
        return None
    try:
        n = int(value) if isinstance(value, int) else parse_bytes(str(value))
    except (ValueError, TypeError):
        raise BadArgument(f"--memory {value!r} is not a size: write it like 4GiB, 512MiB or 2GB") from None
    if n < 64 * 2**20:
        raise BadArgument(f"--memory {value!r} is too small: give each worker at least 64MiB")
    return n


def parse_gpus(value: Any) -> int | str | None:
    """``--gpu-workers`` checked.

    Parameters
    ----------
    value : object
        What the user gave.

    Returns
    -------
    int, "auto" or None
        'auto', a count, or None (no GPU workers).

    Raises
    ------
    BadArgument
        For anything else.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return parse_count(value, "--gpu-workers", minimum=0)


def check_name(name: Any) -> str:
    """A cluster name given by a user, checked against `NAME_RULE`.

    Parameters
    ----------
    name : object
        What the user gave.

    Returns
    -------
    str
        `name`.

    Raises
    ------
    BadArgument
        When it does not follow the rule (the message says it).
    """
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise BadArgument(f"cluster name {name!r} is not usable: {NAME_RULE}")
    return name


@dataclass(frozen=True)
class ClusterSpec:
    """A validated request for a cluster.

    `workers` counts CPU workers; GPU workers (one per GPU) come on top of them. `None` in
    `workers`/`threads` means "pick for this machine" (see `resolved`).
    """

    workers: int | None = None
    threads: int | None = None
    memory: int | None = None
    gpus: int | str | None = None
    name: str | None = None
    keep: bool = False
    dashboard: bool = False
    backend: str = "local"
    gpu_backend: str = "builtin"
    #: GPUs each GPU worker holds; a trial sees them all (one CUDA_VISIBLE_DEVICES per process).
    gpus_per_worker: int = 1
    #: Threads per GPU of a GPU worker (its `nthreads` is this times `gpus_per_worker`).
    gpu_threads: int = GPU_THREADS
    #: The backend profile (`profiles.py`) the cluster runs on; `backend` is its backend.
    profile: str = "local"

    @classmethod
    def from_user(
        cls,
        *,
        workers: Any = None,
        threads: Any = None,
        memory: Any = None,
        gpu_workers: Any = None,
        name: str | None = None,
        keep: bool = False,
        dashboard: bool = False,
        profile: str | None = None,
        gpu_backend: str | None = None,
        gpus_per_worker: Any = None,
        gpu_threads: Any = None,
        force: bool = False,
    ) -> ClusterSpec:
        """Validate a start request, including its size against `limits`.

        An unknown `profile`, or one whose backend's package is missing, is refused here
        with the fix.

        Parameters
        ----------
        workers, threads, memory, gpu_workers : optional
            ``--workers``, ``--threads``, ``--memory``, ``--gpu-workers`` as the user gave them
            (the spec keeps GPU workers as `gpus`, the field of the registry's spec).
        name : str, optional
            The cluster's name (default: the profile's, or ``local``).
        keep : bool
            Keep it running after its owner exits.
        dashboard : bool
            Serve Dask's dashboard (needs bokeh).
        profile : str, optional
            Where it runs (default ``local``).
        gpu_backend : str, optional
            How local GPU workers are told their device (default ``builtin``).
        gpus_per_worker : int, optional
            ``--gpus-per-worker``: GPUs each GPU worker holds (default 1).
        gpu_threads : int, optional
            ``--gpu-threads``: threads per GPU of a GPU worker (default `GPU_THREADS`).
        force : bool
            Lift the machine-derived limits, not those set in config.

        Returns
        -------
        ClusterSpec
            The checked request.

        Raises
        ------
        BadArgument
            For a bad value, an unknown profile or a missing package (with the fix).
        LimitExceeded
            When the cluster would be larger than a limit allows.
        """
        chosen = profiles.get(profile)
        if not chosen.local:
            chosen.check_installed()  # a missing extra is named now, not in the supervisor's log
            if gpu_workers not in (None, 0, "0") or gpu_backend or gpus_per_worker or gpu_threads:
                raise BadArgument(
                    "--gpu-workers, --gpu-backend, --gpus-per-worker and --gpu-threads are for local "
                    f"clusters; on the {chosen.backend} backend "
                    "GPU workers come from the profile's options"
                )
        gpu_backend = gpu_backend or "builtin"
        if gpu_backend not in GPU_BACKENDS:
            raise BadArgument(f"--gpu-backend {gpu_backend!r}: use one of {', '.join(GPU_BACKENDS)}")
        if gpu_backend == "dask-cuda" and gpus_per_worker not in (None, 1, "1"):
            raise BadArgument(
                "--gpus-per-worker: dask-cuda workers hold one GPU each; leave --gpu-backend out to "
                "use nbcluster's built-in GPU workers, which can hold several"
            )
        if dashboard and importlib.util.find_spec("bokeh") is None:
            raise BadArgument("--dashboard needs bokeh: `pip install bokeh`, or start without --dashboard")
        spec = cls(
            workers=None if workers is None else parse_count(workers, "--workers"),
            threads=None if threads is None else parse_count(threads, "--threads", minimum=1),
            memory=parse_memory(memory),
            gpus=parse_gpus(gpu_workers),
            name=None if name is None else check_name(name),
            keep=bool(keep),
            dashboard=bool(dashboard),
            backend=chosen.backend,
            gpu_backend=gpu_backend,
            gpus_per_worker=1 if gpus_per_worker is None else parse_count(gpus_per_worker, "--gpus-per-worker", minimum=1),
            gpu_threads=GPU_THREADS if gpu_threads is None else parse_count(gpu_threads, "--gpu-threads", minimum=1),
            profile=chosen.name,
        )
        spec.check_limits(force=force)
        return spec

    def check_limits(self, *, force: bool = False, machine: limits.Machine | None = None) -> None:
        """Raise `LimitExceeded` if this cluster would start larger than the limits allow,
        or with a dashboard where `nbcluster.limits.dashboard` turns it off (then `check_size`).

        Parameters
        ----------
        force, machine
            As `check_size` takes them.

        Raises
        ------
        LimitExceeded
            As `check_size` raises it, or for the dashboard.
        """
        if self.dashboard:
            limits.check_dashboard()
        resolved = self.resolved(machine.cores if machine else None)
        assert resolved.workers is not None
        request = f"--workers {resolved.workers}" + ("" if self.workers is not None else " (the default)")
        if self.threads is not None and self.threads > 1:
            request += f" --threads {self.threads}"
        if self.memory is not None:
            request += f" --memory {format_bytes(self.memory).replace(' ', '')}"
        gpu_workers = self.gpus if isinstance(self.gpus, int) else 0
        self.check_size(request, resolved.workers, gpu_workers, force=force, machine=machine)

    def check_size(
        self,
        request: str,
        cpu_workers: int,
        gpu_workers: int = 0,
        *,
        force: bool = False,
        machine: limits.Machine | None = None,
    ) -> None:
        """Raise `LimitExceeded` if this cluster with these many workers breaks a limit
        (for `scale` and `adapt --max` as well as `start`). The limits describe this
        machine, so only local clusters have them; a batch system or gateway sets its own.

        Parameters
        ----------
        request : str
            The user's words for what was asked (the message starts with them).
        cpu_workers, gpu_workers : int
            The workers of each kind the cluster would have.
        force : bool
            Lift the machine-derived limits.
        machine : limits.Machine, optional
            Default: this machine.

        Raises
        ------
        LimitExceeded
            Naming the limit and what to do.
        """
        if self.backend != "local":
            return
        limits.check(
            request, cpu_workers, self.threads or 1, self.memory,
            gpu_workers=gpu_workers, force=force, machine=machine,
        )  # fmt: skip

    def resolved(self, cpu_count: int | None = None) -> ClusterSpec:
        """Fill in machine-dependent defaults: `nbcluster.defaults.workers` (else one per
        core, at most what a limit set in config allows: `limits.default_workers`)
        single-threaded workers.

        Processes, not threads, are the default because notebook code is mostly pure
        Python that holds the GIL.

        Parameters
        ----------
        cpu_count : int, optional
            The cores to count with (default: this machine's).

        Returns
        -------
        ClusterSpec
            A copy with ``workers`` and ``threads`` set.
        """
        cores = cpu_count or os.cpu_count() or 1
        threads = self.threads if self.threads is not None else 1
        workers = self.workers if self.workers is not None else limits.default_workers(cores, threads)
        return ClusterSpec(**{**asdict(self), "workers": workers, "threads": threads})

    def to_dict(self) -> SpecFields:
        """The request as plain data (what crosses to the supervisor).

        Returns
        -------
        SpecFields
            `nbcluster._wire.SpecFields`.
        """
        # The dataclass's fields are SpecFields' keys (tests/test_wire.py holds them equal).
        return cast(SpecFields, asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        """A request from `to_dict`'s data; unknown keys are dropped.

        Parameters
        ----------
        data : Mapping
            `nbcluster._wire.SpecFields`.

        Returns
        -------
        ClusterSpec
            Not checked again (it was, where it was made).
        """
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
