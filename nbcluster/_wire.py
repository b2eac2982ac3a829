"""The three formats that cross process boundaries, declared once, and a check of real payloads.

- `RegistryEntry`: what a supervisor writes to ``<runtime dir>/<name>.json`` (and prints on
  its ready pipe); `ExternalEntry` is what a handle on a scheduler nbcluster did not start
  holds in its place (never written to disk).
- `ClusterState`: a scheduler's ``nbcluster_info`` answer (`ClusterHandle.ainfo`), and
  `Cluster`: the REST cluster shape served by ``server/handlers.py`` (the same facts, plus
  ``state``, ``runs_on``, ``totals``), which the sidebar reads.
- `Snapshot`: a metrics snapshot, made by ``metrics/plugin.py`` (or ``metrics/basic.py``
  where the plugin is absent), read by ``metrics/feed.py``, the live widget and the sidebar.
  Its design is told in `nbcluster.metrics`.

TypeScript describes the same shapes twice (``nbcluster/widgets/static/graphs.d.ts`` and
``labextension/src/tokens.ts``); ``tests/test_wire.py`` compares those interfaces field by
field with the classes here (`TS_NAMES`), so that one side drifting fails CI.

The types are ``TypedDict``: the payloads stay plain dicts (msgpack and JSON carry them),
mypy checks every key read and written, and `problems` checks a payload at run time.
Optional keys are those of the ``total=False`` bases (Python 3.10 has no ``NotRequired``).
Payloads that went through Dask's msgpack hold tuples where lists were sent: `problems`
takes either. Readers ignore keys they do not know; `problems` reports them, so that a
producer adding a key must declare it here first.

Only the standard library's `typing`: a worker or scheduler can import this cheaply.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, TypedDict, Union

# -- shared pieces ------------------------------------------------------------------------


class Credentials(TypedDict):
    """A cluster's TLS files (PEM paths): its own (``credentials.write_credentials``), or a
    gateway's, written 0600 beside the entry."""

    ca_file: str
    cert: str
    key: str


class SpecFields(TypedDict):
    """`ClusterSpec.to_dict`: what a cluster was started with."""

    workers: int | None
    threads: int | None
    memory: int | None
    gpus: int | str | None
    name: str | None
    keep: bool
    dashboard: bool
    backend: str
    gpu_backend: str
    gpus_per_worker: int
    gpu_threads: int
    profile: str


class GpuDevice(TypedDict):
    """`GPU.to_dict`: one device a supervisor assigned to a worker (``simulated``: made up by
    ``NBCLUSTER_SIMULATE_GPUS``, which every display must say)."""

    index: int
    name: str
    memory_total: int | None
    uuid: str | None
    simulated: bool


# -- the registry entry -------------------------------------------------------------------

EntryState = Literal["starting", "running", "stopping"]


class _EntryClaimed(TypedDict):
    # Written with the claim (O_EXCL), before anything is started.
    name: str
    #: Always False here: the tag that tells an entry from an `ExternalEntry` (mypy narrows on
    #: it). `registry.read` supplies it for an entry written before it existed.
    external: Literal[False]
    state: EntryState
    supervisor_pid: int
    supervisor_started: float
    owner_pid: int | None
    owner_started: float | None
    started_by: int
    created: float
    spec: SpecFields
    backend: str
    profile: str


class RegistryEntry(_EntryClaimed, total=False):
    """One cluster's registry file. The keys of this class come with ``state: "running"``
    (``tls`` a moment earlier); ``control``, ``control_tls`` and ``metrics`` only where the
    scheduler runs elsewhere (SSH, gateway, Kubernetes) and the supervisor serves the
    ``nbcluster_*`` handlers itself."""

    tls: Credentials
    address: str
    dashboard: str | None
    gpus: list[GpuDevice]
    control: str
    control_tls: Credentials
    #: Whether the remote scheduler took nbcluster's metrics plugin.
    metrics: bool


class _ExternalRequired(TypedDict):
    name: str
    address: str
    external: Literal[True]
    tls: Credentials | None


