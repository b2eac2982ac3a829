"""Cluster lifecycle through the Python API, with real supervisor and worker processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import textwrap

import psutil
import pytest
from distributed import Client, Security, get_worker

import nbcluster
from nbcluster.cluster import credentials, registry
from nbcluster.cluster.gpu import SIMULATE_ENV
from nbcluster.errors import BadArgument, ClusterNotFound, ClusterUnreachable, NoCluster
from tests import os_helpers
from tests.shell_helpers import one_clear_line


def _worker_count(handle: nbcluster.ClusterHandle) -> int:
    return len(handle.info().workers)


def test_start_scale_adapt_stop(runtime_dir):
    handle = nbcluster.start(workers=1, threads=1)
    assert handle.name == "local"
    assert handle.address.startswith("tls://127.0.0.1:")
    assert handle.client.submit(lambda x: x + 1, 1).result() == 2

    handle.scale(2)
    assert _worker_count(handle) == 2
    handle.scale(1)
    assert _worker_count(handle) == 1

    handle.adapt(minimum=1, maximum=2)
    assert handle.info()["adaptive"] == {"minimum": 1, "maximum": 2}
    # A backlog of slow tasks makes the adaptive cluster grow to its maximum.
    futures = handle.client.map(lambda i: __import__("time").sleep(0.5) or i, range(40))
    handle.client.wait_for_workers(2, timeout=60)
    assert sum(handle.client.gather(futures)) == sum(range(40))
    # An explicit scale takes control back from adaptivity.
    handle.scale(1)
    assert handle.info()["adaptive"] is None

    family = os_helpers.family(handle.entry["supervisor_pid"])
    handle.stop()
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not alive
    assert nbcluster.clusters() == []
    assert list(runtime_dir.iterdir()) == []


def test_default_client_and_plain_dask_use_the_current_cluster(runtime_dir):
    import dask
    import dask.array as da

    handle = nbcluster.start(workers=1)
    assert nbcluster.current() is handle
    from distributed import default_client

    assert default_client().scheduler.address == handle.address
    assert float(da.ones((100, 100), chunks=10).sum().compute()) == 10_000.0
    where = dask.delayed(lambda: get_worker().address)().compute()
    assert where in {w["address"] for w in handle.info().workers}


def test_a_current_cluster_stopped_or_killed_elsewhere_is_gone_at_its_next_use(runtime_dir, cli):
    # Each use asks whether the current cluster still runs; while its entry file and its
    # supervisor are as they were, the operating system answers without a registry read.
    handle = nbcluster.start(workers=0, name="elsewhere")
    assert nbcluster.current() is handle and nbcluster.current() is handle
    assert cli("stop", "elsewhere").returncode == 0  # as the sidebar or another kernel would
    assert nbcluster.current() is None
    with pytest.raises(NoCluster, match="no cluster is running") as info:
        nbcluster.distribute(lambda x: x, over=range(2))
    assert one_clear_line(str(info.value)), info.value

    killed = nbcluster.start(workers=0, name="killed")
    assert nbcluster.current() is killed and nbcluster.current() is killed
    supervisor = psutil.Process(killed.entry["supervisor_pid"])
    supervisor.kill()  # no stop, no entry removed: only the process is gone
    supervisor.wait(15)
    assert nbcluster.current() is None
    assert nbcluster.clusters() == []


def test_rerunning_start_reuses_the_cluster(runtime_dir):
    first = nbcluster.start(workers=1)
    again = nbcluster.start(workers=1)
    assert again.address == first.address and again.reused
    named = nbcluster.start(workers=1, name="exp")
    assert nbcluster.start(name="exp").address == named.address
    assert [h.name for h in nbcluster.clusters()] == ["local", "exp"]


def test_default_names_count_up_across_processes(runtime_dir, cli):
    # Another process's unnamed cluster takes "local"; ours must not reuse it.
    assert cli("start", "--workers", "0").returncode == 0
    mine = nbcluster.start(workers=0)
    assert mine.name == "local-2"


def test_cluster_started_elsewhere_is_listed_scaled_and_stopped_here(runtime_dir, cli):
    result = cli("start", "--workers", "1", "--name", "remote")
    assert result.returncode == 0, result.stderr
    assert "Started cluster 'remote'" in result.stdout
    [handle] = nbcluster.clusters()
    assert handle.name == "remote" and handle.entry["owner_pid"] is None  # CLI clusters are kept
    handle.scale(2)
    assert _worker_count(nbcluster.connect("remote")) == 2
    family = os_helpers.family(handle.entry["supervisor_pid"])
    nbcluster.connect("remote").stop()
    assert not psutil.wait_procs(family, timeout=15)[1]


def test_cluster_started_here_is_scaled_and_stopped_by_the_cli(runtime_dir, cli):
    handle = nbcluster.start(workers=1, name="here")
    assert "here" in cli("list").stdout
    assert cli("scale", "2", "--name", "here").returncode == 0
    assert _worker_count(handle) == 2
    result = cli("stop", "here")
    assert result.returncode == 0 and "Stopped 'here'" in result.stdout
    assert nbcluster.clusters() == []


def _start_in_subprocess(runtime_dir, *, keep: bool) -> tuple[subprocess.Popen[str], dict]:
    code = textwrap.dedent(
        f"""
        import json, sys, nbcluster
        h = nbcluster.start(workers=1, keep={keep})
        print(json.dumps(h.entry), flush=True)
        sys.stdin.read()
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "NBCLUSTER_RUNTIME_DIR": str(runtime_dir)},
    )  # fmt: skip
    return owner, json.loads(owner.stdout.readline())


