"""Size limits of local clusters: the rule itself, then every front end refusing before spawning.

The rule's tests describe machines with `Machine(...)` (a parameter, not the test host). The
front-end tests run on this machine and ask for sizes far above any machine's limits, so they
hold on any CI host; they check that nothing was started, not just the message.
"""

from __future__ import annotations

import json

import dask
import psutil
import pytest
from IPython.core.error import UsageError

import nbcluster
from nbcluster.cluster import limits
from nbcluster.cluster.launcher import is_supervisor
from nbcluster.cluster.limits import Machine
from nbcluster.cluster.spec import ClusterSpec
from nbcluster.errors import LimitExceeded

pytest_plugins = ["pytest_jupyter.jupyter_server"]

LAPTOP = Machine(cores=2, memory=8 * 2**30)
HUGE = 10**9  # the issue's {"workers": 1000000000}


def _message(**kwargs) -> str:
    with pytest.raises(LimitExceeded) as refused:
        limits.check("--workers N", machine=LAPTOP, **kwargs)
    return str(refused.value)


def test_machine_defaults_are_4_per_core_and_the_ram() -> None:
    limits.check("ok", 8, 1, machine=LAPTOP)
    limits.check("ok", 2, 4, 4 * 2**30, machine=LAPTOP)
    assert "9 worker processes" in _message(workers=9) and "limit of 8 (4 x 2 cores)" in _message(workers=9)
    assert "9 threads (3 workers x 3)" in _message(workers=3, threads=3)
    memory = _message(workers=3, memory=3 * 2**30)
    assert "9.00 GiB of worker memory (3 x 3.00 GiB)" in memory and "(its RAM)" in memory
    # GPU workers are processes too.
    assert "9 worker processes" in _message(workers=7, gpu_workers=2)


def test_the_message_is_one_line_naming_the_key_and_the_ways_up() -> None:
    message = _message(workers=HUGE)
    assert "\n" not in message
    assert "nbcluster.limits.max-workers" in message and "--force" in message


def test_force_lifts_machine_limits_up_to_a_ceiling() -> None:
    limits.check("x", 100, 1, 2**40, force=True, machine=LAPTOP)  # 100 workers, 1 TiB each
    with pytest.raises(LimitExceeded, match=r"above 128 \(64 x 2 cores\), the most --force allows"):
        limits.check("x", HUGE, force=True, machine=LAPTOP)


def test_config_caps_hold_even_against_force() -> None:
    with dask.config.set({"nbcluster.limits.max-workers": 3, "nbcluster.limits.max-memory": "2GiB"}):
        limits.check("x", 3, machine=LAPTOP)
        with pytest.raises(LimitExceeded, match=r"set in Dask config \(nbcluster.limits.max-workers\); --force does not"):
            limits.check("x", 4, force=True, machine=LAPTOP)
        with pytest.raises(LimitExceeded, match=r"nbcluster\.limits\.max-memory"):
            limits.check("x", 2, memory=2**30 + 1, force=True, machine=LAPTOP)
    # A config value may also raise a limit past the machine's (an admin's decision).
    with dask.config.set({"nbcluster.limits.max-workers": 500, "nbcluster.limits.max-threads": 500}):
        limits.check("x", 500, machine=LAPTOP)


def test_default_workers_come_from_config_and_are_checked() -> None:
    assert ClusterSpec().resolved(cpu_count=3).workers == 3
    with dask.config.set({"nbcluster.defaults.workers": 5}):
        assert ClusterSpec().resolved(cpu_count=3).workers == 5
        with pytest.raises(LimitExceeded, match=r"--workers 5 \(the default\) means 5"):
            ClusterSpec().check_limits(machine=Machine(cores=1, memory=2**33))


def _supervisors() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if is_supervisor(_cmd(p))]


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def test_python_start_refuses_before_spawning(runtime_dir) -> None:
    before = {p.pid for p in _supervisors()}
    with pytest.raises(LimitExceeded, match="--workers 1000000000 means"):
        nbcluster.start(workers=HUGE)
    with pytest.raises(LimitExceeded, match=r"nbcluster\.limits\.max-threads"):
        nbcluster.start(workers=1, threads=HUGE)
    with pytest.raises(LimitExceeded, match=r"nbcluster\.limits\.max-memory"):
        nbcluster.start(workers=2, memory="1000TiB")
    assert {p.pid for p in _supervisors()} <= before  # no new supervisor was launched
    assert nbcluster.clusters() == [] and list(runtime_dir.iterdir()) == []


