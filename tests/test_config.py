"""nbcluster's settings survive the ways users set Dask config."""

from __future__ import annotations

import subprocess
import sys

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
