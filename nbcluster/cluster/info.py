"""Displays of cluster state: `ClusterInfo` (one cluster) and `ClusterList` (the registry).

Both are plain data with a text form (terminals, logs, the CLI) and an HTML form (notebooks);
they never fetch anything themselves.
"""

from __future__ import annotations

import html
import time
from typing import Any

from dask.utils import format_bytes, format_time


def _age(created: float | None, now: float) -> str:
    return format_time(max(now - created, 0)) if created else "?"


def _owner(pid: int | None) -> str:
    return f"pid {pid}" if pid else "kept (no owner)"


def runs_on(d: dict[str, Any]) -> str:
    """Where a cluster runs: ``local``, its profile with the backend the name does not
    already say (``hpc (slurm)``, ``slurm``), or ``external`` for a scheduler nbcluster did
    not start (the sidebar card shows the same words, sent by the REST list)."""
    if d.get("external"):
        return "external"
    profile = d.get("profile") or (d.get("spec") or {}).get("profile") or "local"
    backend = d.get("backend") or ("local" if profile == "local" else None)
    return profile if backend in (None, profile) else f"{profile} ({backend})"


def _where(d: dict[str, Any]) -> str:
    """The owner, or for a scheduler nbcluster did not start, that it is external."""
    if d.get("external"):
        return "external: started elsewhere, scale and stop are its owner's"
    owner = f"owner: {_owner(d.get('owner_pid'))}"
    where = runs_on(d)
    return f"profile {where}, {owner}" if where != "local" else owner


def _worker_place(w: dict[str, Any]) -> str:
    """Where a worker runs: its host, and its batch job where there is one."""
    job = f" job {w['job_id']}" if w.get("job_id") else ""
    return f"{w.get('host') or ''}{job}"


def _gpu_label(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return ""
    mem = f", {format_bytes(gpu['memory_total'])}" if gpu.get("memory_total") else ""
    sim = " [simulated]" if gpu.get("simulated") else ""
    return f"GPU {gpu['index']}: {gpu['name']}{mem}{sim}"


def cluster_totals(data: dict[str, Any]) -> dict[str, int]:
    """Workers, cores, memory used and available, and GPUs of an `nbcluster_info` answer.

    The memory available is the sum of the workers' limits, but never more than a host
    has: Dask's default limit gives every worker its share of the machine when it starts,
    so workers added later (scale, adapt) would sum past the machine's RAM. ``host_memory``
    (from the supervisor, for the hosts it can see) holds each host's RAM. The sidebar's
    card shows these same numbers (the server sends them as ``totals``).
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
        "gpus": sum(1 for w in ws if w.get("gpu")),
        "simulated_gpus": sum(1 for w in ws if (w.get("gpu") or {}).get("simulated")),
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class ClusterInfo:
    """What `%cluster status` shows: the cluster, its workers, GPUs and tasks."""

    def __init__(self, data: dict[str, Any], *, now: float | None = None, note: str | None = None):
        self.data = data
        self._now = now
        #: One line shown above the status (e.g. "Started cluster 'local'.").
        self.note = note

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def workers(self) -> list[dict[str, Any]]:
        return self.data.get("workers", [])

    @property
    def totals(self) -> dict[str, Any]:
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
            lines.append(f"  dashboard: {d['dashboard']}")
        for w in self.workers:
            lines.append(
                f"  {w['name']:<8} {w['kind']}  {w['nthreads']} thr  "
                f"{format_bytes(w['memory'] or 0)} / {format_bytes(w['memory_limit'] or 0)}  "
                f"cpu {w.get('cpu', 0):.0f}%  running {w.get('processing', 0)}  {_worker_place(w)}  "
                f"{_gpu_label(w.get('gpu'))}".rstrip()
            )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        d = self.data
        now = self._now or time.time()
        e = html.escape
        rows = "".join(
            "<tr>"
            f"<td>{e(str(w['name']))}</td><td>{e(w['kind'])}</td><td>{w['nthreads']}</td>"
            f"<td>{e(format_bytes(w['memory'] or 0))} / {e(format_bytes(w['memory_limit'] or 0))}</td>"
            f"<td>{w.get('cpu', 0):.0f}%</td><td>{w.get('processing', 0)}</td>"
            f"<td>{e(w.get('host') or '')}</td><td>{e(str(w.get('job_id') or ''))}</td>"
            f"<td>{e(_gpu_label(w.get('gpu')))}</td>"
            "</tr>"
            for w in self.workers
        )
        dash = (
            f'<div>Dashboard: <a href="{e(d["dashboard"])}" target="_blank">{e(d["dashboard"])}</a></div>'
            if d.get("dashboard")
            else ""
        )
        note = f"<div>{e(self.note)}</div>" if self.note else ""
        return (
            f'<div class="nbcluster-status">{note}'
            f"<strong>Cluster {e(str(d.get('name')))}</strong> <code>{e(str(d.get('address')))}</code>"
            f"<div>{e(self._summary())}</div>"
            f"<div>{e(_where(d).capitalize())}; up {e(_age(d.get('created'), now))}</div>{dash}"
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
        self, entries: list[dict[str, Any]], current: str | None = None, *, now: float | None = None
    ):
        self.entries = entries
        self.current = current
        self._now = now

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> list[str]:
        return [e["name"] for e in self.entries]

    def _rows(self) -> list[tuple[str, ...]]:
        now = self._now or time.time()
        rows = []
        for e in self.entries:
            ws = e.get("workers")
            size = (
                f"{len(ws)} ({sum(w['nthreads'] for w in ws)} cores)"
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
