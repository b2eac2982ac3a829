"""Several hosts, and one cut off mid-cell: the `ssh` backend across network namespaces.

Four hosts (`netns_service`): the notebook's kernel runs on host 0, the scheduler on host 1
and one worker on each of hosts 2 and 3, all started by that host's sshd through Dask's
`SSHCluster` (the profile's `hosts`). The kernel reaches the scheduler only over the bridge,
with the cluster's TLS. The kernel runs inside host 0's namespace; the test talks to it
through Unix sockets (ZeroMQ's `ipc` transport), which a network namespace does not fence.

The cut: once items run on both worker hosts, host 3's cable goes down. Its worker keeps
running but nothing reaches it; the scheduler drops it after the profile's `worker_ttl`,
and its items run again on host 2. Every item still comes back exactly once.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.netns_kernel import Kernel, profile
from tests.netns_service import Hosts, driver_env, leftover_namespaces

pytestmark = pytest.mark.timeout(300)

ITEMS = 16
ITEM_S = 0.8  # long enough that an item started on the cut host is still running at the cut


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    with Hosts(tmp_path / "hosts", 4) as made:
        yield made
    assert leftover_namespaces() == []


def test_items_survive_a_worker_host_cut_off(hosts: Hosts, tmp_path: Path) -> None:
    env = driver_env(tmp_path, profile(hosts))
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open: items never block on it
    # A writer held open too, so the reader sees no end-of-file between items' writes.
    keep = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    _, scheduler_host, *worker_hosts = hosts.addresses
    try:
        with Kernel(hosts, 0, tmp_path / "kernel", env) as kernel:
            seen = kernel.run(
                "%load_ext nbcluster\n%cluster start --profile hosts --name hosts\n"
                "import json, nbcluster\nh = nbcluster.current()\n"
                f"FIFO = {str(fifo)!r}",
                address="json.dumps(h.address)",
                workers="json.dumps(sorted(w['host'] for w in h.info().workers))",
            )
            # The kernel, on host 0, reaches the scheduler on host 1 over TLS.
            assert seen["address"].startswith(f"tls://{scheduler_host}:"), seen
            assert seen["workers"] == worker_hosts, seen

            kernel.kc.execute(
                f'%%distribute --over "x in range({ITEMS})" --into res\n'
                "import os, time\nfrom distributed import get_worker\n"
                "fd = os.open(FIFO, os.O_WRONLY | os.O_NONBLOCK)\n"
                "os.write(fd, f'{x} {get_worker().address}\\n'.encode())\nos.close(fd)\n"
                f"time.sleep({ITEM_S})\n"
                "(x, get_worker().address)"
            )
            started = _until_both_hosts_busy(reader, worker_hosts)
            hosts.cut(3)
            cut_at = time.monotonic()
            reply = kernel.kc.get_shell_msg(timeout=180)
            while reply["parent_header"].get("msg_type") != "execute_request":
                reply = kernel.kc.get_shell_msg(timeout=180)
            assert reply["content"]["status"] == "ok", reply["content"]
            after = kernel.run(
                "",
                results="json.dumps([list(v) for v in res])",
                workers="json.dumps(sorted(w['host'] for w in h.info().workers))",
            )
            took = time.monotonic() - cut_at

            results = after["results"]
            # Every item exactly once, in order.
            assert [x for x, _ in results] == list(range(ITEMS)), results
            host_of = {x: _host(address) for x, address in results}
            # Items running on the cut host at the cut came back from the other host.
            on_cut = [x for x, address in started if _host(address) == worker_hosts[1]]
            rerun = [x for x in on_cut if host_of[x] == worker_hosts[0]]
            assert rerun, f"no item started on the cut host ran again on the other: {started}, {host_of}"
            assert set(host_of.values()) <= set(worker_hosts)
            # The lost worker has left the status; the other remains.
            assert after["workers"] == [worker_hosts[0]], after
            assert took < 120, took

            kernel.run("%cluster stop hosts")
            # The reachable worker and the scheduler ended with the stop; the cut-off one
            # cannot be told to, and ends by its death timeout (or the namespaces' removal).
            dask_processes = [p for p in _processes(hosts, 1, 2) if "distributed" in _cmd(p)]
            _, left = psutil.wait_procs(dask_processes, timeout=30)
            assert not left, [_cmd(p) for p in left]
    finally:
        os.close(keep)
        os.close(reader)


def test_hosts_are_removed_when_the_test_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="a failing test"), Hosts(tmp_path / "hosts", 2) as made:
        sshds = [psutil.Process(s.proc.pid) for s in made._servers if s.proc is not None]
        assert len(sshds) == 2 and made.run_in(1, "ip", "-br", "addr").stdout.count(made.addresses[1]) == 1
        raise RuntimeError("a failing test")
    assert leftover_namespaces() == []
    assert not [p for p in sshds if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _until_both_hosts_busy(fd: int, worker_hosts: list[str], timeout: float = 120) -> list[tuple[int, str]]:
    """Item starts, read from the FIFO until both worker hosts have started one."""
    started: list[tuple[int, str]] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while {_host(a) for _, a in started} < set(worker_hosts):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise TimeoutError(f"items did not start on both worker hosts within {timeout} s: {started}")
        buffer += os.read(fd, 4096)
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            x, address = line.decode().split()
            started.append((int(x), address))
    return started


def _host(address: str) -> str:
    return address.split("://")[-1].rsplit(":", 1)[0]


def _processes(hosts: Hosts, *indices: int) -> list[psutil.Process]:
    out = []
    for i in indices:
        for pid in hosts.pids(i):
            with contextlib.suppress(psutil.NoSuchProcess):
                out.append(psutil.Process(pid))
    return out


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return ""
