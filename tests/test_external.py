"""`%cluster use ADDRESS --security CA,CERT,KEY`: a TLS scheduler someone else runs.

The "someone else" is a real `dask scheduler` and `dask worker` started here from the
command line with their own credentials, as an administrator would. nbcluster attaches with
the files it is given, shows the cluster as external, refuses to scale or stop it, and gets
its metrics from nbcluster's plugin when the scheduler accepts it, or the basic view when it
does not.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dask.config
import pytest

import nbcluster
from nbcluster import commands
from nbcluster._wire import ClusterState, ExternalEntry, Snapshot, problems
from nbcluster.cluster import credentials
from nbcluster.errors import BadArgument, ClusterUnreachable
from tests.os_helpers import silent_port, stop_all
from tests.waiting import until, waited_for


def _credentials(folder: Path, name: str) -> tuple[str, str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    _, tls = credentials.write_credentials(folder, name)
    return tls["ca_file"], tls["cert"], tls["key"]


def _tls_args(files: tuple[str, str, str]) -> list[str]:
    ca, cert, key = files
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


@pytest.fixture(params=["plugins allowed", "plugins blocked", "no nbcluster"])
def someone_elses_scheduler(request, tmp_path: Path) -> Iterator[tuple[str, tuple[str, str, str], bool]]:
    """A TLS scheduler with one worker, started from the command line, always stopped.

    Two ways to refuse nbcluster's plugin: an administrator's blocked handler (nbcluster is
    importable there, so `%%distribute` runs), or a scheduler without nbcluster at all.
    """
    files = _credentials(tmp_path / "admin", "theirs")
    allowed = request.param == "plugins allowed"
    env = dict(os.environ)
    info = tmp_path / "scheduler.json"
    preload: list[str] = []
    if request.param == "plugins blocked":
        env["DASK_DISTRIBUTED__SCHEDULER__BLOCKED_HANDLERS"] = '["register_scheduler_plugin"]'
    if request.param == "no nbcluster":
        # A scheduler whose Python has no nbcluster cannot unpickle nbcluster's plugin.
        without = tmp_path / "without_nbcluster.py"
        without.write_text("import sys\nsys.modules['nbcluster'] = None\n")
        preload = ["--preload", str(without)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--protocol", "tls", "--no-dashboard", "--scheduler-file", str(info), *preload, *_tls_args(files)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    try:
        # The scheduler says nothing when ready but its file.
        until(lambda: procs[0].poll() is not None or (info.exists() and info.read_text().strip()), 30, 0.05)
        assert procs[0].poll() is None and info.exists() and info.read_text().strip(), "the scheduler did not start"
        address = json.loads(info.read_text())["address"]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", "127.0.0.1",
                 "--nthreads", "1", "--no-nanny", "--no-dashboard", *_tls_args(files)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        yield address, files, allowed
    finally:
        stop_all(procs)


def _sampled(handle, timeout: float = 30) -> dict:
    """The first snapshot with a resource sample of every worker (a plugin registered a
    moment ago has not copied a heartbeat yet; the scheduler's own view has them at once)."""
    def sampled() -> dict | None:
        snapshot = handle.metrics()
        full = snapshot["workers"] and {r["worker"] for r in snapshot["resources"]} == set(snapshot["workers"])
        return snapshot if full else None

    # Samples arrive with heartbeats, which announce nothing to a client.
    return waited_for(sampled, "worker samples", timeout)


def test_use_with_security_attaches_as_external(runtime_dir, someone_elses_scheduler):
    address, files, allowed = someone_elses_scheduler
    runner = commands.Runner(in_kernel=True)
    shown = runner.run(commands.parse(f"use {address} --security {','.join(files)}"))
    assert "It is external" in shown.note
    handle = nbcluster.current()
    assert handle is not None and not handle.managed
    handle.client.wait_for_workers(1, timeout=30)
    status = repr(handle.info())
    assert "external: started elsewhere" in status and "127.0.0.1" in status
    # The shapes nbcluster_info and the registry have, from the scheduler's own identity.
    assert problems(handle.entry, ExternalEntry) == []
    assert problems(handle.info().to_dict(), ClusterState) == []
    # In no registry, yet listed in this kernel: it is where its work runs.
    listing = runner.run(commands.parse("list"))
    assert f"*{address}  external  {address}  1 (1 core)  started elsewhere" in repr(listing)

    assert handle.client.submit(sum, [1, 2]).result(timeout=30) == 3
    snapshot = handle.metrics()
    assert len(snapshot["workers"]) == 1
    # The plugin records tasks; the basic view (the scheduler's own identity) has none.
    assert bool(snapshot["tasks"]) == allowed == handle.entry["metrics"]
    assert snapshot.get("basic", False) == (not allowed)
    # CPU and memory either way; passing the cursor back never repeats a sample.
    sampled = _sampled(handle)
    assert problems(sampled, Snapshot) == []  # the plugin's, or the basic view
    later = handle.metrics(sampled["cursor"])
    assert not {r["time"] for r in sampled["resources"]} & {r["time"] for r in later["resources"]}

    for line in ("scale 3", "adapt --min 1 --max 2", "stop"):
        with pytest.raises(BadArgument, match=f"unavailable for {address}: it is an external cluster"):
            runner.run(commands.parse(line))


@pytest.mark.parametrize("someone_elses_scheduler", ["plugins allowed"], indirect=True)
def test_wrong_credentials_are_one_line_within_the_connect_timeout(runtime_dir, someone_elses_scheduler, tmp_path):
    address, _, _ = someone_elses_scheduler
    strangers = _credentials(tmp_path / "strangers", "other")
    started = time.monotonic()
    with dask.config.set({"nbcluster.timeouts.connect": "3s"}), pytest.raises(ClusterUnreachable) as error:
        nbcluster.use(address, security=strangers)
    assert time.monotonic() - started < 3 + 2
    assert "Check the --security files" in str(error.value) and "\n" not in str(error.value)


def test_a_silent_address_gives_up_at_the_connect_timeout(runtime_dir, tmp_path):
    files = _credentials(tmp_path / "mine", "mine")
    with silent_port() as port:  # accepts connections (the kernel does) but never speaks
        address = f"tls://127.0.0.1:{port}"
        started = time.monotonic()
        with dask.config.set({"nbcluster.timeouts.connect": "2s"}), pytest.raises(ClusterUnreachable) as error:
            nbcluster.use(address, security=files)
        assert time.monotonic() - started < 2 + 2
    assert f"no scheduler answers at {address} within 2 s" in str(error.value)


@pytest.mark.parametrize(
    ("security", "message"),
    [
        ("ca.pem,cert.pem", "--security takes three files, CA,CERT,KEY"),
        ("nosuch-ca.pem,nosuch-cert.pem,nosuch-key.pem", "cannot read nosuch-ca.pem"),
    ],
)
def test_bad_security_files_are_one_line(runtime_dir, security, message):
    with pytest.raises(BadArgument, match=message):
        commands.Runner(in_kernel=True).run(commands.parse(f"use tls://127.0.0.1:9 --security {security}"))


@pytest.mark.parametrize("someone_elses_scheduler", ["no nbcluster"], indirect=True)
def test_distribute_and_persist_on_a_scheduler_without_nbcluster_whose_workers_have_it(
    runtime_dir, someone_elses_scheduler
):
    from tests.kernel_session import kernel

    address, files, _ = someone_elses_scheduler
    with kernel() as k:
        k.run(f"%load_ext nbcluster\n%cluster use {address} --security {','.join(files)}").ok()
        k.run("import nbcluster; nbcluster.current().client.wait_for_workers(1, timeout=30)").ok()
        # A plain batch loads only on the worker (run/transport.py, `task`), which has nbcluster here.
        k.run('%%distribute --over "x in range(40)" --into plain\nx * x').ok()
        assert k.value("plain.values()[-1]") == 39 * 39
        # So does a --persist item, and a chained one: their Dask dependencies are arguments the
        # scheduler sees, but what it unpickles is Dask's and the standard library's only; the
        # reports come as Dask events, which need nothing of nbcluster there.
        reply = k.run('%%distribute --over "x in range(8)" --persist --into res\nx * x')
        assert reply.error is None and "Traceback" not in reply.text, reply.text
        assert k.value("res.gather()") == [x * x for x in range(8)]
        k.run('%%distribute --over "v in res" --into halves\nv / 2').ok()
        assert k.value("list(halves)") == [x * x / 2 for x in range(8)]
        k.run("res.release()").ok()


def _graphs_fall_back(view: str, allowed: bool) -> None:
    """The frozen picture: no task stream and the line saying why exactly where the plugin
    was refused, and the worker's CPU and memory charts either way."""
    from nbcluster.widgets._theme import TEXT

    assert (html.escape(TEXT["noPlugin"]) in view) == (not allowed)
    assert view.count('class="nbc-resource-worker"') == 1
    assert re.search(r"CPU \d+%", view) and re.search(r"Mem \d", view) and "<polyline" in view


@pytest.mark.parametrize("someone_elses_scheduler", ["plugins allowed", "plugins blocked"], indirect=True)
def test_a_distribute_runs_widget_falls_back_to_the_schedulers_own_view(runtime_dir, someone_elses_scheduler):
    from nbcluster.run.api import distribute
    from nbcluster.widgets import progress_hook
    from tests.widget_helpers import Recorder, square

    address, files, allowed = someone_elses_scheduler
    handle = nbcluster.use(address, security=files)
    assert handle.entry["metrics"] == allowed
    handle.client.wait_for_workers(1, timeout=30)
    # The plugin copies heartbeat samples every metrics.sample-interval; a run this short can
    # end before the first, so wait for one (the scheduler's own view has one at once).
    waited_for(lambda: handle.metrics().get("resources"), "worker sample at the scheduler", 30)
    rec = Recorder()
    hook = progress_hook(delay=0, interval=0.1, _display=rec, _widgets=True)
    results = distribute(square, over=range(4), batch=1, on=handle.client, progress=hook)
    hook.live.close()
    assert results.values() == [0, 1, 4, 9]
    run = rec.updates[-1]["text/html"]
    assert "4 / 4 done" in run and run.count('class="nbc-task"') == (4 if allowed else 0)
    _graphs_fall_back(run, allowed)


def test_cluster_status_graphs_fall_back_to_the_schedulers_own_view(runtime_dir, someone_elses_scheduler):
    from nbcluster.widgets import status
    from tests.widget_helpers import Recorder

    address, files, allowed = someone_elses_scheduler
    handle = nbcluster.use(address, security=files)
    handle.client.wait_for_workers(1, timeout=30)
    rec = Recorder()
    shown = status(handle, live_for=1.0, interval=0.1, _display=rec, _widgets=True)
    assert shown.ended.wait(30)  # the poller has ended, its frozen picture drawn
    assert shown.frozen and len(rec.shown) == 1
    # The live widget got the same view: the worker's samples, and whether it is basic.
    assert shown.widget.delta["basic"] == (not allowed)
    _graphs_fall_back(rec.updates[-1]["text/html"], allowed)
