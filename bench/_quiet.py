"""Waiting for the machine to settle before a sample, for the benches."""

from __future__ import annotations

import time


def _children_cpu() -> float:
    """CPU seconds the processes this one started have used so far."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def idle_share(seconds: float = 1.0, windows: int = 3) -> float:
    """The share of a core the processes this one started use when nothing runs (the least of `windows`).

    An idle Dask cluster is not at zero: its scheduler and workers heartbeat and sample their
    resources, 4-8% of a core each on this machine (plain `LocalCluster` as much as
    nbcluster's). A settle threshold under that never settles.
    """
    least = float("inf")
    for _ in range(windows):
        before = _children_cpu()
        time.sleep(seconds)
        least = min(least, (_children_cpu() - before) / seconds)
    return least


def settle(quiet_s: float = 0.2, at_most_s: float = 15.0, share: float = 0.01) -> bool:
    """Wait until the processes this one started use under `share` of a core (at most `at_most_s`).

    What one peer leaves behind must not be charged to the next: a spare supervisor that a
    stop has just launched imports for half a second; workers and a scheduler release the
    20,000 tasks a peer has just gathered. In a notebook that has long finished by the time
    the next cell runs. Returns whether they did.
    """
    deadline = time.monotonic() + at_most_s
    before = _children_cpu()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _children_cpu()
        if now - before < share * quiet_s:
            return True
        before = now
    return False