def test_owner_killed_takes_the_cluster_and_its_workers_down(runtime_dir):
    owner, entry = _start_in_subprocess(runtime_dir, keep=False)
    try:
        family = os_helpers.family(entry["supervisor_pid"])
        assert len(family) >= 3  # supervisor, nanny's worker, and its resource tracker or more
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"still running 10 s after the owner died: {alive}"
        assert nbcluster.clusters() == []
    finally:
        owner.kill()


def test_kept_cluster_outlives_its_owner(runtime_dir):
    owner, entry = _start_in_subprocess(runtime_dir, keep=True)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    handle = nbcluster.connect(entry["name"])
    assert handle.entry["owner_pid"] is None
    assert handle.client.submit(lambda: 42).result() == 42
    handle.stop()


def _tls_probe(address: str, ca: str, cert: str | None = None, key: str | None = None) -> str:
    """What the scheduler does with a TLS client that trusts `ca` and presents `cert`:
    "answered" (it sent its Dask handshake) or "refused: <the alert it sent>"."""
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False  # the cluster's certificate names "dask-internal"
    if cert:
        context.load_cert_chain(cert, key)
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, context.wrap_socket(raw) as tls:
        try:
            return "answered" if tls.recv(64) else "closed"
        except (ssl.SSLError, ConnectionResetError) as error:
            return f"refused: {error}"


