"""`nbcluster.worker_local`: built once per worker process, reused by its items, rebuilt by a new
worker, released by `%cluster restart`, listed by `%cluster status`; on real workers."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from nbcluster import _current
from nbcluster.persist import locals as worker_locals
from nbcluster.run.api import distribute
from nbcluster.worker import local
from tests.shell_helpers import magic

# Each item asks for the value and says which process it ran in and which object it got.
USE = """
import os, nbcluster
value = nbcluster.worker_local(NAME, lambda: {"built_by": os.getpid(), "steps": 0})
value["steps"] += 1
(os.getpid(), id(value), value["built_by"])
"""


def _builds(client: Any, name: str) -> dict[str, int]:
    return {a: b.get(name, 0) for a, b in client.run(local.builds).items()}


def test_built_once_per_worker_reused_then_rebuilt_after_restart(shell: InteractiveShell) -> None:
    magic(shell, "start --workers 2 --threads 1 --name locals")
    client = _current.client_for("locals")
    client.wait_for_workers(2)
    name = f"sim-{uuid.uuid4().hex[:6]}"
    ns = {"__name__": "__main__", "NAME": name}
    runs = distribute(USE, over="x in range(40)", namespace=ns, batch=1)
    assert runs.ok, runs.errors
    per_pid: dict[int, set[int]] = {}
    for pid, ident, built_by in runs.values():
        assert built_by == pid  # built in the process that uses it, not shipped from elsewhere
        per_pid.setdefault(pid, set()).add(ident)
    assert all(len(ids) == 1 for ids in per_pid.values()), per_pid  # one object per worker process
    builds = _builds(client, name)
    assert sum(builds.values()) == len(per_pid) and set(builds.values()) <= {0, 1}, builds

    lines = worker_locals.status_lines(client)  # what %cluster status adds under its table
    assert len(lines) == len(per_pid) and all(
        f"keeps worker_local {name} (builtins.dict" in line for line in lines
    )

    magic(shell, "restart")  # new worker processes: their own values, built afresh
    client.wait_for_workers(2)
    assert sum(_builds(client, name).values()) == 0
    again = distribute(USE, over="x in range(10)", namespace=ns, batch=1)
    assert again.ok and not {pid for pid, _, _ in again.values()} & set(per_pid)
    assert {built_by for _, _, built_by in again.values()} == {pid for pid, _, _ in again.values()}
    assert set(_builds(client, name).values()) <= {0, 1} and sum(_builds(client, name).values()) >= 1


def test_a_factory_that_raises_fails_the_item_with_its_traceback(cluster: Any) -> None:
    name = f"broken-{uuid.uuid4().hex[:6]}"
    ns = {"__name__": "__main__", "NAME": name}
    source = "import nbcluster\ndef make():\n    raise OSError('no licence for the simulator')\nnbcluster.worker_local(NAME, make)"
    runs = distribute(source, namespace=ns)
    [error] = runs.errors
    assert (error.type_name, error.message) == ("OSError", "no licence for the simulator")
    assert "Cell line 3, in make\n    raise OSError('no licence for the simulator')" in error.traceback
    assert "nbcluster" not in error.traceback.replace(
        "nbcluster.worker_local(NAME, make)", ""
    )  # no internals
    assert sum(_builds(cluster.client, name).values()) == 0  # nothing kept: the next item tries again


def test_bad_arguments_say_what_to_pass() -> None:
    with pytest.raises(TypeError, match="needs a factory to call"):
        local.worker_local(f"x-{uuid.uuid4().hex}", 3)  # type: ignore[arg-type]


def test_a_vectorised_cartpole_per_worker(cluster: Any) -> None:
    pytest.importorskip("gymnasium", reason="the `train` extra: pip install 'nbcluster[train]'")
    name = f"cartpole-{uuid.uuid4().hex[:6]}"
    source = """
import os, numpy as np, gymnasium as gym, nbcluster
envs = nbcluster.worker_local(NAME, lambda: gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"))
obs, _ = envs.reset(seed=seed)
total = np.zeros(4)
for _ in range(50):
    obs, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
    total += reward
(os.getpid(), id(envs), float(total.sum()))
"""
    ns = {"__name__": "__main__", "NAME": name}
    runs = distribute(source, over="x in range(8)", seed=1, namespace=ns, batch=1)
    assert runs.ok, runs.errors
    per_pid: dict[int, set[int]] = {}
    for pid, ident, total in runs.values():
        per_pid.setdefault(pid, set()).add(ident)
        assert 4 <= total <= 200  # rewards came from real CartPole steps (one a step per env alive)
    assert all(len(ids) == 1 for ids in per_pid.values())
    assert sum(_builds(cluster.client, name).values()) == len(per_pid)
