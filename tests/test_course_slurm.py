"""The course past the laptop: an instructor's `course` profile on the suite's real SLURM runs
01's and 08's scaling sweeps with more workers than the laptop cap.

The profile (`nbcluster.profiles.course`, with ``workers: 6``) is a DASK_CONFIG file, as a hub's
site config or a student's ``~/.config/dask`` would hold it. A real kernel runs the notebooks'
own cells tagged ``sweep`` (their set-up, `%cluster start $START`, the sweep, `%cluster stop`),
unchanged, with ``NBCLUSTER_SMALL=1``; squeue is the witness that the workers are SLURM jobs.
The sweep's lines are printed (``pytest -s``): notebooks/README.md records one such run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import yaml

import nbcluster
from nbcluster import teaching
from tests.kernel_session import kernel
from tests.slurm_service import SlurmService, slurm_options

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).parent.parent
COURSE_WORKERS = 6  # above the laptop cap


@pytest.fixture
def course(slurm: SlurmService, tmp_path: Path, runtime_dir: Path) -> Iterator[dict[str, str]]:
    """A kernel's environment with the course profile; afterwards no job of the test is left."""
    folder = tmp_path / "dask"
    folder.mkdir()
    profile = {
        "backend": "slurm",
        "description": "the course partition (the test machine's SLURM)",
        "workers": COURSE_WORKERS,
        "options": slurm_options(tmp_path / "jobs", walltime="00:15:00"),
    }
    (folder / "course.yaml").write_text(
        yaml.safe_dump({"nbcluster": {"profiles": {teaching.COURSE: profile}}})
    )
    yield {
        "DASK_CONFIG": str(folder),
        "NBCLUSTER_RUNTIME_DIR": str(runtime_dir),
        "NBCLUSTER_SMALL": "1",
        **slurm.env,
    }
    for handle in nbcluster.clusters(runtime_dir=runtime_dir):
        handle.stop()
    slurm.wait_jobs(lambda jobs: not jobs, timeout=60)


def sweep_cells(name: str) -> list[str]:
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code" and "sweep" in c.metadata.get("tags", [])]


@pytest.mark.parametrize(("name", "curve"), [("01-parallel-basics", "swept"), ("08-scaling-laws", "strong")])
def test_a_course_profile_runs_the_sweep_on_slurm_past_the_laptop_cap(
    slurm: SlurmService, course: dict[str, str], name: str, curve: str
) -> None:
    cells = sweep_cells(name)
    assert cells[-1].strip() == "%cluster stop", "the sweep's cells end by stopping the cluster"
    with kernel(course, cwd=str(ROOT / "notebooks")) as k:
        shown = []
        for source in cells[:-1]:
            shown.append(k.run(source, timeout=600).ok().text)
        assert k.value("WORKERS") == COURSE_WORKERS > teaching.LAPTOP_CAP
        assert k.value("P") == [1, 2, 4, COURSE_WORKERS]
        assert k.value("START") == f"--profile course --workers {COURSE_WORKERS}"
        assert "slurm" in shown[1], shown[1]  # %cluster start $START: on the course profile
        assert len(slurm.jobs()) == COURSE_WORKERS, slurm.jobs()
        # Every point of the sweep was measured, on as many workers as it says.
        times = k.value(f"{{p: round(t, 3) for p, (t, _) in {curve}.items()}}")
        assert sorted(times) == [1, 2, 4, COURSE_WORKERS] and all(t > 0 for t in times.values()), times
        print(f"\n{name} on SLURM, {COURSE_WORKERS} workers:\n" + "\n".join(shown[2:]))
        k.run(cells[-1], timeout=120).ok()
    slurm.wait_jobs(lambda jobs: not jobs, timeout=60)
