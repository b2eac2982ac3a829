"""nbcluster on a real Grid Engine: an `sge` profile, with qstat as the witness.

The session's SGE (Debian's `gridengine-master` and `gridengine-exec`, a cell of its own:
`sge_service.py`) runs the workers as batch jobs on this machine; the supervisor hosts
dask-jobqueue's `SGECluster`. Checked with SGE's own commands: the jobs a start submits, a
cell's items all back, a third job after `scale 3`, and an empty queue after `stop`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dask.config
import pytest

import nbcluster
from tests import sge_service
from tests.jobqueue_helpers import jobqueue_options
from tests.sge_service import QUEUE, SgeService
from tests.waiting import until

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not sge_service.available(), reason="needs root and Debian's gridengine packages (.ci/run)"),
]


@pytest.fixture(scope="module")
def sge() -> Iterator[SgeService]:
    with sge_service.running() as service:
        yield service


def grid_profile(jobs_dir: Path) -> dict:
    return {
        "backend": "sge",
        "description": "The test machine's Grid Engine",
        "options": jobqueue_options(QUEUE, jobs_dir),
    }


def test_an_sge_cluster_starts_runs_a_cell_scales_and_stops(sge: SgeService, tmp_path: Path, runtime_dir: Path) -> None:
    with dask.config.set({"nbcluster.profiles.grid": grid_profile(tmp_path / "jobs")}):
        handle = nbcluster.start(profile="grid", workers=2, runtime_dir=runtime_dir)
        try:
            assert len(sge.jobs()) == 2, sge.jobs()
            handle.client.wait_for_workers(2, timeout=90)
            status = repr(handle.info())
            assert "sge" in status
            for job in sge.jobs():
                assert f"job {job['id']}" in status, status

            runs = nbcluster.distribute(lambda x: x * x, over=range(50), on=handle)
            assert sorted(runs.values()) == [x * x for x in range(50)]

            handle.scale(3)
            assert until(lambda: len(sge.jobs()) == 3, 30), sge.jobs()
        finally:
            handle.stop()
        assert until(lambda: sge.jobs() == [], 30), sge.jobs()
