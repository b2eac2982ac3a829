"""Site limits a user cannot raise: `nbcluster.limits.*` and `nbcluster.defaults.*` in the
site config (`/etc/dask`, `$DASK_ROOT_CONFIG`) are ceilings, checked by every front end and
by the supervisor itself.

The site folder here is a `DASK_ROOT_CONFIG` folder of the test's own (writing `/etc/dask`
would change every other test on the machine); `config.site` reads it exactly as it reads
`/etc/dask`. The user's side is every way a user sets Dask config: their own
`~/.config/dask` file (a `HOME` of the test's), a `DASK_CONFIG` folder, `dask.config.set`,
a REST body and `--force`. The real-users version, behind a JupyterHub, is in test_hub.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest

import nbcluster
from nbcluster.cluster import launcher, limits
from nbcluster.cluster.limits import Machine
from nbcluster.cluster.spec import ClusterSpec
from nbcluster.errors import ClusterFailed, LimitExceeded

pytest_plugins = ["pytest_jupyter.jupyter_server"]

BIG = Machine(cores=64, memory=2**40)


def write_yaml(folder: Path, settings: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nbcluster.yaml"
    path.write_text(json.dumps({"nbcluster": settings}))  # JSON is YAML
    return path


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The site file: max-workers 2, defaults.workers 1, no dashboard."""
    path = write_yaml(
        tmp_path / "site", {"limits": {"max-workers": 2, "max-memory": "1GiB", "dashboard": False}, "defaults": {"workers": 1}}
    )
    monkeypatch.setenv("DASK_ROOT_CONFIG", str(path.parent))
    yield path


def refused(**kwargs) -> str:
    with pytest.raises(LimitExceeded) as error:
        limits.check("--workers N", machine=BIG, **kwargs)
    return str(error.value)


def test_a_site_cap_holds_against_the_users_config_and_force(site: Path) -> None:
    limits.check("ok", 2, machine=BIG)
    message = refused(workers=3)
    assert f"set in {site} (nbcluster.limits.max-workers)" in message and "\n" not in message
    # The user's own config, however it is set, and --force: still 2.
    with dask.config.set({"nbcluster.limits.max-workers": 100, "nbcluster.limits.max-memory": "1TiB"}):
        assert str(site) in refused(workers=3)
        assert str(site) in refused(workers=3, force=True)
        assert "nbcluster.limits.max-memory" in refused(workers=2, memory=2**30, force=True)
    # ...but it may lower it, and then the message names the user's own setting.
    with dask.config.set({"nbcluster.limits.max-workers": 1}):
        message = refused(workers=2)
        assert "set in Dask config (nbcluster.limits.max-workers)" in message and str(site) not in message


def test_site_limits_are_the_strictest_of_etc_dask_and_dask_root_config(tmp_path: Path, monkeypatch) -> None:
    # Setting DASK_ROOT_CONFIG adds a folder; it cannot hide /etc/dask's caps.
    strict = write_yaml(tmp_path / "etc-dask", {"limits": {"max-workers": 2}})
    monkeypatch.setattr("nbcluster.config.SITE_FOLDER", str(strict.parent))
    write_yaml(tmp_path / "mine", {"limits": {"max-workers": 50}})
    monkeypatch.setenv("DASK_ROOT_CONFIG", str(tmp_path / "mine"))
    assert str(strict) in refused(workers=3)


def test_site_defaults_are_ceilings_and_defaults_fit_the_caps(site: Path, tmp_path: Path) -> None:
    assert ClusterSpec().resolved(cpu_count=8).workers == 1
    with dask.config.set({"nbcluster.defaults.workers": 6}):
        assert ClusterSpec().resolved(cpu_count=8).workers == 1
    with dask.config.set({"nbcluster.defaults.workers": 0}):
        assert ClusterSpec().resolved(cpu_count=8).workers == 0  # lower is fine
    # No default anywhere: one per core, but no more than the cap, so a plain start works.
    write_yaml(site.parent, {"limits": {"max-workers": 2}})
    assert ClusterSpec().resolved(cpu_count=8).workers == 2
    ClusterSpec().check_limits(machine=BIG)


def test_the_site_can_turn_the_dashboard_off(site: Path) -> None:
    for value in (True, None):
        with dask.config.set({"nbcluster.limits.dashboard": value}), pytest.raises(LimitExceeded) as error:
            ClusterSpec(dashboard=True).check_limits(machine=BIG)
        assert f"--dashboard is turned off by this machine's administrator in {site}" in str(error.value)
    ClusterSpec().check_limits(machine=BIG)  # no dashboard asked: fine


