"""nbcluster's settings survive the ways users set Dask config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
import yaml

import nbcluster
import nbcluster.config
from nbcluster import config_schema
from nbcluster.errors import BadArgument, SettingWarning
from tests.os_helpers import fresh_python

SCRIPT = """
import dask.config
with dask.config.set({"nbcluster.profiles.x": {"backend": "local", "options": {}}}):
    import nbcluster.config
from nbcluster.cluster import profiles
print(nbcluster.config.seconds("timeouts.connect"), nbcluster.config.get("distribute.in-flight"), profiles.get("local").backend)
"""


def test_a_config_block_entered_before_the_import_keeps_the_defaults() -> None:
    # Leaving the block restores the config it saw on entering, which had no nbcluster
    # section: a script that sets a profile first must still find every default.
    assert fresh_python(SCRIPT).split() == ["10.0", "2", "local"]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("timeouts.start", "soon", "nbcluster.timeouts.start is 'soon' in Dask config: set it to a duration"),
        ("defaults.workers", "many", "nbcluster.defaults.workers is 'many' in Dask config: set it to a whole number"),
        ("limits.max-workers", -3, "nbcluster.limits.max-workers is -3 in Dask config: set it to a whole number (at least 1)"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_key(runtime_dir, key, value, expected) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with dask.config.set({f"nbcluster.{key}": value}), pytest.raises(BadArgument) as raised:
        nbcluster.start(workers=None if key == "defaults.workers" else 1)
    assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)
    assert nbcluster.clusters() == []
    # Refused before a supervisor was taken: nothing new runs.
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


# -- the schema: unknown keys warn once, naming the nearest setting ---------------------------

TYPO = "nbcluster: unknown setting 'nbcluster.widgets.delay' (did you mean 'nbcluster.widget.delay'?); it is ignored"
# A fresh process that reads a setting three times, with every warning shown (`-W always`).
READ_THRICE = "import nbcluster.config as c\nfor _ in range(3):\n    c.get('widget.delay')\nprint(c.get('widget.delay'))"


def fresh_process(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    clean["DASK_CONFIG"] = str(tmp_path / "dask")  # no ~/.config/dask of this machine's
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", READ_THRICE],
        capture_output=True, text=True, timeout=120, env={**clean, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "750ms"  # the typo changed nothing
    return done


def test_a_typo_in_a_users_yaml_file_warns_once_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "dask").mkdir()
    (tmp_path / "dask" / "nbcluster.yaml").write_text("nbcluster:\n  widgets:\n    delay: 2s\n")
    done = fresh_process(tmp_path, {})
    assert done.stderr.count(TYPO) == 1, done.stderr


def test_a_typo_in_an_environment_variable_warns_once(tmp_path: Path) -> None:
    done = fresh_process(tmp_path, {"DASK_NBCLUSTER__WIDGETS__DELAY": "2s"})
    assert done.stderr.count(TYPO) == 1, done.stderr


def test_the_shipped_settings_warn_of_nothing(tmp_path: Path) -> None:
    # Environment variables spell `max-tasks` as MAX_TASKS: the same setting, no warning.
    done = fresh_process(tmp_path, {"DASK_NBCLUSTER__WIDGET__MAX_TASKS": "10"})
    assert "SettingWarning" not in done.stderr, done.stderr


def test_a_typo_in_dask_config_set_warns_once_at_the_next_read() -> None:
    typo = {"nbcluster.sidebar.intervall": "1s", "nbcluster.profiles.mine": {"backend": "local"}}
    with dask.config.set(typo), pytest.warns(SettingWarning) as caught:
        for _ in range(3):
            nbcluster.config.seconds("sidebar.interval")
    # A profile is the user's own name, not a typo: only the misspelt key is named.
    assert [str(w.message) for w in caught] == [
        "nbcluster: unknown setting 'nbcluster.sidebar.intervall' (did you mean "
        "'nbcluster.sidebar.interval'?); it is ignored"
    ]


@pytest.mark.parametrize(
    ("key", "value", "read", "expected"),
    [
        ("widget.max-tasks", "lots", nbcluster.config.view_limits, "set it to a whole number"),
        ("sidebar.reconnect", [1], nbcluster.config.sidebar_settings, "set it to a duration such as 2s"),
        ("limits.dashboard", "maybe", lambda: nbcluster.config.get("limits.dashboard"), "set it to true or false"),
    ],
)
def test_a_value_of_the_wrong_kind_is_one_line(key: str, value: Any, read: Any, expected: str) -> None:
    with dask.config.set({f"nbcluster.{key}": value}), pytest.raises(BadArgument) as raised:
        read()
    message = str(raised.value)
    assert message.startswith(f"nbcluster.{key} is {value!r} in Dask config: {expected}") and "\n" not in message


def test_every_setting_in_nbcluster_yaml_has_a_description_and_a_kind() -> None:
    shipped = yaml.safe_load(config_schema.DEFAULTS.read_text())["nbcluster"]

    def keys(section: dict[str, Any], below: str = "") -> list[str]:
        found = []
        for name, value in section.items():
            found.append(f"{below}{name}")
            if isinstance(value, dict) and config_schema.settings()[f"{below}{name}"].kind == "section":
                found += keys(value, f"{below}{name}.")
        return found

    every = keys(shipped)
    assert sorted(every) == sorted(config_schema.settings())
    undescribed = [k for k in every if len(config_schema.settings()[k].description) < 20]
    assert not undescribed, f"settings of nbcluster.yaml with no comment above them: {undescribed}"
    assert {s.kind for s in config_schema.settings().values()} <= {"section", *config_schema.KINDS}
    # The kinds the readers rely on, one of each.
    assert config_schema.settings()["widget.delay"].kind == "duration"
    assert config_schema.settings()["limits.max-memory"].kind == "size"
    assert config_schema.settings()["profiles"].kind == "mapping"


def test_libyaml_reads_dasks_files_as_pyyaml_does() -> None:
    # `config.libyaml` has a supervisor (and a forkserver while it loads) read Dask's config
    # files with libyaml's loader: the same values as PyYAML's own, for Dask's shipped
    # defaults, nbcluster's, and every config file this machine's Dask reads.
    import importlib.util

    packages = ("dask", "distributed", "nbcluster", "dask_jobqueue", "dask_gateway", "dask_kubernetes")
    files = [
        path
        for name in packages
        if (spec := importlib.util.find_spec(name)) is not None and spec.submodule_search_locations
        for path in Path(next(iter(spec.submodule_search_locations))).glob("*.yaml")
    ]
    for folder in map(Path, dask.config.paths):
        if folder.is_dir():
            files += sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml"))
    assert len(files) >= 3
    assert nbcluster.config.SAFE_LOADER is yaml.CSafeLoader  # PyYAML here has libyaml
    for path in files:
        text = path.read_text()
        with nbcluster.config.libyaml():
            assert yaml.safe_load.__module__ == "nbcluster.config"
            fast = yaml.safe_load(text)
        assert fast == yaml.load(text, Loader=yaml.SafeLoader), path
    assert yaml.safe_load.__module__ == "yaml"  # restored on leaving
