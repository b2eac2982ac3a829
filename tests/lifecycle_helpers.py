"""Real processes for the lifecycle, fault and load tests: a Jupyter server, process exits, a busy start.

- `JupyterServer`: a plain `jupyter server` subprocess with nbcluster's extension, on a free
  loopback port with a token, in private config/runtime folders and its own cluster
  registry. Ready when it prints its "is running at" line (an event, not a sleep); always
  stopped, with the clusters it owns, on exit.
- `wait_catching`: waits until a process handles a signal (its kernel signal mask).
- `wait_gone`: waits for processes to exit on their pidfds (an event the kernel sends, so
  the measured time is the real one, not a polling interval).
- `busy_start_env`: environment that makes a cluster's start hang with the scheduler's
  thread spinning at 100 % CPU, as the issue's 10**9-worker start did, and a FIFO that
  says when it has begun (`Signal`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.browser_helpers import ServerLog
from tests.os_helpers import free_port
from tests.waiting import until

START_TIMEOUT_S = 90


def wait_gone(procs: list[psutil.Process], timeout: float) -> tuple[float, list[psutil.Process]]:
    """Seconds until every process in `procs` exited (or `timeout`), and those still alive."""
    start = time.monotonic()
    fds: dict[int, psutil.Process] = {}
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(p.pid)] = p
    try:
        while fds:
            remaining = timeout - (time.monotonic() - start)
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], remaining)
            for fd in ready:
                del fds[fd]
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    alive = [p for p in fds.values() if _running(p)]
    return time.monotonic() - start, alive


def wait_catching(pid: int, sig: int, timeout: float = 60) -> None:
    """Return once process `pid` has a handler for `sig` (the kernel's SigCgt mask), so a
    signal sent now reaches its handler, not the default action; fail after `timeout`."""
    def catching() -> bool:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return bool(caught & (1 << (sig - 1)))

    if not until(catching, timeout):
        raise AssertionError(f"process {pid} installed no handler for signal {sig} within {timeout} s")


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def busy_start_env(tmp: Path, seconds: float = 60) -> tuple[dict[str, str], Path]:
    """(env, fifo): a scheduler preload that opens `fifo`, writes one byte, then spins."""
    fifo = tmp / "busy.fifo"
    os.mkfifo(fifo)
    preload = tmp / "busy_preload.py"
    preload.write_text(
        textwrap.dedent(
            f"""
            import os, time

            def dask_setup(scheduler):
                try:  # tell a test that listens (ENXIO: nobody does)
                    fd = os.open({str(fifo)!r}, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b"x")
                    os.close(fd)
                except OSError:
                    pass
                end = time.monotonic() + {seconds}
                while time.monotonic() < end:  # busy: the event loop never gets control
                    pass
            """
        )
    )
    return {"DASK_DISTRIBUTED__SCHEDULER__PRELOAD": json.dumps([str(preload)])}, fifo


class Signal:
    """The reading end of the busy preload's FIFO: open it before the start, then `wait()`.

    Opened non-blocking so the open itself never hangs; Linux reports no hang-up on a FIFO
    that has never had a writer, so `select` waits for the byte.
    """

    def __init__(self, fifo: Path):
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)

    def wait(self, timeout: float = 60) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready or not os.read(self.fd, 1):
            raise TimeoutError(f"the busy start did not begin within {timeout} s")

    def __enter__(self) -> Signal:
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)


class JupyterServer(ServerLog):
    """`with JupyterServer(tmp) as server:` -> server.url, server.token, server.api(...)."""

    base_url = "/js/"

    def __init__(self, tmp: Path, env: dict[str, str] | None = None):
        self.tmp = tmp
        self.runtime_dir = tmp / "registry"
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}{self.base_url}"
        self.log_path = tmp / "jupyter-server.log"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def __enter__(self) -> JupyterServer:
        config = self.tmp / "config"
        config.mkdir(parents=True)
        (config / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}})
        )
        (self.tmp / "root").mkdir()
        self.runtime_dir.mkdir()
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_RUNTIME_DIR": str(self.tmp / "runtime"),
            "NBCLUSTER_RUNTIME_DIR": str(self.runtime_dir),
            **self.extra_env,
        }
        cmd = [
            sys.executable, "-m", "jupyter_server", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={self.base_url}", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.tmp / 'root'}", "--allow-root",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
        if not self._ready.wait(START_TIMEOUT_S) or self.proc.poll() is not None or not self._listening():
            self.__exit__()
            raise RuntimeError(f"jupyter server did not start; log:\n{self.log()}")
        return self

    def _listening(self, timeout: float = 10) -> bool:
        # The server logs "is running at" and then binds its port in the loop's first
        # callback: no event marks the bind, so connect until it answers (a few ms).
        def connects() -> bool:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True

        return bool(until(connects, timeout, 0.02, ignore=(ConnectionRefusedError,)))

    def api(self, method: str, path: str, body: Any = None, timeout: float = 120) -> tuple[int, Any]:
        """(status, JSON or None) of one authenticated REST call; never raises for 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        if data is None and method == "POST":
            data = b"{}"
        request = urllib.request.Request(
            f"{self.url}nbcluster/{path}", data=data, method=method,
            headers={"Authorization": f"token {self.token}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        return status, (json.loads(text) if text else None)

    def __exit__(self, *exc: Any) -> None:
        self._shut_down()
