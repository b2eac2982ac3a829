"""`ClusterSpec`: what a user asks for when starting a cluster, validated once.

Every front end (magic, CLI, sidebar form, Python API) builds a `ClusterSpec` and nothing
else: validation lives here so they all reject the same inputs with the same message.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from dask.utils import parse_bytes

from nbcluster.errors import BadArgument

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
DEFAULT_NAME = "local"
BACKENDS = ("local",)
GPU_BACKENDS = ("builtin", "dask-cuda")


def _count(value: Any, what: str, *, minimum: int = 0) -> int:
    """An integer count from user input (int or numeric string), or a BadArgument."""
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


def parse_count(value: Any, what: str, *, minimum: int = 0) -> int:
    """Validate a user-supplied count (workers, threads, min/max) with one clear message."""
    return _count(value, what, minimum=minimum)


def parse_memory(value: Any) -> int | None:
    """Bytes from '4GiB', '500MB' or an int; None means Dask's default share of RAM."""
    if value is None or value == "auto":
        return None
    try:
        n = int(value) if isinstance(value, int) else parse_bytes(str(value))
    except (ValueError, TypeError):
        raise BadArgument(
            f"--memory {value!r} is not a size: write it like 4GiB, 512MiB or 2GB"
        ) from None
    if n < 64 * 2**20:
        raise BadArgument(f"--memory {value!r} is too small: give each worker at least 64MiB")
    return n


def parse_gpus(value: Any) -> int | str | None:
    """'auto', a count, or None (no GPU workers)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _count(value, "--gpus", minimum=0)


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise BadArgument(
            f"cluster name {name!r} is not usable: use letters, digits, '-', '_' or '.', "
            "starting with a letter or digit (at most 63 characters)"
        )
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

    @classmethod
    def from_user(
        cls,
        *,
        workers: Any = None,
        threads: Any = None,
        memory: Any = None,
        gpus: Any = None,
        name: str | None = None,
        keep: bool = False,
        dashboard: bool = False,
        backend: str = "local",
        gpu_backend: str | None = None,
    ) -> ClusterSpec:
        gpu_backend = gpu_backend or "builtin"
        if gpu_backend not in GPU_BACKENDS:
            raise BadArgument(f"--gpu-backend {gpu_backend!r}: use one of {', '.join(GPU_BACKENDS)}")
        if dashboard and importlib.util.find_spec("bokeh") is None:
            raise BadArgument("--dashboard needs bokeh: `pip install bokeh`, or start without --dashboard")
        if backend not in BACKENDS:
            raise BadArgument(f"unknown backend profile {backend!r}: use one of {', '.join(BACKENDS)}")
        return cls(
            workers=None if workers is None else _count(workers, "--workers"),
            threads=None if threads is None else _count(threads, "--threads", minimum=1),
            memory=parse_memory(memory),
            gpus=parse_gpus(gpus),
            name=None if name is None else check_name(name),
            keep=bool(keep),
            dashboard=bool(dashboard),
            backend=backend,
            gpu_backend=gpu_backend,
        )

    def resolved(self, cpu_count: int | None = None) -> ClusterSpec:
        """Fill in machine-dependent defaults: one single-threaded worker per core.

        Processes, not threads, are the default because notebook code is mostly pure
        Python that holds the GIL.
        """
        cores = cpu_count or os.cpu_count() or 1
        workers = self.workers if self.workers is not None else cores
        threads = self.threads if self.threads is not None else 1
        return ClusterSpec(**{**asdict(self), "workers": workers, "threads": threads})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterSpec:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
