"""Summaries that stay the same size however many workers a cluster has.

A cluster of 1,000 workers cannot be shown, or sent to a browser four times a second, one
worker at a time. These functions reduce per-worker facts to a bounded shape, shared by the
scheduler plugin (``bands`` and ``summary`` in each snapshot), ``%cluster status`` and the
sidebar:

- `spread`: ``(min, median, max)`` of some values (the charts draw these as a band);
- `band`: one such spread per resource, across every worker's latest sample;
- `LatestBand`: the same band kept up to date one worker at a time, so that a sampling
  round costs what changed, not a step per worker the cluster holds;
- `hosts`: workers, threads, running tasks and memory per host, the busiest hosts first,
  at most `MAX_HOSTS` of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nbcluster._wire import Band, HostTotals, Spread

#: At most this many hosts are described one by one (the rest are counted, not named).
MAX_HOSTS = 20


def spread(values: Sequence[float]) -> Spread | None:
    """``(min, median, max)`` of `values`.

    Parameters
    ----------
    values : Sequence of float
        Any numbers.

    Returns
    -------
    Spread or None
        The three numbers (a list once sent as JSON), or None when there are no values.
    """
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return (v[0], median, v[-1])


def band(time: float, samples: Iterable[Mapping[str, Any]]) -> Band:
    """The distribution across workers of their latest samples (the plugin's sample shape).

    GPU fields are spread over the workers that report them, and left out where none does.

    Parameters
    ----------
    time : float
        The moment the samples describe.
    samples : Iterable of Mapping
        Each worker's latest sample (``cpu``, ``memory``, ``memory_limit``, ``gpu_util``).

    Returns
    -------
    Band
        The spreads, with how many workers they cover.
    """
    rows = list(samples)
    out: Band = {
        "time": time,
        "workers": len(rows),
        "cpu": spread([r.get("cpu") or 0.0 for r in rows]),
        "memory": spread([r.get("memory") or 0 for r in rows]),
        "memory_limit": (spread([r.get("memory_limit") or 0 for r in rows]) or (0, 0, 0))[1],
    }
    gpu = spread([r["gpu_util"] for r in rows if r.get("gpu_util") is not None])
    if gpu is not None:
        out["gpu_util"] = gpu
    return out


class LatestBand:
    """`band` of every worker's latest sample, kept up to date one worker at a time.

    `put` a worker's new sample, `drop` a worker that left; `band` then returns exactly what
    `band` of the samples held would. Each resource's latest values are kept by worker, so a
    new sample costs a few dict assignments, and a band sorts the values in C (``sorted``
    of a dict's values) with no Python step per worker: the plugin's sampling round at 1,000
    workers (a few dozen new heartbeats each half second) costs what changed, plus ~0.1 ms.

    Examples
    --------
    >>> latest = LatestBand()
    >>> latest.put("a", {"cpu": 10.0, "memory": 5, "memory_limit": 100})
    >>> latest.put("b", {"cpu": 30.0, "memory": 7, "memory_limit": 100})
    >>> latest.put("a", {"cpu": 20.0, "memory": 6, "memory_limit": 100})
    >>> latest.band(1.0)
    {'time': 1.0, 'workers': 2, 'cpu': (20.0, 25.0, 30.0), 'memory': (6, 6.5, 7), 'memory_limit': 100.0}
    """

    def __init__(self) -> None:
        self._cpu: dict[str, float] = {}
        self._memory: dict[str, float] = {}
        self._limit: dict[str, float] = {}
        self._gpu: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._cpu)

    def put(self, worker: str, sample: Mapping[str, Any]) -> None:
        """Hold `sample` as `worker`'s latest (in place of its previous one).

        Parameters
        ----------
        worker : str
            The worker's address.
        sample : Mapping
            Its sample (``cpu``, ``memory``, ``memory_limit``, ``gpu_util`` if reported).
        """
        # The same coercions as `band`, so that both give the same numbers.
        self._cpu[worker] = sample.get("cpu") or 0.0
        self._memory[worker] = sample.get("memory") or 0
        self._limit[worker] = sample.get("memory_limit") or 0
        gpu = sample.get("gpu_util")
        if gpu is None:
            self._gpu.pop(worker, None)
        else:
            self._gpu[worker] = gpu

    def drop(self, worker: str) -> None:
        """Forget `worker` (it left, or reports no sample any more).

        Parameters
        ----------
        worker : str
            The worker's address.
        """
        for values in (self._cpu, self._memory, self._limit, self._gpu):
            values.pop(worker, None)

    def band(self, time: float) -> Band:
        """`band` of the samples held.

        Parameters
        ----------
        time : float
            The moment the samples describe.

        Returns
        -------
        Band
            The spreads, with how many workers they cover.
        """
        out: Band = {
            "time": time,
            "workers": len(self._cpu),
            "cpu": spread(list(self._cpu.values())),
            "memory": spread(list(self._memory.values())),
            "memory_limit": (spread(list(self._limit.values())) or (0, 0, 0))[1],
        }
        gpu = spread(list(self._gpu.values()))
        if gpu is not None:
            out["gpu_util"] = gpu
        return out


def hosts(totals: Mapping[str, Sequence[int]], limit: int = MAX_HOSTS) -> tuple[list[HostTotals], int]:
    """Per-host totals, the hosts with the most workers first.

    Parameters
    ----------
    totals : Mapping of str to sequence of int
        By host: its workers, threads, tasks processing, memory and memory limit (bytes),
        in that order (what the plugin adds up in one pass over the scheduler's workers).
    limit : int
        The most hosts returned one by one.

    Returns
    -------
    tuple of (list of HostTotals, int)
        The first `limit` hosts, and how many more there are.

    Examples
    --------
    >>> hosts({"10.0.0.2": [2, 4, 1, 100, 800], "10.0.0.1": [3, 3, 0, 50, 900]}, limit=1)
    ([{'host': '10.0.0.1', 'workers': 3, 'threads': 3, 'processing': 0, 'memory': 50, 'memory_limit': 900}], 1)
    """
    ranked = sorted(totals.items(), key=lambda item: (-item[1][0], item[0]))
    out: list[HostTotals] = [
        {"host": host, "workers": w, "threads": t, "processing": p, "memory": m, "memory_limit": lim}
        for host, (w, t, p, m, lim) in ranked[:limit]
    ]
    return out, max(0, len(ranked) - limit)
