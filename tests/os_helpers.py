"""The operating system's view of the tests' processes: a fresh Python, a free port, a silent one, a process tree, a memory size."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil


def fresh_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """What ``python -c CODE`` prints in a process of its own; one that fails fails the test with its stderr."""
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (the system picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def silent_port(host: str = "127.0.0.1") -> Iterator[int]:
    """Meanwhile, a port at `host` that accepts connections and never says a word.

    What a stuck server, or a host behind a firewall that drops its packets, looks like to a
    client: only the client's own timeout ends its wait.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        s.listen(8)
        yield int(s.getsockname()[1])


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


def stop_all(processes: list[subprocess.Popen[bytes]], timeout: float = 10) -> None:
    """Terminate `processes`, last started first, and kill any that outlive `timeout`."""
    for p in reversed(processes):
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
