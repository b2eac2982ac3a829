"""Waiting for the machine to settle before a sample, for the benches."""

from __future__ import annotations

import time


def settle(quiet_s: float = 0.2, at_most_s: float = 15.0, share: float = 0.01) -> bool:
    """Wait until the processes this one started use under `share` of a core (at most `at_most_s`).

    What one peer leaves behind must not be charged to the next: a spare supervisor that a
    stop has just launched imports for half a second; workers and a scheduler release the
    20,000 tasks a peer has just gathered. In a notebook that has long finished by the time
    the next cell runs. Returns whether they did.
    """
    import psutil

    me = psutil.Process()
    deadline = time.monotonic() + at_most_s

    def busy() -> float:
        total = 0.0
        for child in me.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    before = busy()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = busy()
        if now - before < share * quiet_s:
            return True
        before = now
    return False
