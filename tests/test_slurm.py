"""nbcluster on a real SLURM: a `slurm` profile, from a real kernel, with squeue as the witness.

The session's SLURM (munged, slurmctld, slurmd from a generated conf, `slurm_service.py`)
runs the workers as batch jobs on this machine; the supervisor hosts dask-jobqueue's
`SLURMCluster`. What a user would check is checked with SLURM's own commands: the jobs a
start submits, the third job a `scale 3` adds, an empty queue after `stop`, and every item of
a cell back exactly once when one worker's job is cancelled under it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import dask.config
import pytest
import yaml

import nbcluster
from nbcluster.cluster import credentials, deploy, profiles
from nbcluster.cluster.spec import ClusterSpec
from nbcluster.errors import ClusterFailed
from tests.kernel_session import kernel
from tests.lifecycle_helpers import JupyterServer
from tests.slurm_service import PARTITION, SlurmService, slurm_options
from tests.waiting import waited_for

pytestmark = pytest.mark.timeout(240)


def hpc_profile(jobs_dir: Path, queue: str = PARTITION) -> dict:
    return {
        "backend": "slurm",
        "description": "The test machine's SLURM, debug partition",
        "options": slurm_options(jobs_dir, queue),
    }


@pytest.fixture
def hpc(slurm: SlurmService, tmp_path: Path, runtime_dir: Path) -> Iterator[dict[str, str]]:
    """The `hpc` and `nowhere` profiles, in this process's Dask config and in a DASK_CONFIG
    folder for kernels; afterwards no job of the test is left in the queue."""
    folder = tmp_path / "dask"
    folder.mkdir()
    defined = {"hpc": hpc_profile(tmp_path / "jobs"), "nowhere": hpc_profile(tmp_path / "jobs", "nosuchpartition")}
    (folder / "profiles.yaml").write_text(yaml.safe_dump({"nbcluster": {"profiles": defined}}))
    with dask.config.set({f"nbcluster.profiles.{k}": v for k, v in defined.items()}):
        yield {"DASK_CONFIG": str(folder), "NBCLUSTER_RUNTIME_DIR": str(runtime_dir), **slurm.env}
    for handle in nbcluster.clusters(runtime_dir=runtime_dir):
        handle.stop()
    slurm.wait_jobs(lambda jobs: not jobs)


def test_a_notebook_starts_scales_and_stops_a_slurm_cluster(slurm, hpc):
    with kernel(hpc) as k:
        k.run("%load_ext nbcluster").ok()
        started = k.run("%cluster start --profile hpc --workers 2").ok()
        assert "Started cluster" in started.text and "slurm" in started.text
        assert len(slurm.jobs()) == 2
        k.run("import nbcluster; nbcluster.current().client.wait_for_workers(2, timeout=60)").ok()
        ids = {j["id"] for j in slurm.jobs()}
        status = k.run("%cluster status").ok().text
        for job in ids:
            assert f"job {job}" in status, status
        assert "127.0.0.1" in status

        k.run('%%distribute --over "x in range(50)" --into squares\nx * x').ok()
        assert k.value("sorted(squares.values())") == [x * x for x in range(50)]

        assert "adaptive 1-2" in k.run("%cluster adapt --min 1 --max 2").ok().text
        k.run("%cluster scale 3").ok()  # also takes control back from adaptivity
        assert len(slurm.jobs()) == 3

        k.run("%cluster stop").ok()
        assert slurm.all_cancelled()


def test_a_cancelled_job_mid_cell_loses_no_item(slurm, hpc, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    with kernel(hpc) as k:
        k.run("%load_ext nbcluster\n%cluster start --profile hpc --workers 2").ok()
        k.run("import nbcluster; nbcluster.current().client.wait_for_workers(2, timeout=60)").ok()
        cell = k.submit(
            f'%%distribute --over "x in range(50)" --batch 1 --into got\n'
            f"import time, pathlib, os\n"
            f"pathlib.Path({str(marks)!r}, f'{{x}}-{{os.getpid()}}').touch()\n"
            f"time.sleep(0.2)\n"
            f"x + 1000"
        )
        # Items leave a mark as they start: once a few have, the cell is well under way.
        waited_for(lambda: len(list(marks.iterdir())) >= 6, "start of six items", 60)
        victim = slurm.jobs()[0]["id"]
        slurm.run("scancel", victim)
        reply = k.collect(cell, timeout=120).ok()
        got = k.value("list(got.values())")
        assert sorted(got) == [x + 1000 for x in range(50)], reply.text
        slurm.wait_jobs(lambda jobs: victim not in {j["id"] for j in jobs})
        assert f"job {victim}" not in k.run("%cluster status").ok().text
        k.run("%cluster stop").ok()


def test_a_partition_that_does_not_exist_is_sbatchs_own_error_in_one_line(slurm, hpc):
    with pytest.raises(ClusterFailed) as failed:
        nbcluster.start(profile="nowhere", workers=1)
    message = str(failed.value)
    assert "\n" not in message
    assert "sbatch: error: Batch job submission failed: Invalid partition name specified" in message
    assert nbcluster.clusters() == []


def test_the_job_script_carries_tls_and_resource_settings(slurm, hpc, runtime_dir):
    security, tls = credentials.write_credentials(runtime_dir, "script")
    spec = ClusterSpec.from_user(profile="hpc", workers=0, threads=2, memory="2GiB")

    async def script() -> str:
        d = deploy.make(spec, profiles.get("hpc"), directory=runtime_dir, name="script", devices=[],
                        security=security, tls=tls)  # fmt: skip
        await d.start()
        try:
            return d.job_script()  # type: ignore[attr-defined]
        finally:
            await d.close(timeout=10)

    text = asyncio.run(script())
    assert f"--tls-ca-file {tls['ca_file']}" in text
    assert f"--tls-cert {tls['cert']}" in text and f"--tls-key {tls['key']}" in text
    assert "--protocol tls://" in text and " tls://127.0.0.1:" in text
    assert f"#SBATCH -p {PARTITION}" in text
    assert "#SBATCH --cpus-per-task=2" in text and "--nthreads 2" in text
    assert "#SBATCH --mem=" in text and "--memory-limit 2.00GiB" in text


def test_batch_job_workers_get_nbclusters_worker_environment(slurm, hpc):
    # The malloc setting that keeps numpy items as fast on a worker as in a fresh process
    # (nbcluster.worker.pre-spawn-environ) reaches workers that run as batch jobs too.
    handle = nbcluster.start(profile="hpc", workers=1)
    try:
        handle.client.wait_for_workers(1, timeout=60)
        # A lambda: `os.environ.get` itself would pickle this process's os.environ along.
        [value] = handle.client.run(lambda: os.environ.get("MALLOC_MMAP_THRESHOLD_")).values()
        assert value == str(dask.config.get("nbcluster.worker.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_"))
    finally:
        handle.stop()


def test_the_owner_watch_cancels_the_jobs_of_a_dead_kernel(slurm, hpc, runtime_dir):
    with kernel(hpc) as k:
        k.run("%load_ext nbcluster\n%cluster start --profile hpc --workers 2").ok()
        k.run("import nbcluster; nbcluster.current().client.wait_for_workers(2, timeout=60)").ok()
        assert len(slurm.jobs()) == 2
        os.kill(k.km.provisioner.process.pid, signal.SIGKILL)  # nothing in the kernel gets to clean up
        # The supervisor's close cancels them (scancel), well before a worker's death timeout.
        slurm.wait_jobs(lambda jobs: not jobs, timeout=30)
    assert nbcluster.clusters(runtime_dir=runtime_dir) == []


def test_the_cli_starts_and_stops_a_slurm_cluster(slurm, hpc, cli):
    started = cli("start", "--profile", "hpc", "--workers", "1", env=hpc)
    assert started.returncode == 0, started.stderr
    assert "Started cluster 'hpc'" in started.stdout and len(slurm.jobs()) == 1
    assert "hpc" in cli("list", env=hpc).stdout
    stopped = cli("stop", "hpc", env=hpc)
    assert stopped.returncode == 0, stopped.stderr
    assert slurm.all_cancelled()


def test_the_sidebars_rest_api_starts_scales_and_stops_a_slurm_cluster(slurm, hpc, tmp_path):
    with JupyterServer(tmp_path / "server", env={k: v for k, v in hpc.items() if k != "NBCLUSTER_RUNTIME_DIR"}) as server:
        status, profiles_body = server.api("GET", "api/profiles")
        assert status == 200
        assert {"name": "hpc", "backend": "slurm", "description": "The test machine's SLURM, debug partition"} in profiles_body["profiles"]
        status, started = server.api("POST", "api/clusters", {"profile": "hpc", "workers": 1})
        assert status == 201, started
        assert started["name"] == "hpc" and started["backend"] == "slurm" and len(slurm.jobs()) == 1
        status, scaled = server.api("POST", "api/clusters/hpc/scale", {"workers": 2})
        assert status == 200, scaled
        assert len(slurm.jobs()) == 2
        status, _ = server.api("DELETE", "api/clusters/hpc")
        assert status == 204 and slurm.all_cancelled()


def test_a_kept_slurm_cluster_outlives_its_kernel(slurm, hpc, runtime_dir):
    with kernel(hpc) as k:
        k.run("%load_ext nbcluster\n%cluster start --profile hpc --workers 1 --keep").ok()
        os.kill(k.km.provisioner.process.pid, signal.SIGKILL)
        k.km.provisioner.process.wait()
    [kept] = nbcluster.clusters(runtime_dir=runtime_dir)
    assert kept.name == "hpc" and kept.entry["owner_pid"] is None  # no owner: nothing to watch
    assert len(slurm.jobs()) == 1
    kept.stop()
    assert slurm.all_cancelled()


def test_batch_job_nannies_run_the_watch_that_ends_them_without_their_scheduler(slurm, hpc):
    # remote_watch.py, from the job script: the nanny of a job whose scheduler is gone ends
    # by its death timeout, not at its walltime (tested end to end in test_remote_faults.py).
    handle = nbcluster.start(profile="hpc", workers=1)
    try:
        handle.client.wait_for_workers(1, timeout=60)
        # In the nanny (Dask passes it as dask_worker); a lambda, pickled by value.
        watching = lambda dask_worker: not getattr(dask_worker, "_nbcluster_watch", None).done()  # noqa: E731
        assert list(handle.client.run(watching, nanny=True).values()) == [True]
    finally:
        handle.stop()