def test_tls_is_required(runtime_dir, tmp_path):
    handle = nbcluster.start(workers=0)
    host_port = handle.address.removeprefix("tls://")
    with pytest.raises((OSError, TimeoutError)):
        Client(f"tcp://{host_port}", timeout=3)
    with pytest.raises((OSError, TimeoutError)):
        Client(handle.address, security=Security.temporary(), timeout=3)  # the client refuses the server
    # The scheduler itself refuses clients that trust it but cannot prove they hold the
    # cluster's key (a TLS alert from the server, not a failed check on the client's side).
    tls = handle.entry["tls"]
    assert _tls_probe(handle.address, tls["ca_file"], tls["cert"], tls["key"]) == "answered"
    assert "alert certificate required" in _tls_probe(handle.address, tls["ca_file"])
    _, foreign = credentials.write_credentials(tmp_path, "stranger")
    assert "alert unknown ca" in _tls_probe(handle.address, tls["ca_file"], foreign["cert"], foreign["key"])
    # The credentials are private to the user.
    for key in ("cert", "key"):
        mode = stat.S_IMODE(os.stat(handle.entry["tls"][key]).st_mode)
        assert mode == 0o600
    assert stat.S_IMODE(os.stat(runtime_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(runtime_dir / "local.json").st_mode) == 0o600


def test_dead_supervisor_is_pruned_and_its_workers_exit(runtime_dir):
    handle = nbcluster.start(workers=1, keep=True)
    family = os_helpers.family(handle.entry["supervisor_pid"])
    os.kill(handle.entry["supervisor_pid"], signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive
    assert nbcluster.clusters() == []
    assert not (runtime_dir / "local.json").exists()
    assert not (runtime_dir / "local.key.pem").exists()


def test_registry_prunes_entries_of_reused_pids(runtime_dir):
    # Our own pid is alive, but not with that start time: the entry is stale.
    stale = {"name": "ghost", "state": "running", "supervisor_pid": os.getpid(), "supervisor_started": 1.0}
    registry.update(runtime_dir, "ghost", stale)
    assert registry.entries(runtime_dir) == []
    assert not (runtime_dir / "ghost.json").exists()


def test_a_registry_read_sees_every_change_at_once(runtime_dir):
    # A read answers from its last one while the file is the same: each update must show,
    # even one within the file system's timestamp tick, and a supervisor's death too.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = psutil.Process(child.pid).create_time()
        entry = {"name": "c", "state": "running", "address": "tls://a", "supervisor_pid": child.pid,
                 "supervisor_started": started}  # fmt: skip
        registry.update(runtime_dir, "c", entry)
        assert registry.read(runtime_dir, "c")["address"] == "tls://a"
        for n in range(20):  # as fast as it goes: many updates within one tick
            registry.update(runtime_dir, "c", {**entry, "address": f"tls://{n}"})
            assert registry.read(runtime_dir, "c")["address"] == f"tls://{n}"
        registry.read(runtime_dir, "c")["address"] = "changed by a caller"
        assert registry.read(runtime_dir, "c")["address"] == "tls://19"
        child.stdin.close()
        child.wait(10)
        assert registry.read(runtime_dir, "c") is None
        assert not (runtime_dir / "c.json").exists()
    finally:
        registry.remove(runtime_dir, "c")
        child.kill()
        child.wait(10)


def test_a_process_seen_alive_is_seen_gone_once_it_exits_even_unreaped():
    # Liveness is kept as a pidfd once a process was seen running as itself: it must still see
    # the exit, of a child not yet reaped (a zombie) too, and then drop the descriptor.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = psutil.Process(child.pid).create_time()
        assert registry.process_alive(child.pid, started) and registry.process_alive(child.pid, started)
        assert (child.pid, started) in registry._PIDFDS
        assert not registry.process_alive(child.pid, started + 5)  # another process by that pid
        child.stdin.close()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it has exited; not reaped: a zombie
        assert not registry.process_alive(child.pid, started)
        assert (child.pid, started) not in registry._PIDFDS
    finally:
        child.wait(10)


def test_restart_replaces_worker_processes(runtime_dir):
    handle = nbcluster.start(workers=2)
    before = set(handle.client.run(os.getpid).values())
    handle.restart()
    # Restart returns with the workers back: the status printed after it shows them.
    assert len(handle.info().data["workers"]) == 2
    after = set(handle.client.run(os.getpid).values())
    assert before and after and not before & after


def test_bad_input_is_one_clear_error(runtime_dir, monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "0")  # a machine without GPUs, whatever this one has
    with pytest.raises(BadArgument, match="whole number"):
        nbcluster.start(workers="two")
    with pytest.raises(BadArgument, match="at least 1"):
        nbcluster.start(threads=0)
    with pytest.raises(BadArgument, match="not a size"):
        nbcluster.start(memory="lots")
    with pytest.raises(BadArgument, match="no GPU"):
        nbcluster.start(gpu_workers=2)
    with pytest.raises(ClusterNotFound, match="no cluster named 'nope'"):
        nbcluster.connect("nope")
    with pytest.raises(ClusterUnreachable, match="no scheduler answers"):
        nbcluster.connect("tls://127.0.0.1:9")
    handle = nbcluster.start(workers=0)
    with pytest.raises(BadArgument, match="above --max"):
        handle.adapt(3, 1)
    with pytest.raises(BadArgument, match="at least 0"):
        handle.scale(-1)


def test_dashboard_only_when_asked_and_on_loopback(runtime_dir):
    import urllib.request

    from nbcluster.cluster.private_http import client_context

    plain = nbcluster.start(workers=0, name="plain")
    assert plain.dashboard_link is None
    handle = nbcluster.start(workers=0, name="dash", dashboard=True)
    # TLS with the cluster's own certificate (test_hub_dashboard.py: nobody else gets in).
    assert handle.dashboard_link.startswith("https://127.0.0.1:")
    health = handle.dashboard_link.replace("/status", "/health")
    with urllib.request.urlopen(health, timeout=10, context=client_context(handle.entry["tls"])) as r:
        assert r.status == 200


def test_a_kernels_client_connects_while_the_workers_start(runtime_dir):
    from nbcluster.cluster.handle import start

    handle = start(workers=2, threads=1, name="early", client=True)
    client = handle.client
    # The supervisor said where the scheduler listens before starting the workers: the
    # kernel's client was there first, and start returned with it connected.
    actions = [(e["action"], e.get("client")) for _, e in client.get_events("all")]
    first_worker = actions.index(("add-worker", None))
    assert ("add-client", client.id) in actions[:first_worker], actions
    assert client.submit(lambda: 1).result() == 1
    # Without `client`, as the server and the CLI start clusters: nobody connects early.
    plain = start(workers=1, threads=1, name="plain")
    assert plain._client is None
    plain_client = plain.client
    actions = [e["action"] for _, e in plain_client.get_events("all")]
    assert actions.index("add-worker") < actions.index("add-client")


def test_the_local_scheduler_relays_to_no_host(cluster):
    # Dask's /proxy route relays to any host and port; the local workers serve no pages,
    # so there is nothing to relay to (and its import cost every start ~0.15 s).
    import urllib.error
    import urllib.request

    from nbcluster.cluster.private_http import client_context

    port = cluster.client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.http_server.port)
    context = client_context(cluster.entry["tls"])
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", timeout=10, context=context) as r:
        assert r.status == 200  # the scheduler's HTTP server is up, and lets us in
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"https://127.0.0.1:{port}/proxy/9/127.0.0.1/status", timeout=10, context=context)
    assert refused.value.code == 404


