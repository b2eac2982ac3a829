"""nbcluster's settings survive the ways users set Dask config."""

from __future__ import annotations

import subprocess
import sys

import dask.config
import psutil
import pytest

import nbcluster
from nbcluster.errors import BadArgument

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
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["10.0", "2", "local"]


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