class ExternalEntry(_ExternalRequired, total=False):
    """A handle's entry for a scheduler nbcluster did not start (`nbcluster.connect`)."""

    #: Whether its scheduler took nbcluster's metrics plugin (else: the basic view).
    metrics: bool


Entry = RegistryEntry | ExternalEntry


# -- the cluster description (nbcluster_info, REST) ---------------------------------------

Kind = Literal["cpu", "gpu"]


class WorkerRow(TypedDict):
    """One worker as ``nbcluster_info`` reports it, whatever the backend (`info.worker_row`)."""

    name: str
    address: str
    host: str | None
    job_id: str | None
    kind: Kind
    nthreads: int
    memory_limit: int | None
    memory: int
    cpu: float
    resources: dict[str, float]
    processing: int
    gpu: GpuDevice | None


class Requested(TypedDict):
    """The workers a cluster was asked for, by kind (the card shows "2 workers (3 requested)")."""

    cpu: int
    gpu: int


class _BoundsRequired(TypedDict):
    minimum: int
    maximum: int


class Bounds(_BoundsRequired, total=False):
    """Adaptive bounds of the CPU workers; GPU workers (local, with GPUs) adapt up to one
    per device."""

    gpu_maximum: int


class TaskCounts(TypedDict, total=False):
    """Tasks by state; empty where the scheduler runs elsewhere (its task table is not ours)."""

    processing: int
    waiting: int
    memory: int
    erred: int


class Totals(TypedDict):
    """`info.cluster_totals`: what ``%cluster status`` and the sidebar's card sum up."""

    workers: int
    cores: int
    memory: int
    memory_limit: int
    gpus: int
    simulated_gpus: int


class _ClusterCore(TypedDict):
    name: str
    address: str
    # None for a scheduler nbcluster did not start.
    dashboard: str | None
    owner_pid: int | None
    created: float | None


class _ClusterFacts(TypedDict, total=False):
    # From the entry (a managed cluster's answer has all of these; an external one none).
    # None only for an entry without them (planted by hand, or from an older nbcluster).
    spec: SpecFields | None
    backend: str | None
    profile: str | None
    # From the supervisor.
    supervisor_pid: int
    requested: Requested
    adaptive: Bounds | None
    #: Dask clients on the scheduler (kernels using it), where the scheduler runs here.
    clients: int | None
    #: RAM of each host the supervisor can see, which caps the summed worker limits.
    host_memory: dict[str, int]
    #: A scheduler nbcluster did not start: scale, adapt, restart and stop are refused.
    external: bool
    #: One line the backend has for the user, said at start (a gateway that cannot take
    #: nbcluster's worker environment, and how its administrator lets it).
    notice: str


class ClusterState(_ClusterCore, _ClusterFacts):
    """A scheduler's ``nbcluster_info`` answer (or, external, its ``identity`` as rows)."""

    workers: list[WorkerRow]
    tasks: TaskCounts


class _ClusterLive(TypedDict, total=False):
    # Absent where the scheduler did not answer (``state: "unreachable"``); the live
    # stream leaves out ``workers`` and ``host_memory`` (`handlers.compact`).
    workers: list[WorkerRow]
    tasks: TaskCounts
    totals: Totals


class Cluster(_ClusterCore, _ClusterFacts, _ClusterLive):
    """One cluster of ``GET api/clusters``: its `ClusterState` and what the browser adds."""

    state: Literal["running", "unreachable"]
    #: True when the Jupyter server answering owns it (it stops with the server).
    server_owned: bool
    #: Where it runs, in the words of ``%cluster list`` (`info.runs_on`).
    runs_on: str


# -- the metrics snapshot -----------------------------------------------------------------

#: ``[min, median, max]`` across workers (`metrics.summary.spread`).
Spread = tuple[float, float, float]


class _SnapshotGpuStatic(TypedDict):
    name: str | None
    memory_total: int | None


class SnapshotGpu(_SnapshotGpuStatic, total=False):
    """A worker's GPU in a metrics snapshot: the device, and where it came from."""

    #: Present where nbcluster's supervisor assigned the device (True: a simulation).
    simulated: bool


