"""A real single-node Grid Engine (SGE) for the tests: Debian's `gridengine-master` and
`gridengine-exec`, in a cell of their own.

The packages install the binaries and one `default` cell; the tests never use or change it.
`running()` makes a cell of its own under ``$SGE_ROOT`` (``nbct-<pid>``) whose spool folders
live in a temporary folder, on free ports (``SGE_QMASTER_PORT``, ``SGE_EXECD_PORT``), starts
`sge_qmaster` and `sge_execd` for it, adds this host as submit and execution host with one
queue, and sets the cell's environment in this process for the kernels and supervisors the
tests start. Afterwards it always deletes the cell's jobs, stops both daemons (their own
shutdown, then SIGKILL) and removes the cell, even when the tests fail.

What the cell needs here, each for a reason:

- ``host_aliases`` names this host and ``localhost`` as one: the daemons resolve a loopback
  peer to ``localhost`` and refuse it when it differs from the host's own name;
- ``min_uid``/``min_gid`` 0: the tests run as root, which SGE refuses by default;
- ``load_report_time`` of 5 s: the first load report makes the host schedulable;
- the scheduler runs as a job is submitted or ends (``flush_submit_sec``), not every 15 s.
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
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.os_helpers import free_port
from tests.waiting import until, waited_for

SGE_ROOT = Path("/var/lib/gridengine")
QUEUE = "test.q"
ADMIN = "sgeadmin"  # the packages' admin user
CONFIG = Path("/usr/share/gridengine/default-configuration")
RESOURCES = Path("/usr/share/gridengine/util/resources")
FLUSH = ("flush_submit_sec", "flush_finish_sec")
#: What a Grid Engine command raises while its daemon is not up yet (`SgeService.run`).
NOT_YET = (RuntimeError, subprocess.TimeoutExpired)


def available() -> bool:
    """Whether Debian's Grid Engine packages are installed and this process may run them."""
    return os.geteuid() == 0 and all(
        Path(p).exists() for p in ("/usr/sbin/sge_qmaster", "/usr/sbin/sge_execd", "/usr/bin/qsub", SGE_ROOT / "util")
    )


@dataclass
class SgeService:
    cell: str
    folder: Path
    ports: tuple[int, int]

    @property
    def env(self) -> dict[str, str]:
        return {
            "SGE_ROOT": str(SGE_ROOT), "SGE_CELL": self.cell,
            "SGE_QMASTER_PORT": str(self.ports[0]), "SGE_EXECD_PORT": str(self.ports[1]),
        }  # fmt: skip

    def run(self, *cmd: str, check: bool = True, user: str | None = None) -> str:
        if user is not None:  # as the admin user, with this cell's environment
            cmd = ("runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in self.env.items()), *cmd)
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=60)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def jobs(self) -> list[dict[str, str]]:
        """This cell's pending and running jobs: id, name, state (``qstat``'s columns)."""
        out = self.run("qstat", "-u", "*")
        return [
            {"id": f[0], "name": f[2], "state": f[4]}
            for f in (line.split() for line in out.splitlines()[2:])
            if len(f) >= 5
        ]


def _write_cell(service: SgeService, host: str) -> None:
    common = SGE_ROOT / service.cell / "common"
    common.mkdir(parents=True)
    bootstrap = {
        "admin_user": ADMIN, "default_domain": "none", "ignore_fqdn": "false", "spooling_method": "berkeleydb",
        "spooling_lib": "libspoolb", "spooling_params": str(service.folder / "spooldb"),
        "binary_path": "/usr/sbin", "qmaster_spool_dir": str(service.folder / "qmaster"),
        "security_mode": "none", "listener_threads": "2", "worker_threads": "2", "scheduler_threads": "1",
    }  # fmt: skip
    (common / "bootstrap").write_text("Version: 6.2\n" + "".join(f"{k} {v}\n" for k, v in bootstrap.items()))
    (common / "act_qmaster").write_text(host + "\n")
    (common / "host_aliases").write_text(f"{host} localhost\n")
    for name in ("qmaster", "qmaster/job_scripts", "spooldb", "execd"):
        (service.folder / name).mkdir(parents=True, exist_ok=True)
    config = CONFIG.read_text()
    for key, value in {
        "min_uid": "0", "min_gid": "0", "load_report_time": "00:00:05",
        "execd_spool_dir": str(service.folder / "execd"),
    }.items():  # fmt: skip
        config = "\n".join(
            f"{key} {value}" if line.split()[:1] == [key] else line for line in config.splitlines()
        ) + "\n"
    (service.folder / "global").write_text(config)
    for top in (service.folder, SGE_ROOT / service.cell):  # the qmaster writes in both as its admin user
        shutil.chown(top, ADMIN, ADMIN)
        for path in top.rglob("*"):
            shutil.chown(path, ADMIN, ADMIN)
    spool = str(service.folder / "spooldb")
    service.run("/usr/lib/gridengine/spoolinit", "berkeleydb", "libspoolb", spool, "init", user=ADMIN)
    service.run("/usr/lib/gridengine/spooldefaults", "configuration", str(service.folder / "global"), user=ADMIN)
    service.run("/usr/lib/gridengine/spooldefaults", "complexes", str(RESOURCES / "centry"), user=ADMIN)
    service.run("/usr/lib/gridengine/spooldefaults", "usersets", str(RESOURCES / "usersets"), user=ADMIN)
    service.run("/usr/lib/gridengine/spooldefaults", "managers", ADMIN, user=ADMIN)