def _listing_entries() -> list[dict]:
    worker = {"nthreads": 2}
    return [
        {"name": "local", "address": "tls://127.0.0.1:1", "profile": "local", "backend": "local",
         "owner_pid": 42, "created": 940.0, "workers": [worker, worker]},
        {"name": "hpc", "address": "tls://10.0.0.5:2", "profile": "hpc", "backend": "slurm",
         "owner_pid": None, "created": 400.0, "workers": []},
        # The registry entry alone: its scheduler did not answer.
        {"name": "farm", "address": "tls://10.0.0.6:3", "profile": "ssh", "backend": "ssh",
         "owner_pid": 7, "created": 1000.0},
        {"name": "tls://sched:8786", "address": "tls://sched:8786", "external": True, "workers": [worker]},
    ]  # fmt: skip


def test_list_says_where_each_cluster_runs():
    from nbcluster.cluster.info import ClusterList

    listing = ClusterList(_listing_entries(), current="hpc", now=1000.0)
    assert repr(listing).splitlines() == [
        " name              runs on      address            workers        owner              age",
        " local             local        tls://127.0.0.1:1  2 (4 cores)    pid 42             60.00 s",
        "*hpc               hpc (slurm)  tls://10.0.0.5:2   0 (0 cores)    kept (no owner)    600.00 s",
        " farm              ssh          tls://10.0.0.6:3   not answering  pid 7              0.00 us",
        " tls://sched:8786  external     tls://sched:8786   1 (2 cores)    started elsewhere  ?",
    ]
    page = listing._repr_html_()
    assert "<th>runs on</th>" in page
    cells = [row.split("</td><td>") for row in page.split("<tr><td>")[1:]]
    assert [c[1] for c in cells] == ["local", "hpc (slurm)", "ssh", "external"]
