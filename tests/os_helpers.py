"""The operating system's view of the tests' processes: a free port, a process tree, a memory size."""

from __future__ import annotations

import socket

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (the system picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def family(pid: int, *, gone_ok: bool = False) -> list[psutil.Process]:
    """Process `pid` and every process below it, the root first.

    A process that is gone raises `psutil.NoSuchProcess`, so a test of its exit cannot pass
    on an empty list; with `gone_ok` (a clean-up that finds it ended already) it is [].
    """
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        if gone_ok:
            return []
        raise


def rss() -> int:
    """This process's resident memory, in bytes (also where a worker runs it, through `client.run`)."""
    return int(psutil.Process().memory_info().rss)