class _SnapshotWorkerRequired(TypedDict):
    name: str
    nthreads: int
    memory_limit: int
    resources: dict[str, float]
    processing: int


class SnapshotWorker(_SnapshotWorkerRequired, total=False):
    """One worker in a metrics snapshot (the ones described one by one)."""

    #: Absent on workers without a GPU that NVML or the supervisor knows of.
    gpu: SnapshotGpu


class TaskRecord(TypedDict):
    """One finished task of the task stream: its key, group, worker, start and stop."""

    key: str
    prefix: str
    group: str
    worker: str
    start: float
    stop: float
    status: Literal["ok", "error"]


class _SampleRequired(TypedDict):
    worker: str
    time: float
    cpu: float
    memory: int
    memory_limit: int
    net_read: float
    net_write: float


class ResourceSample(_SampleRequired, total=False):
    """One worker's CPU and memory (and GPU, where reported) at one heartbeat."""

    # Only where the worker reports an NVML GPU: absent, never zero-filled.
    gpu_util: float
    gpu_memory: int
    gpu_memory_total: int | None


class _BandRequired(TypedDict):
    time: float
    workers: int
    cpu: Spread | None
    memory: Spread | None
    memory_limit: float


class Band(_BandRequired, total=False):
    """The distribution across workers of one moment's samples: ``(min, median, max)`` spreads."""

    gpu_util: Spread


class HostTotals(TypedDict):
    """One host's workers, threads, running tasks and memory, summed."""

    host: str
    workers: int
    threads: int
    processing: int
    memory: int
    memory_limit: int


class Summary(TypedDict):
    """A whole cluster in a few numbers, and its largest hosts (a snapshot's ``summary``)."""

    workers: int
    threads: int
    processing: int
    memory: int
    memory_limit: int
    hosts: list[HostTotals]
    more_hosts: int


#: The Dask event topic on which a kernel reports a run's item counts (`widgets.reporter_for`),
#: a few times a second at most: a batch task holds many items, so only the kernel can count
#: them. nbcluster's scheduler plugin keeps the latest per run; any other scheduler keeps
#: the events as Dask keeps every topic's (the newest ``distributed.admin.low-level-log-length``).
PROGRESS_TOPIC = "nbcluster-progress"


class _RunRequired(TypedDict):
    run: str


class RunCounts(_RunRequired, total=False):
    """An event on `PROGRESS_TOPIC`: one run's counts as the kernel's view of it has them."""

    label: str | None
    done: int
    failed: int
    total: int
    cancelled: int
    state: str
    elapsed: float


class RunProgress(RunCounts):
    """A run's latest `RunCounts` as the scheduler keeps them (the sidebar shows them)."""

    time: float  # when the scheduler heard them (its clock)


class GroupProgress(TypedDict):
    """Progress of one task group (plain Dask work, which no run reports)."""

    group: str
    prefix: str
    total: int
    done: int
    running: int
    failed: int
    waiting: int


class _SnapshotRequired(TypedDict):
    version: int
    cursor: int
    gap: bool
    now: float
    workers: dict[str, SnapshotWorker]
    tasks: list[TaskRecord]
    resources: list[ResourceSample]


class Snapshot(_SnapshotRequired, total=False):
    """``nbcluster_metrics(since, detail)``: what is new since a cursor (`nbcluster.metrics`)."""

    #: Present (True) only in the scheduler's own view, where nbcluster's plugin is not there.
    basic: bool
    summary: Summary
    bands: list[Band]
    runs: list[RunProgress]
    groups: list[GroupProgress]


#: The TypeScript interface each class is written as: (file below the repository root, name).
#: A class not named here is written inline where it is used.
_GRAPHS, _TOKENS = "nbcluster/widgets/static/graphs.d.ts", "labextension/src/tokens.ts"
class HeldValue(TypedDict):
    """What a worker says about one `--persist` result it holds (``worker/held.py``): the
    kernel shows it in the handle's repr without moving the value."""

    type: str  # the value's type name, e.g. "ndarray"
    shape: str | None  # "(12500000,) float64" for an array, "len 3" for a sized value, else None
    nbytes: int  # Dask's `sizeof` of the value


