"""A worker's kind, "cpu" or "gpu", and the one place it is read.

GPU workers advertise the Dask resource ``{"GPU": 1}`` (and CPU workers ``{"CPU": threads}``):
the resource is what the scheduler matches `%%distribute --gpus` items against, so it is
also what says which kind a worker is, whether it is running (its resources on the
scheduler) or only planned (the resources in its spec).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from nbcluster._wire import Kind
from nbcluster.errors import BadArgument

KINDS = ("cpu", "gpu")
#: The Dask resource GPU workers advertise, one per device.
GPU_RESOURCE = "GPU"


def worker_kind(resources: Mapping[str, Any] | None) -> Kind:
    """ "gpu" for a worker with the GPU resource, else "cpu".

    Parameters
    ----------
    resources : Mapping or None
        The worker's Dask resources.

    Returns
    -------
    Kind
        ``"gpu"`` or ``"cpu"``.
    """
    return "gpu" if GPU_RESOURCE in (resources or {}) else "cpu"


def check_kind(kind: Any, what: str = "kind") -> str:
    """A worker kind given by a user, checked.

    Parameters
    ----------
    kind : object
        What was given (``--kind``, a REST body's ``kind``).
    what : str
        How the message names it.

    Returns
    -------
    str
        `kind`, one of ``KINDS``.

    Raises
    ------
    BadArgument
        For anything else, naming the kinds there are.
    """
    if kind not in KINDS:
        raise BadArgument(f"{what} must be {' or '.join(map(repr, KINDS))}, not {kind!r}")
    return cast(str, kind)  # one of KINDS
