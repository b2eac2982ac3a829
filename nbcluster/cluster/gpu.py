"""GPU discovery and the device assignment of GPU workers.

Discovery asks NVML (`nvidia-ml-py`), then falls back to `nvidia-smi -L`; finding nothing
means "no GPUs", never an error, unless GPUs were asked for explicitly.

`NBCLUSTER_SIMULATE_GPUS=N` makes discovery report N *simulated* devices, for tests and for
teaching on laptops: their workers advertise the `GPU` resource and get a distinct
`CUDA_VISIBLE_DEVICES` like real ones, and every display labels them "simulated". It is
read from the environment only when set by a person; nothing here turns it on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import cast

from nbcluster._wire import GpuDevice
from nbcluster.errors import BadArgument

SIMULATE_ENV = "NBCLUSTER_SIMULATE_GPUS"


@dataclass(frozen=True)
class GPU:
    """One GPU of this machine (or a simulated one): its index, name, memory and UUID."""

    index: int
    name: str
    memory_total: int | None  # bytes
    uuid: str | None = None
    simulated: bool = False

    def to_dict(self) -> GpuDevice:
        """The GPU as plain data.

        Returns
        -------
        GpuDevice
            `nbcluster._wire.GpuDevice`.
        """
        # The dataclass's fields are GpuDevice's keys (tests/test_wire.py holds them equal).
        return cast(GpuDevice, asdict(self))


def _nvml() -> list[GPU]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no device: both just mean "no GPUs here"
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            gpus.append(GPU(i, name, int(mem), uuid))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi() -> list[GPU]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi_list(out)


def parse_nvidia_smi_list(text: str) -> list[GPU]:
    """GPUs from `nvidia-smi -L` lines like ``GPU 0: NVIDIA H200 (UUID: GPU-...)``.

    Parameters
    ----------
    text : str
        What ``nvidia-smi -L`` printed.

    Returns
    -------
    list of GPU
        One per GPU line (memory unknown: None); other lines are skipped.
    """
    gpus = []
    for line in text.splitlines():
        m = re.match(r"GPU (\d+): (.*?)(?: \(UUID: (.*)\))?$", line.strip())
        if m:
            gpus.append(GPU(int(m.group(1)), m.group(2), None, m.group(3)))
    return gpus


def discover(environ: dict[str, str] | None = None) -> list[GPU]:
    """The GPUs of this machine (or the simulated ones, when asked for).

    Parameters
    ----------
    environ : dict, optional
        The environment to read ``NBCLUSTER_SIMULATE_GPUS`` from (default `os.environ`).

    Returns
    -------
    list of GPU
        From NVML, else ``nvidia-smi``; [] when there are none.

    Raises
    ------
    BadArgument
        When ``NBCLUSTER_SIMULATE_GPUS`` is not a whole number.
    """
    env = os.environ if environ is None else environ
    simulated = env.get(SIMULATE_ENV, "").strip()
    if simulated:
        if not simulated.isdigit():
            raise BadArgument(f"{SIMULATE_ENV}={simulated!r} must be a whole number of GPUs")
        return [
            GPU(i, "Simulated GPU", 16 * 2**30, f"SIM-{i}", simulated=True) for i in range(int(simulated))
        ]
    return _nvml() or _nvidia_smi()


def select(requested: int | str | None, available: list[GPU], per_worker: int = 1) -> list[GPU]:
    """The GPUs for `--gpu-workers auto|N` workers of `per_worker` GPUs each.

    Parameters
    ----------
    requested : int, "auto" or None
        ``--gpu-workers``: a number, as many as the GPUs make, or none (None or 0).
    available : list of GPU
        What `discover` found.
    per_worker : int
        ``--gpus-per-worker``: GPUs each worker holds.

    Returns
    -------
    list of GPU
        The first ``requested * per_worker`` GPUs (for "auto", the most whole workers'
        worth; GPUs left over, fewer than `per_worker`, are not used).

    Raises
    ------
    BadArgument
        When more GPUs are asked for than the machine has (the message says what to do).
    """
    if requested in (None, 0):
        return []
    if requested == "auto":
        return available[: len(available) // per_worker * per_worker]
    assert isinstance(requested, int)
    if requested * per_worker > len(available):
        have = f"only {len(available)}" if available else "no"
        each = f" of {per_worker} GPUs each" if per_worker > 1 else ""
        raise BadArgument(
            f"--gpu-workers {requested}{each}: this machine has {have} GPU(s). Use --gpu-workers auto to take "
            f"what there is, or set {SIMULATE_ENV}=N to simulate GPUs for teaching/tests"
        )
    return available[: requested * per_worker]


def groups(devices: list[GPU], per_worker: int) -> list[tuple[GPU, ...]]:
    """The devices of each GPU worker: consecutive runs of `per_worker` GPUs.

    Parameters
    ----------
    devices : list of GPU
        What `select` chose.
    per_worker : int
        GPUs each worker holds.

    Returns
    -------
    list of tuple of GPU
        One tuple per GPU worker; a tail shorter than `per_worker` makes no worker.
    """
    return [tuple(devices[i : i + per_worker]) for i in range(0, len(devices) - per_worker + 1, per_worker)]
