"""Cluster state as a front end shows it: the status rows, their totals, and the displays.

`worker_row` is one worker of an ``nbcluster_info`` answer (`nbcluster._wire.WorkerRow`),
whatever the backend; the supervisor makes them from its scheduler's `WorkerState`s, and
from a scheduler's ``identity`` (`identity_rows`) where the scheduler runs elsewhere, as a
handle does for a scheduler nbcluster did not start. `cluster_totals` sums them the way
``%cluster status`` and the sidebar's card show them.

`ClusterInfo` (one cluster) and `ClusterList` (the registry) are plain data with a text form
(terminals, logs, the CLI) and an HTML form (notebooks); they never fetch anything themselves.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

from dask.utils import format_bytes, format_time

from nbcluster._wire import ClusterState, GpuDevice, Totals, WorkerRow
from nbcluster.cluster.kinds import worker_kind


def worker_row(
    *, name: Any, address: str, host: str | None, nthreads: int, memory_limit: int | None, memory: int,
    cpu: float, resources: Mapping[str, float] | None, processing: int, gpu: GpuDevice | None = None,
    job_id: str | None = None,
) -> WorkerRow:  # fmt: skip
    """One worker as `nbcluster_info` reports it, whatever the backend.

    Parameters
    ----------
    name : object
        The worker's Dask name (shown as a string).
    address : str
        Its address.
    host : str or None
        The host it runs on, where known.
    nthreads : int
        Its threads.
    memory_limit : int or None
        Its memory limit in bytes.
    memory : int
        The memory it uses, in bytes.
    cpu : float
        Its CPU use, in percent of one core.
    resources : Mapping[str, float] or None
        Its Dask resources (``GPU`` makes it a GPU worker).
    processing : int
        Tasks running on it.
    gpu : GpuDevice, optional
        Its GPU (name, memory, utilisation), if it has one.
    job_id : str, optional
        The batch job it runs in (SLURM, PBS, ...).

    Returns
    -------
    WorkerRow
        The row (`nbcluster._wire.WorkerRow`), with its ``kind`` derived from `resources`.
    """
    resources = dict(resources or {})
    return {
        "name": str(name), "address": address, "host": host, "job_id": job_id,
        "kind": worker_kind(resources), "nthreads": nthreads,
        "memory_limit": memory_limit, "memory": memory, "cpu": cpu, "resources": resources,
        "processing": processing, "gpu": gpu,
    }  # fmt: skip


def identity_rows(identity: Mapping[str, Any]) -> list[WorkerRow]:
    """The workers of a scheduler's own ``identity`` answer as status rows.

    Parameters
    ----------
    identity : Mapping
        ``Scheduler.identity()`` (for a scheduler without nbcluster's plugin).

    Returns
    -------
    list of WorkerRow
        One row per worker; no GPUs or jobs (identity does not say).
    """
    rows = []
    for address, w in identity.get("workers", {}).items():
        metrics = w.get("metrics") or {}
        rows.append(
            worker_row(
                name=w.get("name"),
                address=address,
                host=w.get("host"),
                nthreads=w.get("nthreads", 0),
                memory_limit=w.get("memory_limit"),
                memory=metrics.get("memory", 0),
                cpu=metrics.get("cpu", 0.0),
                resources=w.get("resources"),
                processing=metrics.get("task_counts", {}).get("executing", 0),
            )
        )
    return rows


def _age(created: float | None, now: float) -> str:
    return format_time(max(now - created, 0)) if created else "?"


def _owner(pid: int | None) -> str:
    return f"pid {pid}" if pid else "kept (no owner)"


def runs_on(d: Mapping[str, Any]) -> str:
    """Where a cluster runs: ``local``, its profile with the backend the name does not
    already say (``hpc (slurm)``, ``slurm``), or ``external`` for a scheduler nbcluster did
    not start (the sidebar card shows the same words, sent by the REST list).

    Parameters
    ----------
    d : Mapping
        A registry entry or an `nbcluster_info` answer.

    Returns
    -------
    str
        The words, e.g. ``local``, ``hpc (slurm)``, ``external``.
    """
    if d.get("external"):
        return "external"
    profile = d.get("profile") or (d.get("spec") or {}).get("profile") or "local"
    backend = d.get("backend") or ("local" if profile == "local" else None)
    return profile if backend in (None, profile) else f"{profile} ({backend})"


def _where(d: Mapping[str, Any]) -> str:
    """The owner, or for a scheduler nbcluster did not start, that it is external."""
    if d.get("external"):
        return "external: started elsewhere, scale and stop are its owner's"
    owner = f"owner: {_owner(d.get('owner_pid'))}"
    where = runs_on(d)
    return f"profile {where}, {owner}" if where != "local" else owner


def proxied_dashboard(d: Mapping[str, Any], prefix: str | None = None) -> str | None:
    """The path that opens a cluster's dashboard through the Jupyter server, or None.

    A dashboard nbcluster serves on loopback answers only holders of the cluster's
    certificate, which a browser does not have; the server extension presents it
    (``<base_url>nbcluster/dashboard/NAME/``). `prefix` is the server's base URL: on a
    JupyterHub the spawner gives kernels ``JUPYTERHUB_SERVICE_PREFIX`` (``/user/NAME/``),
    elsewhere it is ``/``. A dashboard elsewhere (a gateway's) is linked as it is.

    Parameters
    ----------
    d : Mapping
        A registry entry or an `nbcluster_info` answer (``name``, ``dashboard``).
    prefix : str, optional
        The server's base URL; None reads ``JUPYTERHUB_SERVICE_PREFIX`` (else ``/``).

    Returns
    -------
    str or None
        The path, or None when the dashboard is not on loopback (or there is none).
    """
    link, name = d.get("dashboard"), d.get("name")
    if not link or not name or urlsplit(link).hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    base = prefix if prefix is not None else os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    return f"{base.rstrip('/')}/nbcluster/dashboard/{quote(str(name), safe='')}/status"


def _dashboard_line(d: Mapping[str, Any]) -> str:
    proxied = proxied_dashboard(d)
    if proxied is None:
        return f"  dashboard: {d['dashboard']}"
    return f"  dashboard: {proxied} in Jupyter ({d['dashboard']} asks for the cluster's certificate)"


def _worker_place(w: WorkerRow) -> str:
    """Where a worker runs: its host, and its batch job where there is one."""
    job = f" job {w['job_id']}" if w.get("job_id") else ""
    return f"{w.get('host') or ''}{job}"


def _gpu_count(w: Mapping[str, Any]) -> int:
    # A worker's GPU resource is how many devices it holds (`--gpus-per-worker`); the `gpu`
    # entry describes the first of them.
    return max(1, int((w.get("resources") or {}).get("GPU", 1))) if w.get("gpu") else 0


def _gpu_label(w: Mapping[str, Any]) -> str:
    gpu: GpuDevice | None = w.get("gpu")
    if not gpu:
        return ""
    total = gpu["memory_total"]
    mem = f", {format_bytes(total)}" if total else ""
    sim = " [simulated]" if gpu.get("simulated") else ""
    count = _gpu_count(w)
    more = f" (+{count - 1} more)" if count > 1 else ""
    return f"GPU {gpu['index']}{more}: {gpu['name']}{mem}{sim}"


def cluster_totals(data: Mapping[str, Any]) -> Totals:
    """Workers, cores, memory used and available, and GPUs of an `nbcluster_info` answer.

    The memory available is the sum of the workers' limits, but never more than a host
    has: Dask's default limit gives every worker its share of the machine when it starts,
    so workers added later (scale, adapt) would sum past the machine's RAM. ``host_memory``
    (from the supervisor, for the hosts it can see) holds each host's RAM. The sidebar's
    card shows these same numbers (the server sends them as ``totals``).

    Parameters
    ----------
    data : Mapping
        An `nbcluster_info` answer (``workers``, and ``host_memory`` where known).

    Returns
    -------
    Totals
        ``workers``, ``cores``, ``memory``, ``memory_limit``, ``gpus`` and
        ``simulated_gpus`` (`nbcluster._wire.Totals`).
    """
    ws = data.get("workers") or []
    host_memory = data.get("host_memory") or {}
    limits: dict[str, int] = {}
    for w in ws:
        host = str(w.get("host") or "")
        limits[host] = limits.get(host, 0) + int(w.get("memory_limit") or 0)
    memory_limit = sum(min(total, host_memory.get(h) or total) for h, total in limits.items())
    return {
        "workers": len(ws),
        "cores": sum(int(w.get("nthreads") or 0) for w in ws),
        "memory": sum(int(w.get("memory") or 0) for w in ws),
        "memory_limit": memory_limit,
        "gpus": sum(_gpu_count(w) for w in ws),
        "simulated_gpus": sum(_gpu_count(w) for w in ws if (w.get("gpu") or {}).get("simulated")),
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


#: Up to this many workers, status lists every one; past it, a summary (`Scale`).
MAX_ROWS = 16
#: The busiest workers a summary still lists one by one.
BUSIEST = 5
#: Host-and-kind groups a summary lists (the largest); the rest are counted.
MAX_GROUPS = 20


class Scale:
    """What status shows of a large cluster: workers by host and kind, the busiest few
    workers, and how many are idle -- the same size at 20 workers or 20,000."""

    def __init__(self, workers: list[WorkerRow]):
        groups: dict[tuple[str, str], dict[str, Any]] = {}
        for w in workers:
            key = (str(w.get("host") or "?"), str(w.get("kind") or "cpu"))
            g = groups.setdefault(key, {"host": key[0], "kind": key[1], "workers": 0, "threads": 0,
                                        "running": 0, "idle": 0, "memory": 0, "memory_limit": 0})  # fmt: skip
            g["workers"] += 1
            g["threads"] += int(w.get("nthreads") or 0)
            g["running"] += int(w.get("processing") or 0)
            g["idle"] += not w.get("processing")
            g["memory"] += int(w.get("memory") or 0)
            g["memory_limit"] += int(w.get("memory_limit") or 0)
        ranked = sorted(groups.values(), key=lambda g: (-g["workers"], g["host"], g["kind"]))
        self.groups = ranked[:MAX_GROUPS]
        self.more = ranked[MAX_GROUPS:]
        busy = [w for w in workers if w.get("processing")]
        self.busiest = sorted(busy, key=lambda w: (-int(w["processing"]), -float(w.get("cpu") or 0)))[
            :BUSIEST
        ]
        self.idle = len(workers) - len(busy)
        self.total = len(workers)

    def group_line(self, g: dict[str, Any]) -> str:
        """One host-and-kind group as a line of the summary.

        Parameters
        ----------
        g : dict
            One of ``self.groups``.

        Returns
        -------
        str
            e.g. ``4 cpu workers, 4 threads, 2 running, 2 idle, 1.00 GiB / 8.00 GiB``.
        """
        return (
            f"{_plural(g['workers'], g['kind'] + ' worker')}, {_plural(g['threads'], 'thread')}, "
            f"{g['running']} running, {g['idle']} idle, "
            f"{format_bytes(g['memory'])} / {format_bytes(g['memory_limit'])}"
        )

    def more_line(self) -> str:
        """The line that counts the groups past `MAX_GROUPS`.

        Returns
        -------
        str
            e.g. ``and 3 more host groups (12 workers)``.
        """
        n = sum(g["workers"] for g in self.more)
        return f"and {_plural(len(self.more), 'more host group')} ({_plural(n, 'worker')})"

    def idle_line(self) -> str:
        """How many workers run nothing.

        Returns
        -------
        str
            e.g. ``idle: 10 of 12 workers run nothing``.
        """
        return f"idle: {self.idle} of {self.total} workers run nothing"


class ClusterInfo:
    """What `%cluster status` shows: the cluster, its workers, GPUs and tasks."""

    def __init__(self, data: ClusterState, *, now: float | None = None, note: str | None = None):
        self.data = data
        self._now = now
        #: One line shown above the status (e.g. "Started cluster 'local'.").
        self.note = note

    def to_dict(self) -> dict[str, Any]:
        """The status as plain data.

        Returns
        -------
        dict
            A copy of the `nbcluster_info` answer (`nbcluster._wire.ClusterState`).
        """
        return dict(self.data)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    @property
    def workers(self) -> list[WorkerRow]:
        """One row per worker (`nbcluster._wire.WorkerRow`)."""
        return self.data["workers"]

    @property
    def totals(self) -> Totals:
        """Workers, cores, memory and GPUs in all (`cluster_totals`)."""
        return cluster_totals(self.data)

    def _summary(self) -> str:
        d, t = self.data, self.totals
        tasks = d.get("tasks", {})
        adaptive = d.get("adaptive")
        adapt = f", adaptive {adaptive['minimum']}-{adaptive['maximum']}" if adaptive else ""
        return (
            f"{_plural(t['workers'], 'worker')}, {_plural(t['cores'], 'core')}, "
            f"{format_bytes(t['memory'])} used of {format_bytes(t['memory_limit'])}"
            + (f", {_plural(t['gpus'], 'GPU')}" if t["gpus"] else "")
            + f"; tasks: {tasks.get('processing', 0)} running, {tasks.get('waiting', 0)} waiting"
            + adapt
        )

    def __repr__(self) -> str:
        d = self.data
        now = self._now or time.time()
        lines = [self.note] if self.note else []
        lines += [
            f"Cluster {d.get('name')!r} at {d.get('address')} "
            f"({_where(d)}" + (")" if d.get("external") else f", up {_age(d.get('created'), now)})"),
            "  " + self._summary(),
        ]
        if d.get("dashboard"):
            lines.append(_dashboard_line(d))
        rows = self.workers
        if len(rows) > MAX_ROWS:
            scale = Scale(rows)
            lines.append("  by host and kind:")
            lines += [f"    {g['host']:<16} {scale.group_line(g)}" for g in scale.groups]
            if scale.more:
                lines.append(f"    {scale.more_line()}")
            lines.append(f"  {scale.idle_line()}; busiest:" if scale.busiest else f"  {scale.idle_line()}")
            rows = scale.busiest
        for w in rows:
            lines.append(
                f"  {w['name']:<8} {w['kind']}  {w['nthreads']} thr  "
                f"{format_bytes(w['memory'] or 0)} / {format_bytes(w['memory_limit'] or 0)}  "
                f"cpu {w.get('cpu', 0):.0f}%  running {w.get('processing', 0)}  {_worker_place(w)}  "
                f"{_gpu_label(w)}".rstrip()
            )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        d = self.data
        now = self._now or time.time()
        e = html.escape
        workers = self.workers
        groups = ""
        if len(workers) > MAX_ROWS:
            scale = Scale(workers)
            cells = "".join(
                f"<tr><td>{e(g['host'])}</td><td>{e(scale.group_line(g))}</td></tr>" for g in scale.groups
            )
            if scale.more:
                cells += f'<tr><td colspan="2">{e(scale.more_line())}</td></tr>'
            groups = (
                f'<table class="nbcluster-groups"><thead><tr><th>host</th><th>by kind</th></tr></thead>'
                f"<tbody>{cells}</tbody></table><div>{e(scale.idle_line())}"
                + ("; the busiest:" if scale.busiest else "")
                + "</div>"
            )
            workers = scale.busiest
        rows = "".join(
            "<tr>"
            f"<td>{e(str(w['name']))}</td><td>{e(w['kind'])}</td><td>{w['nthreads']}</td>"
            f"<td>{e(format_bytes(w['memory'] or 0))} / {e(format_bytes(w['memory_limit'] or 0))}</td>"
            f"<td>{w.get('cpu', 0):.0f}%</td><td>{w.get('processing', 0)}</td>"
            f"<td>{e(w.get('host') or '')}</td><td>{e(str(w.get('job_id') or ''))}</td>"
            f"<td>{e(_gpu_label(w))}</td>"
            "</tr>"
            for w in workers
        )
        href = (proxied_dashboard(d) or d["dashboard"]) if d.get("dashboard") else None
        dash = f'<div>Dashboard: <a href="{e(href)}" target="_blank">{e(href)}</a></div>' if href else ""
        note = f"<div>{e(self.note)}</div>" if self.note else ""
        return (
            f'<div class="nbcluster-status">{note}'
            f"<strong>Cluster {e(str(d.get('name')))}</strong> <code>{e(str(d.get('address')))}</code>"
            f"<div>{e(self._summary())}</div>"
            f"<div>{e(_where(d).capitalize())}; up {e(_age(d.get('created'), now))}</div>{dash}{groups}"
            "<table><thead><tr><th>worker</th><th>kind</th><th>threads</th><th>memory</th>"
            "<th>CPU</th><th>running</th><th>host</th><th>job</th><th>GPU</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
        )


class ClusterList:
    """What `%cluster list` shows: every registered cluster with where it runs (its profile
    and backend, or external) and its live worker count.

    Items are `nbcluster_info` answers, or bare registry entries (``workers`` absent) for
    clusters whose scheduler did not answer in time; an external cluster is its ``info``.
    """

    def __init__(
        self, entries: Sequence[Mapping[str, Any]], current: str | None = None, *, now: float | None = None
    ):
        self.entries = entries
        self.current = current
        self._now = now

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> list[str]:
        """The clusters' names, in the list's order.

        Returns
        -------
        list of str
            One name per entry.
        """
        return [e["name"] for e in self.entries]

    def _rows(self) -> list[tuple[str, ...]]:
        now = self._now or time.time()
        rows: list[tuple[str, ...]] = []
        for e in self.entries:
            ws = e.get("workers")
            size = (
                f"{len(ws)} ({_plural(sum(w['nthreads'] for w in ws), 'core')})"
                if isinstance(ws, (list, tuple))
                else "not answering"
            )
            mark = "*" if e["name"] == self.current else " "
            rows.append(
                (
                    mark + e["name"],
                    runs_on(e),
                    e.get("address", ""),
                    size,
                    "started elsewhere" if e.get("external") else _owner(e.get("owner_pid")),
                    _age(e.get("created"), now),
                )
            )
        return rows

    def __repr__(self) -> str:
        if not self.entries:
            return "No clusters running. Start one with `%cluster start` (or `nbcluster start`)."
        header = (" name", "runs on", "address", "workers", "owner", "age")
        rows = [header, *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows
        )

    def _repr_html_(self) -> str:
        if not self.entries:
            return f"<div>{html.escape(repr(self))}</div>"
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self._rows()
        )
        return (
            '<table class="nbcluster-list"><thead><tr><th>name</th><th>runs on</th><th>address</th>'
            f"<th>workers</th><th>owner</th><th>age</th></tr></thead><tbody>{body}</tbody></table>"
        )
