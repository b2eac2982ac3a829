"""Backend profiles in Dask config: listing them, choosing one, and one clear line for mistakes."""

from __future__ import annotations

import sys
import time

import dask.config
import pytest
import yaml

import nbcluster
from nbcluster import commands
from nbcluster.cluster import profiles
from nbcluster.errors import BadArgument

CAMPUS = {"backend": "gateway", "description": "The campus gateway", "options": {"address": "http://127.0.0.1:9"}}


def test_the_shipped_defaults_offer_local_only():
    assert [p.name for p in profiles.all()] == ["local"]
    assert profiles.get(None) == profiles.get("local")
    assert profiles.get("local").backend == "local"


def test_a_profile_set_in_dask_config_is_offered_and_described():
    with dask.config.set({"nbcluster.profiles.campus": CAMPUS}):
        campus = profiles.get("campus")
        assert (campus.backend, campus.description, campus.options) == ("gateway", "The campus gateway", CAMPUS["options"])
        assert [p.name for p in profiles.all()] == ["local", "campus"]
        text = commands.Runner(in_kernel=False).run(commands.parse("profiles"))
    assert "campus  gateway  The campus gateway" in text


def test_the_listing_names_a_malformed_profile_instead_of_hiding_it():
    with dask.config.set({"nbcluster.profiles.cray": {"backend": "cray"}}):
        assert [p.name for p in profiles.all()] == ["local"]  # never offered to start
        text = commands.Runner(in_kernel=False).run(commands.parse("profiles"))
    assert "Not usable: profile 'cray' (nbcluster.profiles.cray in Dask config) names an unknown backend 'cray'" in text


def test_nbcluster_profiles_reads_the_users_config_folder(cli, tmp_path):
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"nbcluster": {"profiles": {"campus": CAMPUS}}}))
    listed = cli("profiles", env={"DASK_CONFIG": str(tmp_path)})
    assert listed.returncode == 0, listed.stderr
    assert "local" in listed.stdout and "The campus gateway" in listed.stdout


@pytest.mark.parametrize(
    ("profile", "raw", "message"),
    [
        ("mainframe", None, "unknown profile 'mainframe': known profiles are local; define it under nbcluster.profiles"),
        ("cray", {"backend": "cray"}, "unknown backend 'cray': use one of local, slurm, pbs"),
        ("odd", {"backend": "slurm", "options": [1, 2]}, "options must be a mapping"),
    ],
)
def test_a_bad_profile_is_one_line_before_anything_starts(runtime_dir, profile, raw, message):
    settings = {f"nbcluster.profiles.{profile}": raw} if raw else {}
    started = time.monotonic()
    with dask.config.set(settings), pytest.raises(BadArgument) as error:
        nbcluster.start(profile=profile, workers=1)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert time.monotonic() - started < 2
    assert nbcluster.clusters() == []


def test_a_missing_optional_package_names_the_pip_command(runtime_dir, monkeypatch):
    # None in sys.modules is how Python spells "this package is not installed".
    monkeypatch.setitem(sys.modules, "dask_gateway", None)
    with dask.config.set({"nbcluster.profiles.campus": CAMPUS}), pytest.raises(BadArgument) as error:
        nbcluster.start(profile="campus")
    assert str(error.value) == "this profile needs dask_gateway: `pip install 'nbcluster[gateway]'`"


def test_the_magic_and_cli_take_profile(cli, runtime_dir):
    ns = commands.parse("start --profile hpc --workers 2")
    assert (ns.profile, ns.workers) == ("hpc", "2")
    result = cli("start", "--profile", "mainframe")
    assert result.returncode == 2 and "unknown profile 'mainframe'" in result.stderr
    assert result.stderr.count("\n") == 1


def test_gpus_are_for_local_clusters(runtime_dir):
    hpc = {"backend": "slurm", "options": {"queue": "debug", "cores": 1, "memory": "1GB"}}
    with dask.config.set({"nbcluster.profiles.hpc": hpc}), pytest.raises(BadArgument) as error:
        nbcluster.start(profile="hpc", gpu_workers=1)
    assert "--gpu-workers, --gpu-backend, --gpus-per-worker and --gpu-threads are for local clusters" in str(error.value)
