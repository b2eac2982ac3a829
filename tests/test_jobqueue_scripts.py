"""PBS, SGE, LSF and HTCondor profiles: configuration checked, not run.

No such batch system runs here (SLURM does: tests/test_slurm.py). What can be checked
without one is checked: a profile of each backend is read from Dask config, nbcluster's
deployment builds dask-jobqueue's cluster object from it (its scheduler starts, on TLS, with
no job submitted), and the job script it would submit starts a worker that reaches that
scheduler over TLS with the cluster's own certificate, with the threads and memory asked for.
Whether the batch system accepts the script is not checked.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import dask.config
import pytest

from nbcluster.cluster import credentials, deploy, profiles
from nbcluster.cluster.spec import ClusterSpec

pytest.importorskip("dask_jobqueue", reason="the jobqueue extra is not installed: pip install -e '.[jobqueue]'")

# The directive each system's scripts start their lines with (dask-jobqueue's own templates).
DIRECTIVE = {"pbs": "#PBS", "sge": "#$", "lsf": "#BSUB", "htcondor": "Executable"}


@pytest.mark.parametrize("backend", sorted(DIRECTIVE))
def test_the_job_script_of_each_other_batch_system_reaches_the_tls_scheduler(backend, runtime_dir: Path) -> None:
    profile = {
        "backend": backend,
        "options": {
            "cores": 2, "memory": "2GB", "python": sys.executable, "scheduler_options": {"host": "127.0.0.1"},
            **({"disk": "1GB"} if backend == "htcondor" else {"walltime": "00:10:00"} if backend != "lsf" else {}),
        },
    }  # fmt: skip
    security, tls = credentials.write_credentials(runtime_dir, backend)
    with dask.config.set({f"nbcluster.profiles.{backend}-test": profile}):
        spec = ClusterSpec.from_user(profile=f"{backend}-test", workers=0, threads=2)

        async def script() -> str:
            d = deploy.make(spec, profiles.get(f"{backend}-test"), directory=runtime_dir, name=backend,
                            devices=[], security=security, tls=tls)  # fmt: skip
            await d.start()
            try:
                assert d.address.startswith("tls://127.0.0.1:")
                return str(d.job_script())  # type: ignore[attr-defined]
            finally:
                await d.close(timeout=10)

        text = asyncio.run(script())
    assert DIRECTIVE[backend] in text, text
    assert f"--tls-ca-file {tls['ca_file']}" in text and f"--tls-cert {tls['cert']}" in text, text
    assert f"--tls-key {tls['key']}" in text and " tls://127.0.0.1:" in text, text
    assert "--nthreads 2" in text, text
