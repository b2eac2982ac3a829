"""The launcher: starting supervisor processes, a pre-warmed spare, and reaping them.

`nbcluster.start` (through `ClusterHandle`'s module) asks `spawn` for a cluster: it takes
the spare supervisor if one is ready (`prewarm`, which ``%load_ext nbcluster`` calls: the
spare has already paid Python's start-up and nbcluster's imports) or launches one, sends it
the request as one JSON line on its stdin, and blocks on the one-line answer on the ready
pipe (the protocol is in ``supervisor.py``), within ``nbcluster.timeouts.start``; a line
before it may say where the scheduler already listens (`spawn`'s ``on_scheduler``). A start
that is too slow or interrupted tears the supervisor's whole process group down, so nothing
half-started stays behind.

Every supervisor runs in a session of its own (a kernel interrupt must not reach the
cluster). The supervisors this process started are its children: `reap_children` collects
those that have exited (stopped from elsewhere), so none stays a zombie while this process
lives, and `wait_gone` waits for one to exit on its pidfd after a stop.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.config

from nbcluster import _wire, config
from nbcluster._start_up import START_UP_VARIABLE
from nbcluster.cluster import forkserver, registry, startlog
from nbcluster.cluster.spec import ClusterSpec
from nbcluster.errors import ClusterFailed

STOP_TIMEOUT_S = 30


@dataclass
class _Launched:
    """A supervisor process that has started (and imported) but not yet been asked for a cluster."""

    proc: subprocess.Popen[bytes]
    ready_r: int
    log: Path

    def discard(self) -> None:
        os.close(self.ready_r)
        if self.proc.stdin:
            self.proc.stdin.close()  # EOF: the supervisor exits without starting anything
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: What a supervisor runs as (``python -m ...``; see ``cluster/__main__.py``).
SUPERVISOR_MODULE = "nbcluster.cluster"
#: The supervisor's flag for a request whose workers run elsewhere (no forkserver ahead).
NO_FORKSERVER = "--no-forkserver"


def is_supervisor(cmdline: list[str]) -> bool:
    """Whether a process's command line is a supervisor's, as `prewarm` and `spawn` launch it.

    Parameters
    ----------
    cmdline : list of str
        The command line (`psutil.Process.cmdline`).

    Returns
    -------
    bool
        True for ``python -m nbcluster.cluster ...``.
    """
    return any(a == "-m" and b == SUPERVISOR_MODULE for a, b in itertools.pairwise(cmdline))


_spare: _Launched | None = None
#: Supervisors started from this process that run clusters (see `reap_children`).
_children: list[subprocess.Popen[bytes]] = []
_keep_warm = False
_spare_lock = threading.Lock()


def _launch(directory: Path, *, local: bool = True, for_request: bool = False) -> _Launched:
    """A new supervisor; `local` False (a request for a backend whose workers run elsewhere)
    tells it not to start a forkserver for local workers (``--no-forkserver``). Launched for
    a request at once (`for_request`, no spare), it gets the workers' environment as
    predicted here, to start its forkserver with before it loads Dask's config
    (`forkserver.ahead_environ`)."""
    startlog.prune_stale(directory)
    log = startlog.new_path(directory)
    ready_r, ready_w = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        SUPERVISOR_MODULE,
        "--ready-fd",
        str(ready_w),
        "--log",
        str(log),
    ]
    if not local:
        cmd.append(NO_FORKSERVER)
    env = dict(os.environ)
    if local and for_request:
        env.update(forkserver.ahead_environ(env))
    env[START_UP_VARIABLE] = "1"  # its imports without the cyclic GC (nbcluster/__init__.py)
    fd = startlog.open_locked(log)
    try:
        # A new session: a kernel interrupt (SIGINT to the kernel's process group) must not
        # reach the cluster; the owner watch is what ties the two together. The environment
        # is `os.environ`, as the request will send it, not the C library's copy, which can
        # hold more (readline sets COLUMNS and LINES there): the supervisor starts its
        # workers' forkserver with it before the request comes (forkserver.py).
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=fd, stderr=fd, pass_fds=(ready_w,), start_new_session=True,
            env=env,
        )  # fmt: skip
    finally:
        os.close(fd)
        os.close(ready_w)
    return _Launched(proc, ready_r, log)


def prewarm(runtime_dir: str | os.PathLike[str] | None = None) -> None:
    """Keep one supervisor launched ahead of time, so `start` skips its Python start-up.

    `%load_ext nbcluster` calls this: a spare costs two idle processes, the supervisor and
    the forkserver its workers will be forked from (about 55 and 45 MiB of their own here;
    they exit when this process does), and saves most of a `%cluster start`: the
    supervisor's Python start-up and imports, and each worker's. A spare used by a start is
    replaced when a cluster is next stopped from this process.

    Parameters
    ----------
    runtime_dir : path, optional
        The registry folder the spare will serve (default: nbcluster's runtime folder).
    """
    global _spare, _keep_warm
    directory = registry.runtime_dir(runtime_dir)
    with _spare_lock:
        _keep_warm = True
        if _spare is not None and _spare.proc.poll() is None and _spare.log.parent == directory:
            return
        if _spare is not None:
            _spare.discard()
        _spare = _launch(directory)


def discard_spare() -> None:
    """Stop the spare supervisor, if any, and stop keeping one."""
    global _spare, _keep_warm
    with _spare_lock:
        _keep_warm = False
        if _spare is not None:
            _spare.discard()
            _spare = None


def _take(directory: Path, spec: ClusterSpec) -> _Launched:
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None and spare.proc.poll() is None and spare.log.parent == directory:
        return spare
    if spare is not None:
        spare.discard()
    return _launch(directory, local=spec.backend == "local", for_request=True)


def spawn(
    spec: ClusterSpec,
    directory: Path,
    owner: int | None,
    *,
    force: bool = False,
    on_scheduler: Callable[[dict[str, Any]], None] | None = None,
) -> _wire.RegistryEntry:
    """A new cluster's registry entry, once its supervisor reports it running.

    Parameters
    ----------
    spec : ClusterSpec
        The checked start request.
    directory : Path
        The registry folder.
    owner : int or None
        The pid whose exit stops the cluster; None keeps it (``--keep``).
    force : bool
        Lift the machine-derived limits (``--force``).
    on_scheduler : callable, optional
        Called with ``{"address": ..., "tls": ...}`` where the scheduler is up before its
        workers (the local backend), while they start; the start may still fail after it.

    Returns
    -------
    RegistryEntry
        The running cluster's entry (`nbcluster._wire.RegistryEntry`).

    Raises
    ------
    ClusterFailed
        When the supervisor does not report it running in time (the message names the start log).
    """
    timeout = config.seconds("timeouts.start")  # a bad setting stops us before a process is taken
    launched = _take(directory, spec)
    proc = launched.proc
    # The caller's nbcluster settings too: a `dask.config.set` in a notebook applies to the
    # clusters it starts, as it would to a LocalCluster started there. So do the sections
    # of the deployment projects a profile leaves the rest to (`jobqueue.slurm`, `gateway`).
    settings = {k: dask.config.config[k] for k in _FORWARDED_CONFIG if k in dask.config.config}
    request = {
        "spec": spec.to_dict(), "runtime_dir": str(directory), "owner": owner, "env": dict(os.environ),
        "force": force, "config": settings,
    }  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.close()
        lines = _Lines(launched.ready_r, timeout)
        line = lines.next()
        while line and "scheduler" in (early := json.loads(line)):
            if on_scheduler is not None:
                on_scheduler(early["scheduler"])
            line = lines.next()
    except BaseException as error:
        # Too slow, or interrupted (Ctrl-C, a server shutting down): nothing half-started
        # may stay behind, whatever phase the supervisor is in.
        _tear_down(proc)
        if isinstance(error, TimeoutError):
            log = startlog.keep_failed(launched.log)
            raise ClusterFailed(
                f"the cluster was not ready within {timeout:g} s (nbcluster.timeouts.start) and was "
                f"stopped; its log: {log or '(none)'}"
            ) from None
        raise
    finally:
        os.close(launched.ready_r)
    if not line:
        proc.wait(10)
        log = startlog.keep_failed(launched.log)
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log else []
        raise ClusterFailed(
            f"the cluster supervisor exited before the cluster was up (exit code {proc.poll()}); "
            f"its log: {log or '(none)'}. Last lines: {' | '.join(tail) or '(none)'}"
        )
    message = json.loads(line)
    if not message.get("ok"):
        proc.wait(10)
        raise ClusterFailed(f"the cluster did not start: {message.get('error')}")
    reap_children()
    _children.append(proc)
    entry: _wire.RegistryEntry = message["entry"]
    return entry


#: Dask config sections a supervisor gets from the process that asks it for a cluster.
_FORWARDED_CONFIG = ("nbcluster", "jobqueue", "gateway", "kubernetes")


def _tear_down(proc: subprocess.Popen[bytes]) -> None:
    """Stop a supervisor and its workers: SIGTERM (it exits within 2 s), then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(3)
    # It runs in a session of its own (see `_launch`), so its process group is it and its
    # workers: anything still there after the grace period is killed with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _Lines:
    """The supervisor's report lines on the ready pipe, all within one deadline."""

    def __init__(self, fd: int, timeout: float):
        self.fd = fd
        self.deadline = time.monotonic() + timeout
        self.data = b""

    def next(self) -> str:
        """The next line; '' if the supervisor exited first; TimeoutError if too slow."""
        while b"\n" not in self.data:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return ""
                self.data += chunk
        line, _, self.data = self.data.partition(b"\n")
        return line.decode() + "\n"


def keep_warm() -> bool:
    """Whether this process keeps a spare supervisor.

    Returns
    -------
    bool
        True once `prewarm` was called.
    """
    return _keep_warm


def wait_gone(pid: int | None, started: float | None) -> None:
    """Wait for a supervisor to exit (SIGTERM after STOP_TIMEOUT_S, SIGKILL 10 s later).

    On its pidfd, which is readable once the process has exited: a supervisor that is not
    our child stays a zombie until the process that started it reaps it, and waiting for
    the pid to disappear would wait out the whole timeout (it did: 40 s per CLI stop).

    Parameters
    ----------
    pid : int or None
        The supervisor's pid (None: nothing to wait for).
    started : float or None
        Its start time, so that a reused pid is not taken for it.
    """
    if not registry.process_alive(pid, started):
        return
    assert pid is not None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        for timeout, then in ((STOP_TIMEOUT_S, signal.SIGTERM), (10, signal.SIGKILL)):
            if select.select([fd], [], [], timeout)[0]:
                return
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, then)
    finally:
        os.close(fd)


def reap_children() -> None:
    """Collect the exit status of supervisors this process started and that have exited
    (stopped from elsewhere), so that none stays a zombie while this process lives."""
    _children[:] = [proc for proc in _children if proc.poll() is None]