#: The Dask event topic on which nbcluster's scheduler plugin says that a worker came or went
#: (`MetricsPlugin.add_worker`): a kernel subscribed to it keeps the workers it was told of
#: (`run/transport.py`) until the next such event, rather than asking again each cell.
ROSTER_TOPIC = "nbcluster-roster"


class RosterChanged(TypedDict):
    """An event on `ROSTER_TOPIC`: the scheduler's workers now."""

    workers: int  # how many


#: The Dask event topic on which a worker reports each batch it ran for a kernel directly, not
#: as a Dask task (`run/transport.py`): nbcluster's scheduler plugin draws it as a task of the run.
DIRECT_TOPIC = "nbcluster-direct"


class DirectRecord(TypedDict):
    """An event on `DIRECT_TOPIC` (the scheduler adds ``worker``)."""

    key: str  # the batch's key, ``distribute-<run id>-<n>``
    start: float  # when it started and stopped on the worker (epoch seconds)
    stop: float


#: The Dask name of the worker plugin that gives freed heap memory back after work
#: (`cluster/worker_memory.py`); a direct batch, which is no task, tells it itself (`worker.serve`).
MEMORY_TRIM_PLUGIN = "nbcluster-memory-trim"


#: The Dask event topic on which a task pushes its small result (or a ``--persist`` item its
#: report) to the kernel just before it ends, so the kernel need not gather it (`run/transport.py`).
PUSHED_TOPIC = "nbcluster-pushed"


class Pushed(TypedDict):
    """An event on `PUSHED_TOPIC`."""

    key: str  # the task's key
    report: bytes  # its result blob, or a persisted item's report
#: The Dask event topics of trial runs (`nbcluster.report`): one a run, named from this
#: prefix and the run's id (``nbcluster-trial-<run id>``), written by the workers
#: (``worker/trial.py``, `Worker.log_event`) and read by the kernel that made the run
#: (``run/trials.py``, `Client.subscribe_topic`).
TRIAL_TOPIC_PREFIX = "nbcluster-trial-"


class TrialSpec(TypedDict):
    """What a trial run's items know of it, carried in the run's context (``worker/context.py``)."""

    topic: str  # the run's event topic, `TRIAL_TOPIC_PREFIX` + run id
    identity: str | None  # the run's journal identity (checkpoints are keyed by it), None unjournaled
    checkpoints: str | None  # the folder of the run's checkpoints, None when there are none
    # The stopper's rungs: a report of `metric` at one of these steps waits for the kernel's
    # verdict (`worker/trial.py`); none for a stopper without rungs, or none at all.
    rungs: list[int]
    metric: str | None


class TrialEvent(TypedDict):
    """One message on a trial topic: what one item said since its last message.

    ``reports`` holds ``[step, time, {metric: value}]`` triples, oldest first (at most
    `worker/trial.MAX_BATCH` a message); ``begun`` is the time the item started (its first
    message only, sent at once so the kernel can time it out); ``dropped`` counts reports
    this item could not send because its worker's buffer was full; ``final`` marks
    its last message, sent as it ends; ``output`` carries what the item printed meanwhile
    (display() output comes with its result only).
    """

    item: int
    worker: str  # the address of the worker running it ("" in the kernel)
    reports: list[tuple[int, float, dict[str, float]]]
    begun: float | None
    dropped: int
    final: bool  # the item has ended: nothing more comes from it
    output: list[tuple[str, str]]  # what it printed since its last message: (stream, text), in order
    key: str | None  # its Dask task's key (first message; None for a batch sent to the worker directly)


