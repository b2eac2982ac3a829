"""A real single-node SLURM for the tests: munged, slurmctld and slurmd from a generated conf.

Everything lives in one temporary folder (conf, state, spool, logs, the munge key and
socket), so nothing on the machine is changed: the client commands (`sbatch`, `squeue`,
`scancel`) find the conf through ``SLURM_CONF``, which `SlurmService.env` gives and which
`running` also sets in this process for the kernels and supervisors it starts. The recipe is
the one in ``../shared/BUILD-NOTES.md``; it needs root (slurmd runs jobs as their users).

`running()` starts the three daemons, waits for the node to be idle, and always stops them
(SIGTERM, then SIGKILL) and cancels any job left, even when the tests fail; conftest.py's
`slurm` fixture is one for the whole session. `slurm_options` is what a profile asks of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.jobqueue_helpers import jobqueue_options
from tests.os_helpers import free_port
from tests.waiting import until

PARTITION = "debug"
DAEMONS = ("munged", "slurmctld", "slurmd")


def slurm_options(jobs_dir: Path, queue: str = PARTITION, **more: Any) -> dict[str, Any]:
    """`jobqueue_options` for this SLURM, whose one node takes jobs beyond its cores."""
    return jobqueue_options(queue, jobs_dir, job_extra_directives=["--oversubscribe"], **more)


@dataclass
class SlurmService:
    folder: Path
    conf: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True) -> str:
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=30)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> list[dict[str, str]]:
        """This SLURM's queued and running jobs: id, name, state."""
        out = self.run("squeue", "--noheader", "--format=%i|%j|%T")
        return [dict(zip(("id", "name", "state"), line.split("|"), strict=True)) for line in out.split()]

    def wait_jobs(self, predicate, timeout: float = 30) -> list[dict[str, str]]:
        """Poll squeue (SLURM has no event to wait on) until `predicate(jobs)` holds."""
        jobs: list[dict[str, str]] = []

        def reached() -> bool:
            jobs[:] = self.jobs()
            return bool(predicate(jobs))

        if not until(reached, timeout, interval=0.2):
            raise AssertionError(f"squeue did not reach the expected state in {timeout} s: {jobs}")
        return jobs

    def all_cancelled(self, timeout: float = 30) -> bool:
        """True once every job is gone, if none is still queued or running now.

        A cancelled job stays in squeue as COMPLETING while SLURM reaps its processes, so
        squeue may list it for a moment after `scancel` has returned.
        """
        live = [job for job in self.jobs() if job["state"] not in ("COMPLETING", "CANCELLED")]
        assert not live, f"jobs still queued or running after the stop: {live}"
        self.wait_jobs(lambda jobs: not jobs, timeout)
        return True

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted(self.folder.glob("*.log"))
        )


def _conf(folder: Path, munge_socket: Path, port: int) -> str:
    host = socket.gethostname()
    cpus = os.cpu_count() or 1
    mem = max(psutil.virtual_memory().available // 2**20 - 1024, 1024)
    paths = {
        "StateSaveLocation": folder / "state",
        "SlurmdSpoolDir": folder / "spool",
        "SlurmctldPidFile": folder / "slurmctld.pid",
        "SlurmdPidFile": folder / "slurmd.pid",
        "SlurmctldLogFile": folder / "slurmctld.log",
        "SlurmdLogFile": folder / "slurmd.log",
    }
    for key in ("StateSaveLocation", "SlurmdSpoolDir"):
        paths[key].mkdir()
    lines = [
        "ClusterName=nbcluster-test",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={port}",
        f"SlurmdPort={port + 1}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        *(f"{k}={v}" for k, v in paths.items()),
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        # Jobs of a test end when it is done with them; nothing waits for a kill timeout.
        "KillWait=2",
        f"NodeName={host} CPUs={cpus} RealMemory={mem} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
    ]
    return "\n".join(lines) + "\n"


def _free_port_pair() -> int:
    # slurmctld and slurmd need two ports; an even one whose successor is free too.
    for _ in range(50):
        port = free_port("")
        with socket.socket() as s2:
            try:
                s2.bind(("", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free neighbouring ports for slurmctld and slurmd")


def missing() -> str | None:
    """Why SLURM cannot run here, or None."""
    if os.geteuid() != 0:
        return "the SLURM tests need root (slurmd runs the jobs); run them as root, as .ci/run does"
    absent = [d for d in (*DAEMONS, "sbatch") if shutil.which(d) is None]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} missing): apt-get install -y slurm-wlm munge"
    return None


@contextlib.contextmanager
def running() -> Iterator[SlurmService]:
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    folder = Path(tempfile.mkdtemp(prefix="nbcluster-slurm-"))
    folder.chmod(0o755)
    munge_socket = folder / "munge.socket"
    key = folder / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = folder / "slurm.conf"
    conf.write_text(_conf(folder, munge_socket, _free_port_pair()))
    service = SlurmService(folder, conf)
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        # Foreground daemons, so that each is our child and stopped by its pid.
        service.procs.append(
            _start(
                folder, "munged", "-F", "-f", f"--socket={munge_socket}", f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
                f"--seed-file={folder / 'munged.seed'}",
            )
        )  # fmt: skip
        _wait_for(munge_socket.exists, 10, "munged did not create its socket", service)
        service.procs.append(_start(folder, "slurmctld", "-D", "-f", str(conf)))
        service.procs.append(_start(folder, "slurmd", "-D", "-f", str(conf)))
        _wait_for(lambda: _node_idle(service), 30, "the SLURM node did not become idle", service)
        yield service
    finally:
        with contextlib.suppress(Exception):
            service.run("scancel", "--full", "--user=root", check=False)
        for proc in reversed(service.procs):
            _stop(proc)
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(folder, ignore_errors=True)


def _start(folder: Path, *cmd: str) -> subprocess.Popen[bytes]:
    out = (folder / f"{cmd[0]}.out.log").open("ab")
    # Own sessions: a Ctrl-C of pytest must not reach them before the fixture stops them.
    return subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # slurmd's job steps (slurmstepd) are in its session: nothing of this SLURM stays.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _node_idle(service: SlurmService) -> bool:
    out = service.run("sinfo", "--noheader", "--format=%t", check=False).split()
    return "idle" in out


def _wait_for(condition, timeout: float, what: str, service: SlurmService) -> None:
    # Daemons start in the background and say nothing when ready: polling is the only way.
    # A daemon that exits ends the wait at once, with the logs.
    def dead() -> list[str]:
        return [p.args[0] for p in service.procs if p.poll() is not None]

    if not until(lambda: condition() or dead(), timeout, interval=0.2) or dead():
        raise RuntimeError(f"{what} (exited: {dead() or 'none'})\n{service.log_tail()}")
