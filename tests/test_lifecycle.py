"""Starts bounded in time, stops within 2 s in every phase, and faults on real processes.

Every process here is real: supervisors, workers, `nbcluster` commands, Jupyter servers. A
"busy start" is a scheduler preload spinning the supervisor's main thread at 100 % CPU (see
`lifecycle_helpers.busy_start_env`), the state the issue's 10**9-worker start got into.
Exit times are measured on pidfds, so they are the kernel's, not a polling interval's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dask
import psutil
import pytest

import nbcluster
from nbcluster.cluster import registry, startlog
from nbcluster.cluster.launcher import prewarm
from nbcluster.errors import ClusterFailed
from tests.lifecycle_helpers import JupyterServer, Signal, busy_start_env, wait_catching, wait_gone
from tests.os_helpers import family

pytest_plugins = ["pytest_jupyter.jupyter_server"]

def _leftovers(directory: Path) -> list[str]:
    """Files in the registry folder other than kept failure logs."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith(startlog.FAILED))


def _entry(directory: Path, name: str) -> dict:
    return json.loads((directory / f"{name}.json").read_text())


# -- time bounds -------------------------------------------------------------------------


def test_a_start_not_ready_in_time_is_torn_down_and_its_log_kept(runtime_dir, tmp_path, monkeypatch):
    env, _ = busy_start_env(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the supervisor gets this process's environment
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with dask.config.set({"nbcluster.timeouts.start": "2s"}), pytest.raises(ClusterFailed) as failed:
        nbcluster.start(workers=0, name="slow")
    took = time.monotonic() - started
    message = str(failed.value)
    assert "not ready within 2 s (nbcluster.timeouts.start) and was stopped" in message
    assert "\n" not in message
    # 2 s of waiting, then at most 2 s for the supervisor to go, plus margin for a loaded CI.
    assert took < 6, f"took {took:.1f} s"
    log = Path(message.rsplit("its log: ", 1)[1])
    assert log.parent == runtime_dir and log.name.startswith(startlog.FAILED) and log.exists()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert _leftovers(runtime_dir) == [] and nbcluster.clusters() == []


def test_a_start_whose_workers_fail_after_the_client_connected_leaves_nothing(runtime_dir, tmp_path, monkeypatch):
    import gc

    from distributed import Client

    # The scheduler is up (the kernel's client connects early), then every worker process
    # dies as it starts: a spawned one as Python runs sitecustomize, before anything of
    # Dask's; one forked from the supervisor's forkserver as the fork returns.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if '--multiprocessing-fork' in sys.argv:\n    os._exit(3)\n"
        "if b'multiprocessing.forkserver' in open('/proc/self/cmdline', 'rb').read():\n"
        "    os.register_at_fork(after_in_child=lambda: os._exit(3))\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def open_clients() -> set[int]:
        # type(), not isinstance(): isinstance asks some lazy objects for __class__, and torch's
        # deprecated `reduce_op` warns when asked.
        return {id(c) for c in gc.get_objects() if issubclass(type(c), Client) and c.status not in ("closed", "closing")}

    clients = open_clients()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ClusterFailed) as failed:
        nbcluster.start(workers=1, name="doomed")
    message = str(failed.value)
    assert message.startswith("the cluster did not start: ") and "\n" not in message
    assert "its log: " in message
    assert open_clients() <= clients  # the client that connected early was closed
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert _leftovers(runtime_dir) == [] and nbcluster.clusters() == []