TS_NAMES: dict[str, tuple[str, str]] = {
    "SnapshotWorker": (_GRAPHS, "WorkerInfo"),
    "TaskRecord": (_GRAPHS, "TaskRecord"),
    "ResourceSample": (_GRAPHS, "ResourceSample"),
    "GroupProgress": (_GRAPHS, "GroupProgress"),
    "RunProgress": (_GRAPHS, "RunProgress"),
    "Band": (_GRAPHS, "Band"),
    "Summary": (_GRAPHS, "Summary"),
    "Snapshot": (_GRAPHS, "Snapshot"),
    "GpuDevice": (_TOKENS, "IGpu"),
    "WorkerRow": (_TOKENS, "IWorker"),
    "Cluster": (_TOKENS, "ICluster"),
    "Totals": (_TOKENS, "ITotals"),
    "SpecFields": (_TOKENS, "IClusterSpec"),
}


# -- checking a payload at run time -------------------------------------------------------


def problems(value: object, shape: Any, where: str = "$") -> list[str]:
    """What is wrong with `value` as a `shape` (a class above, or any annotation they use):
    one line per missing or undeclared key and per value of the wrong type; [] when none.

    For tests and debugging: the producers are typed statically, this checks what really
    arrives (a file, a REST answer, an RPC answer).

    Parameters
    ----------
    value : object
        What arrived (decoded JSON, or an RPC answer).
    shape : type or annotation
        The declared shape: a TypedDict of this module, or an annotation they use.
    where : str
        The path of `value` in the whole, for the messages (``$`` is the top).

    Returns
    -------
    list of str
        One line per problem, e.g. ``$.workers[0].cpu: str 'x', expected float``.
    """
    if shape is Any or shape is object:
        return []
    if shape is None or shape is type(None):
        return [] if value is None else [f"{where}: {_seen(value)}, expected None"]
    if typing.is_typeddict(shape):
        return _typeddict_problems(value, shape, where)
    origin, args = typing.get_origin(shape), typing.get_args(shape)
    if origin is Union or origin is types.UnionType:
        found = [problems(value, arm, where) for arm in args]
        if any(not p for p in found):
            return []
        # The arm of the value's own kind says the most; else name them all.
        close = [p for p, arm in zip(found, args, strict=True) if _same_kind(value, arm)]
        return close[0] if len(close) == 1 else [f"{where}: {_seen(value)}, expected {_name(shape)}"]
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r}, expected one of {list(args)!r}"]
    if origin in (list, tuple) or shape in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return [f"{where}: {_seen(value)}, expected {_name(shape)}"]
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return [f"{where}: {len(value)} items, expected {len(args)}"]
            return [p for i, (v, a) in enumerate(zip(value, args, strict=True)) for p in problems(v, a, f"{where}[{i}]")]
        item = args[0] if args else Any
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{where}[{i}]")]
    if origin is dict or shape is dict:
        if not isinstance(value, dict):
            return [f"{where}: {_seen(value)}, expected {_name(shape)}"]
        key_shape, value_shape = args or (Any, Any)
        return [
            p for k, v in value.items()
            for p in [*problems(k, key_shape, f"{where} key {k!r}"), *problems(v, value_shape, f"{where}[{k!r}]")]
        ]  # fmt: skip
    if shape is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(shape, type):
        ok = isinstance(value, shape)
    else:
        raise TypeError(f"problems() cannot check {shape!r}")
    return [] if ok else [f"{where}: {_seen(value)}, expected {_name(shape)}"]


def _typeddict_problems(value: object, shape: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: {_seen(value)}, expected {shape.__name__}"]
    hints = typing.get_type_hints(shape)
    out = [f"{where}: missing key {k!r} ({shape.__name__})" for k in sorted(shape.__required_keys__ - value.keys())]
    out += [f"{where}: undeclared key {k!r} ({shape.__name__})" for k in sorted(value.keys() - hints.keys(), key=str)]
    for key, hint in hints.items():
        if key in value:
            out += problems(value[key], hint, f"{where}.{key}")
    return out


def _same_kind(value: object, shape: Any) -> bool:
    if typing.is_typeddict(shape) or typing.get_origin(shape) is dict:
        return isinstance(value, dict)
    if typing.get_origin(shape) in (list, tuple):
        return isinstance(value, (list, tuple))
    return False


def _seen(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _name(shape: Any) -> str:
    return getattr(shape, "__name__", None) or str(shape).replace("typing.", "")