def test_scale_and_adapt_refuse_in_the_client_and_in_the_supervisor(runtime_dir) -> None:
    handle = nbcluster.start(workers=0, memory="1GiB", name="small")
    with pytest.raises(LimitExceeded, match="scale 1000000000 means"):
        handle.scale(HUGE)
    with pytest.raises(LimitExceeded, match="adapt --max 1000000000 means"):
        handle.adapt(0, HUGE)
    # A direct scheduler RPC, bypassing the client's check, is refused by the supervisor.
    with pytest.raises(LimitExceeded, match="scale 1000000000 means"):
        handle.rpc("nbcluster_scale", n=HUGE, kind="cpu")
    with pytest.raises(LimitExceeded, match="adapt --max 1000000000"):
        handle.rpc("nbcluster_adapt", minimum=0, maximum=HUGE)
    # The cluster's own --memory counts: 1 GiB x (RAM in GiB + 1) workers is above the RAM.
    too_many = psutil.virtual_memory().total // 2**30 + 1
    lifted = {"nbcluster.limits.max-workers": 10**6, "nbcluster.limits.max-threads": 10**6}
    with dask.config.set(lifted), pytest.raises(LimitExceeded, match="of worker memory"):
        handle.scale(too_many)
    info = handle.info()
    assert info["requested"] == {"cpu": 0, "gpu": 0} and info["adaptive"] is None
    # force lifts the machine's limit: adapt up to a forced maximum (no load, so no workers).
    cap = limits.limit("max-workers", Machine.here()).value
    handle.adapt(0, cap + 1, force=True)
    assert handle.info()["adaptive"] == {"minimum": 0, "maximum": cap + 1}


def test_force_starts_past_the_machine_memory_limit(runtime_dir) -> None:
    # Two workers of 3/4 of the RAM each: 1.5 x the RAM in all, refused unless forced.
    each = psutil.virtual_memory().total * 3 // 4
    with pytest.raises(LimitExceeded, match="its RAM"):
        nbcluster.start(workers=2, memory=each, name="forced")
    handle = nbcluster.start(workers=2, memory=each, force=True, name="forced")
    assert [w["memory_limit"] for w in handle.info().workers] == [each, each]


def test_magic_refuses_with_one_usage_error(runtime_dir) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbcluster")
    with pytest.raises(UsageError, match="--workers 5000 means 5000 worker processes") as refused:
        shell.run_line_magic("cluster", "start --workers 5000")
    assert "\n" not in str(refused.value)
    assert nbcluster.clusters() == []


def test_cli_refuses_and_config_caps_hold_against_force(runtime_dir, cli) -> None:
    result = cli("start", "--workers", "5000")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "nbcluster.limits.max-workers" in result.stderr
    capped = cli("start", "--workers", "2", "--force", env={"DASK_NBCLUSTER__LIMITS__MAX_WORKERS": "1"})
    assert capped.returncode == 2 and "--force does not lift a limit set in config" in capped.stderr
    assert "Traceback" not in result.stderr + capped.stderr
    assert nbcluster.clusters() == [] and list(runtime_dir.iterdir()) == []


@pytest.fixture
def jp_server_config(runtime_dir):
    return {"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}}


async def test_rest_refuses_with_400_and_force_is_a_boolean(jp_fetch, runtime_dir) -> None:
    from tornado.httpclient import HTTPClientError

    async def post(path: str, body: dict) -> tuple[int, dict]:
        try:
            response = await jp_fetch("nbcluster", path, method="POST", body=json.dumps(body))
        except HTTPClientError as error:
            response = error.response
        return response.code, json.loads(response.body)

    status, reply = await post("api/clusters", {"workers": HUGE})
    assert status == 400 and "--workers 1000000000 means" in reply["message"]
    status, reply = await post("api/clusters", {"workers": 1, "force": "yes"})
    assert status == 400 and "force must be true or false" in reply["message"]
    status, reply = await post("api/clusters", {"workers": HUGE, "force": True})
    assert status == 400 and "the most --force allows" in reply["message"]
    status, _cluster = await post("api/clusters", {"workers": 0, "name": "rest"})
    assert status == 201
    status, reply = await post("api/clusters/rest/scale", {"workers": HUGE})
    assert status == 400 and "scale 1000000000 means" in reply["message"]
    status, reply = await post("api/clusters/rest/adapt", {"minimum": 0, "maximum": HUGE, "force": True})
    assert status == 400 and "adapt --max 1000000000" in reply["message"]
    assert [c.name for c in nbcluster.clusters()] == ["rest"]