def test_sigterm_ends_a_busy_start_within_2_s(runtime_dir, tmp_path, cli):
    env, fifo = busy_start_env(tmp_path)
    with Signal(fifo) as begun:
        command = subprocess.Popen(
            [sys.executable, "-m", "nbcluster.cli", "start", "--workers", "0", "--name", "busy"],
            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            begun.wait()
            supervisor = _entry(runtime_dir, "busy")["supervisor_pid"]
            procs = family(supervisor)
            os.kill(supervisor, signal.SIGTERM)
            took, alive = wait_gone(procs, timeout=10)
            _out, err = command.communicate(timeout=30)
        finally:
            command.kill()
    log = err.rsplit("its log: ", 1)[-1].split(". Last lines")[0]
    tail = Path(log).read_text()[-1500:] if Path(log).is_file() else "(no log)"
    assert not alive and took < 2.0, f"supervisor took {took:.2f} s; still alive: {alive}; log: {tail}"
    assert command.returncode == 2 and err.count("\n") == 1 and "exited before the cluster was up" in err
    assert _leftovers(runtime_dir) == []


def test_sigterm_stops_a_running_cluster_and_its_workers_within_2_s(runtime_dir):
    handle = nbcluster.start(workers=2, keep=True)
    procs = family(handle.entry["supervisor_pid"])
    assert len(procs) >= 3
    os.kill(procs[0].pid, signal.SIGTERM)
    took, alive = wait_gone(procs, timeout=10)
    assert not alive and took < 2.0, f"took {took:.2f} s; still alive: {alive}"
    assert nbcluster.clusters() == [] and _leftovers(runtime_dir) == []


def test_a_spare_supervisor_leaves_at_once_on_sigterm(runtime_dir):
    from nbcluster.cluster import launcher

    prewarm(runtime_dir)
    spare = launcher._spare
    assert spare is not None
    try:
        # Past its imports, as a spare waiting for a request is: a signal before that meets
        # Python's default action, and the next launch prunes the log (the test below).
        wait_catching(spare.proc.pid, signal.SIGTERM)
        assert [p.name for p in runtime_dir.iterdir()] == [spare.log.name]
        spare.proc.send_signal(signal.SIGTERM)
        took, alive = wait_gone([psutil.Process(spare.proc.pid)], timeout=5)
        assert not alive and took < 2.0
    finally:
        launcher.discard_spare()
    # Its .start log went with it.
    assert list(runtime_dir.iterdir()) == []


def test_a_killed_supervisors_start_log_is_pruned_but_a_live_ones_is_not(runtime_dir):
    from nbcluster.cluster import launcher

    prewarm(runtime_dir)
    spare = launcher._spare
    assert spare is not None
    try:
        (log,) = runtime_dir.glob(".start-*.log")
        startlog.prune_stale(runtime_dir)
        assert log.exists()  # its supervisor lives
        spare.proc.kill()
        spare.proc.wait()
        startlog.prune_stale(runtime_dir)
        assert not log.exists()
    finally:
        launcher.discard_spare()


def test_a_cluster_started_here_stops_promptly_from_another_process_and_leaves_no_zombie(runtime_dir, cli):
    handle = nbcluster.start(workers=0, name="here")
    supervisor = psutil.Process(handle.entry["supervisor_pid"])
    started = time.monotonic()
    result = cli("stop", "here")
    took = time.monotonic() - started
    assert result.returncode == 0 and "Stopped 'here'" in result.stdout
    # The supervisor is our child: exited, it is a zombie until we reap it, and the other
    # process must not wait for the pid to vanish (it used to wait out its 40 s timeout).
    assert took < 10, f"`nbcluster stop` took {took:.1f} s"
    nbcluster.clusters()  # any registry read here reaps exited supervisors we started
    try:
        zombie = supervisor.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        zombie = False
    assert not zombie


# -- start logs ----------------------------------------------------------------------------


def test_concurrent_starts_of_one_name_give_one_cluster_and_leave_no_logs(runtime_dir, cli):
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [
        threading.Thread(target=lambda: results.append(cli("start", "--workers", "0", "--name", "race")))
        for _ in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One starts it. Each other start either found it still starting (its name is taken: one
    # line, status 2) or already running (it is used: status 0), never a traceback.
    started = [r for r in results if r.returncode == 0 and "Started cluster 'race'" in r.stdout]
    assert len(started) == 1, [(r.returncode, r.stdout, r.stderr) for r in results]
    for r in results:
        if r is started[0]:
            continue
        if r.returncode == 0:
            assert "Cluster 'race' is already running: using it" in r.stdout and not r.stderr, r.stderr
        else:
            assert r.returncode == 2, r.stderr
            assert r.stderr.count("\n") == 1 and "a cluster named 'race' is already running" in r.stderr
    assert [h.name for h in nbcluster.clusters()] == ["race"]
    # The winner's start log became the cluster's log; the four losers left nothing.
    assert sorted(p.name for p in runtime_dir.iterdir()) == ["race.cert.pem", "race.json", "race.key.pem", "race.log"]
    nbcluster.connect("race").stop()
    assert list(runtime_dir.iterdir()) == []


def test_failed_start_logs_are_capped(runtime_dir):
    with dask.config.set({"nbcluster.logs.failed-starts": 2}):
        kept = []
        for i in range(4):
            log = startlog.new_path(runtime_dir)
            log.write_text(f"failure {i}")
            os.utime(log, (1000 + i, 1000 + i))  # distinct ages, oldest first
            kept.append(startlog.keep_failed(log))
    remaining = sorted(runtime_dir.iterdir())
    assert [p.read_text() for p in sorted(remaining, key=lambda p: p.stat().st_mtime)] == ["failure 2", "failure 3"]
    assert set(remaining) == set(kept[2:])


# -- faults --------------------------------------------------------------------------------


def _plant(directory: Path, name: str, owner: subprocess.Popen, **fields) -> Path:
    """A registry entry naming a live process (so it is not pruned as stale)."""
    entry = {
        "name": name, "state": "running", "address": "tls://127.0.0.1:9",
        "supervisor_pid": owner.pid, "supervisor_started": psutil.Process(owner.pid).create_time(),
        **fields,
    }  # fmt: skip
    registry.update(directory, name, entry)
    return directory / f"{name}.json"


@pytest.fixture
def live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait()


def test_entries_of_another_user_or_with_loose_permissions_are_refused(runtime_dir, live_process, caplog):
    loose = _plant(runtime_dir, "loose", live_process)
    loose.chmod(0o644)
    linked = runtime_dir / "linked.json"
    linked.symlink_to(_plant(runtime_dir.parent, "elsewhere", live_process))
    names = ["loose", "linked"]
    if os.getuid() == 0:
        os.chown(_plant(runtime_dir, "foreign", live_process), 65534, 65534)
        names.append("foreign")
    with caplog.at_level(logging.WARNING, logger="nbcluster"):
        assert nbcluster.clusters() == []
        assert nbcluster.clusters() == []  # polled again: no second warning
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(names), warnings
    assert any("readable or writable by others (mode 644" in w for w in warnings)
    assert any("cannot be opened safely" in w for w in warnings)
    if "foreign" in names:
        assert any("belongs to another user (uid 65534)" in w for w in warnings)
    # Refused, not deleted: they are not ours to remove.
    assert all((runtime_dir / f"{n}.json").exists() or (runtime_dir / f"{n}.json").is_symlink() for n in names)
    for n in names:
        (runtime_dir / f"{n}.json").unlink()


def test_corrupted_entries_are_ignored_and_pruned(runtime_dir, live_process):
    from nbcluster.cluster.registry import write_private

    for name, text in [("torn", '{"name": "torn", "sta'), ("listed", "[1, 2]")]:
        write_private(runtime_dir / f"{name}.json", text)
    (runtime_dir / "torn.key.pem").write_text("left by a crash")
    _plant(runtime_dir, "good", live_process)
    assert [h.name for h in nbcluster.clusters()] == ["good"]
    assert sorted(p.name for p in runtime_dir.iterdir()) == ["good.json"]
    (runtime_dir / "good.json").unlink()


def test_an_unwritable_registry_folder_is_one_clear_line(tmp_path):
    import shutil

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    prefix: list[str] = []
    if os.getuid() == 0:
        # root writes anywhere; without CAP_DAC_OVERRIDE it meets the folder's permissions
        # like any user: a folder owned by someone else, 0700, is closed to it.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux's setpriv to drop CAP_DAC_OVERRIDE")
        os.chown(locked, 65534, 65534)
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--"]
    else:
        locked.chmod(0o500)
    try:
        for target, words in [(locked, "cannot write to the cluster registry folder"), (locked / "sub", "cannot create")]:
            done = subprocess.run(
                [*prefix, sys.executable, "-m", "nbcluster.cli", "start", "--workers", "0"],
                env={**os.environ, "NBCLUSTER_RUNTIME_DIR": str(target)}, capture_output=True, text=True,
                timeout=60,
            )  # fmt: skip
            assert done.returncode == 2, done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
            assert words in done.stderr and "NBCLUSTER_RUNTIME_DIR" in done.stderr
    finally:
        locked.chmod(0o700)


@pytest.fixture
def jp_server_config(runtime_dir):
    return {"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}}


async def test_the_dashboard_proxy_refuses_a_planted_non_loopback_address(jp_fetch, runtime_dir, live_process):
    from tornado.httpclient import HTTPClientError

    entry = _plant(runtime_dir, "planted", live_process, dashboard="http://10.11.12.13:8787/status")
    try:
        with pytest.raises(HTTPClientError) as refused:
            await jp_fetch("nbcluster", "dashboard", "planted", "status")
        assert refused.value.code == 403
        assert "not on loopback" in refused.value.response.reason
    finally:
        entry.unlink()


def test_a_killed_server_takes_its_clusters_down_within_10_s(tmp_path):
    with JupyterServer(tmp_path) as server:
        status, cluster = server.api("POST", "api/clusters", {"workers": 1, "name": "owned"})
        assert status == 201, cluster
        procs = family(cluster["supervisor_pid"])
        assert len(procs) >= 3
        server.proc.kill()  # kill -9: no shutdown hooks, no cleanup in the server
        server.proc.wait()
        _took, alive = wait_gone(procs, timeout=10)
        assert not alive, f"still running 10 s after the server died: {alive}"
        assert nbcluster.clusters(runtime_dir=server.runtime_dir) == []
        assert _leftovers(server.runtime_dir) == []


def test_the_server_stops_within_5_s_while_a_start_is_busy(tmp_path):
    env, fifo = busy_start_env(tmp_path)
    with Signal(fifo) as begun, JupyterServer(tmp_path / "server", env=env) as server:
        answers: list[tuple[int, object]] = []

        def post() -> None:
            try:
                answers.append(server.api("POST", "api/clusters", {"workers": 0, "name": "busy"}))
            except OSError as error:  # the server went away mid-request, as it should
                answers.append((0, str(error)))

        request = threading.Thread(target=post, daemon=True)
        request.start()
        begun.wait()
        supervisor = family(_entry(server.runtime_dir, "busy")["supervisor_pid"])
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
        stopped = time.monotonic() - started
        assert stopped < 5, f"the server took {stopped:.1f} s to stop"
        # The busy supervisor follows its owner: owner poll (0.5 s) + at most 2 s.
        _took, alive = wait_gone(supervisor, timeout=5)
        assert not alive, f"supervisor outlived the server: {alive}"
        request.join(10)
        assert answers and answers[0][0] != 201
        assert _leftovers(server.runtime_dir) == []