def _queue(host: str) -> str:
    fields = {
        "qname": QUEUE, "hostlist": host, "seq_no": "0", "load_thresholds": "NONE", "suspend_thresholds": "NONE",
        "nsuspend": "1", "suspend_interval": "00:05:00", "priority": "0", "min_cpu_interval": "00:05:00",
        "processors": "UNDEFINED", "qtype": "BATCH INTERACTIVE", "ckpt_list": "NONE", "pe_list": "NONE",
        "rerun": "FALSE", "slots": "4", "tmpdir": "/tmp", "shell": "/bin/sh", "prolog": "NONE", "epilog": "NONE",
        "shell_start_mode": "posix_compliant", "starter_method": "NONE", "suspend_method": "NONE",
        "resume_method": "NONE", "terminate_method": "NONE", "notify": "00:00:60", "owner_list": "NONE",
        "user_lists": "NONE", "xuser_lists": "NONE", "subordinate_list": "NONE", "complex_values": "NONE",
        "projects": "NONE", "xprojects": "NONE", "calendar": "NONE", "initial_state": "default",
    }  # fmt: skip
    limits = ("s_rt", "h_rt", "s_cpu", "h_cpu", "s_fsize", "h_fsize", "s_data", "h_data", "s_stack", "h_stack",
              "s_core", "h_core", "s_rss", "h_rss", "s_vmem", "h_vmem")  # fmt: skip
    return "".join(f"{k} {v}\n" for k, v in fields.items()) + "".join(f"{k} INFINITY\n" for k in limits)


def _pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def running() -> Iterator[SgeService]:
    """A cell with this host as its one execution host, its environment set in this process."""
    host = socket.gethostname()
    folder = Path(tempfile.mkdtemp(prefix="nbcluster-sge-"))
    service = SgeService(f"nbct-{os.getpid()}", folder, (free_port(), free_port()))
    saved = {k: os.environ.get(k) for k in service.env}
    try:
        _write_cell(service, host)
        os.environ.update(service.env)
        service.run("/usr/sbin/sge_qmaster")  # it daemonizes
        # The daemons start in the background and say nothing when ready: polled.
        waited_for(lambda: host in service.run("qconf", "-sh"), "qmaster of the test SGE", 60, ignore=NOT_YET)
        service.run("qconf", "-as", host)
        exec_host = folder / "exec_host"
        exec_host.write_text(f"hostname {host}\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\n"
                             "xuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\n"
                             "report_variables NONE\n")  # fmt: skip
        service.run("qconf", "-Ae", str(exec_host))
        queue = folder / QUEUE
        queue.write_text(_queue(host))
        service.run("qconf", "-Aq", str(queue))
        # The scheduler runs at once when a job is submitted or ends, not every 15 s.
        sched = folder / "sched_conf"
        sched.write_text("\n".join(
            f"{f[0]} {'0:0:1' if f[0] == 'schedule_interval' else '1' if f[0] in FLUSH else ' '.join(f[1:])}"
            for f in (line.split() for line in service.run("qconf", "-ssconf").splitlines()) if f
        ) + "\n")  # fmt: skip
        service.run("qconf", "-Msconf", str(sched))
        service.run("/usr/sbin/sge_execd")  # it daemonizes
        # The host's load column turns from "-" to a number with the execd's first report.
        waited_for(lambda: any(line.split()[:1] == [host] and line.split()[6] != "-"
                               for line in service.run("qhost").splitlines()),
                   "execution host of the test SGE", 60, ignore=NOT_YET)  # fmt: skip
        yield service
    finally:
        with contextlib.suppress(Exception):
            service.run("qdel", "-f", "-u", "*", check=False)
        with contextlib.suppress(Exception):
            service.run("qconf", "-ke", host, check=False)
        with contextlib.suppress(Exception):
            service.run("qconf", "-km", check=False)
        for pidfile in [folder / "qmaster" / "qmaster.pid", *folder.glob("execd/*/execd.pid")]:
            pid = _pid(pidfile)
            if pid is not None and not until(lambda pid=pid: not _alive(pid), 10, interval=0.1):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(SGE_ROOT / service.cell, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
