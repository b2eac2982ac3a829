"""Faults out there: remote processes whose scheduler is gone, on the netns hosts.

Three hosts (`netns_service`): host 0 runs a Python process that starts a cluster through
the ``ssh`` profile (its supervisor is that process's child, on host 0), the scheduler runs
on host 1 and two nannies on host 2, each started by host 2's sshd, with nbcluster's own
worker options and a short death timeout. Each worker runs a task that never ends (the case
where a worker waits for its task before exiting).

Then the scheduler side goes, hard: the driver, its supervisor and the scheduler are
killed with SIGKILL, and in the "cut off" case host 2's cable is pulled first, so that not
even a TCP reset reaches it. Every process on host 2 that SSH started must be gone within the
death timeout plus the watch's slack (`nanny_watch`: one echo interval and the close).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.netns_service import Hosts, leftover_namespaces

pytestmark = pytest.mark.timeout(240)

DEATH_TIMEOUT_S = 8.0
#: One echo interval (death timeout / 10, at least 0.5 s) and the nanny's close (5 s at most).
SLACK_S = 7.0

DRIVER = """
import json, sys, time
from nbcluster.cluster.handle import start

h = start(profile="hosts", name="faults")
client = h.client

def forever():
    import time
    while True:
        time.sleep(1)

workers = list(client.scheduler_info()["workers"])
futures = [client.submit(forever, pure=False, workers=[w]) for w in workers]
deadline = time.monotonic() + 60
while sum(len(v) for v in client.processing().values()) < len(workers):
    if time.monotonic() > deadline:
        sys.exit("the tasks did not start")
    time.sleep(0.05)
print(json.dumps({"address": h.address, "workers": workers}), flush=True)
sys.stdin.read()  # until the test kills this process
"""


def profile(hosts: Hosts) -> dict[str, Any]:
    return {
        "backend": "ssh",
        "description": "A scheduler host and a worker host behind a bridge",
        "options": {
            "hosts": [hosts.addresses[1], hosts.addresses[2], hosts.addresses[2]],
            "connect_options": hosts.connect_options(),
            "scheduler_options": {"interface": "eth0", "port": 0},
            "worker_options": {"interface": "eth0", "nthreads": 1, "death_timeout": f"{DEATH_TIMEOUT_S:g}s"},
            "remote_python": sys.executable,
        },
    }


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    with Hosts(tmp_path / "hosts", 3) as made:
        yield made
    assert leftover_namespaces() == []


def remote_processes(hosts: Hosts, i: int) -> list[psutil.Process]:
    """The processes SSH sessions started on host i (its nannies and their workers)."""
    out = []
    for pid in hosts.pids(i):
        try:
            p = psutil.Process(pid)
            if p.name() != "sshd":
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("cut", [False, True], ids=["killed", "cut off"])
def test_remote_nannies_end_within_their_death_timeout_once_the_scheduler_is_gone(
    hosts: Hosts, tmp_path: Path, cut: bool
) -> None:
    config = tmp_path / "dask"
    config.mkdir()
    (config / "hosts.yaml").write_text(yaml.safe_dump({"nbcluster": {"profiles": {"hosts": profile(hosts)}}}))
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")},
        "DASK_CONFIG": str(config),
        "NBCLUSTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(
        [*hosts.prefix(0), sys.executable, "-c", DRIVER], env=env, cwd=Path(__file__).parent.parent,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line, f"the driver exited: {(tmp_path / 'driver.log').read_text()[-2000:]}"
        started = json.loads(line)
        assert started["address"].startswith(f"tls://{hosts.addresses[1]}:"), started
        assert len(started["workers"]) == 2, started
        remote = remote_processes(hosts, 2)
        nannies = [p for p in remote if "distributed.cli.dask_spec" in " ".join(p.cmdline())]
        assert len(nannies) == 2, [p.cmdline() for p in remote]

        if cut:
            hosts.cut(2)
        # The driver and its supervisor (host 0, each in a session of its own), the scheduler (host 1).
        for p in remote_processes(hosts, 0) + remote_processes(hosts, 1):
            p.kill()
        gone_at = time.monotonic()
        _, alive = psutil.wait_procs(remote, timeout=DEATH_TIMEOUT_S + SLACK_S)
        took = time.monotonic() - gone_at
        assert not alive, (
            f"{len(alive)} processes on the worker host outlived their scheduler by {took:.1f} s "
            f"(death timeout {DEATH_TIMEOUT_S:g} s): {[' '.join(p.cmdline())[:120] for p in alive]}"
        )
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(timeout=30)
        log.close()