def test_a_user_may_turn_the_dashboard_off_too(monkeypatch: pytest.MonkeyPatch) -> None:
    ClusterSpec(dashboard=True).check_limits(machine=BIG)
    monkeypatch.setenv("DASK_NBCLUSTER__LIMITS__DASHBOARD", "false")
    dask.config.refresh()
    try:
        with pytest.raises(LimitExceeded, match=r"--dashboard is turned off in Dask config"):
            ClusterSpec(dashboard=True).check_limits(machine=BIG)
    finally:
        monkeypatch.delenv("DASK_NBCLUSTER__LIMITS__DASHBOARD")
        dask.config.refresh()


def test_a_bad_site_file_is_one_line_naming_it(site: Path) -> None:
    site.write_text("nbcluster: {limits: {max-workers: lots}}")
    with pytest.raises(nbcluster.errors.BadArgument, match=rf"max-workers is 'lots' in {site}: set it to a whole number"):
        limits.check("x", 1, machine=BIG)
    site.write_text("nbcluster: [")
    with pytest.raises(nbcluster.errors.BadArgument, match=rf"the site config {site} cannot be read"):
        limits.check("x", 1, machine=BIG)


def test_the_cli_with_the_users_own_files_gets_the_site_cap(site: Path, tmp_path: Path, cli, runtime_dir) -> None:
    # The instructor test: the student's ~/.config/dask says 100, and so does a
    # DASK_CONFIG folder; `nbcluster start --workers 3` (and --force) is refused.
    home = tmp_path / "home"
    write_yaml(home / ".config" / "dask", {"limits": {"max-workers": 100, "dashboard": True}})
    own = write_yaml(tmp_path / "dask-config", {"limits": {"max-workers": 100}})
    for env in ({"HOME": str(home)}, {"HOME": str(home), "DASK_CONFIG": str(own.parent)}):
        for force in ([], ["--force"]):
            result = cli("start", "--workers", "3", *force, env={**env, "DASK_NBCLUSTER__LIMITS__MAX_WORKERS": "100"})
            assert result.returncode == 2, result.stderr
            assert f"set in {site} (nbcluster.limits.max-workers)" in result.stderr
            assert result.stderr.count("\n") == 1
        dashboard = cli("start", "--workers", "1", "--dashboard", env=env)
        assert dashboard.returncode == 2 and f"turned off by this machine's administrator in {site}" in dashboard.stderr
    assert nbcluster.clusters() == []


def test_the_supervisor_applies_the_site_cap_to_requests_that_skip_the_client(site: Path, runtime_dir) -> None:
    # A request made without the client's check, with the requester's config saying 100,
    # as a modified kernel would send it: the supervisor reads the site file itself.
    with dask.config.set({"nbcluster.limits.max-workers": 100, "nbcluster.limits.dashboard": True}):
        for spec, expected in ((ClusterSpec(workers=3), "nbcluster.limits.max-workers"),
                               (ClusterSpec(workers=1, dashboard=True), "nbcluster.limits.dashboard")):  # fmt: skip
            with pytest.raises(ClusterFailed) as error:
                launcher.spawn(spec, runtime_dir, None, force=True)
            assert str(site) in str(error.value) and expected in str(error.value)
        # And scale/adapt sent straight to the scheduler, past the client's check.
        handle = nbcluster.start(workers=1, name="capped")
        for rpc, args in (("nbcluster_scale", {"n": 3, "kind": "cpu", "force": True}),
                          ("nbcluster_adapt", {"minimum": 0, "maximum": 3, "force": True})):  # fmt: skip
            with pytest.raises(LimitExceeded, match=str(site)):
                handle.rpc(rpc, **args)
        assert handle.info()["requested"]["cpu"] == 1
    assert [h.name for h in nbcluster.clusters()] == ["capped"]


@pytest.fixture
def jp_server_config(site: Path, runtime_dir: Path) -> dict:
    return {"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}}


async def test_a_rest_body_cannot_raise_the_site_cap(jp_fetch, site: Path) -> None:
    from tornado.httpclient import HTTPClientError

    for body in ({"workers": 3}, {"workers": 3, "force": True}, {"workers": 1, "dashboard": True}):
        with pytest.raises(HTTPClientError) as error:
            await jp_fetch("nbcluster", "api", "clusters", method="POST", body=json.dumps(body))
        assert error.value.code == 400
        assert str(site) in json.loads(error.value.response.body)["message"]
    assert nbcluster.clusters() == []
