"""Load, on loopback only, bounded in count and time: the suite's short versions of the benches.

- REST: 20 concurrent clients poll the cluster list and metrics of a real Jupyter server
  while another creates, scales and deletes clusters (`bench/rest_load.py`; the full run,
  60 s and 30 cycles, is in bench/RESULTS.md). Every answer must be right, and nothing may
  be left over.
- Kernel: one real kernel runs 300 consecutive `%%distribute` cells; its RSS, open files and
  threads must stay flat (`bench/kernel_leaks.py` runs 1,000).
- Scheduler metrics: 1,000,000 task reports into the metrics plugin of a real in-process
  scheduler, driven directly (1,000,000 real tasks take ~30 minutes on 2 cores); its
  memory must stay flat once its rings are full.
"""

from __future__ import annotations

import asyncio
import gc
import statistics

import psutil
from distributed import Scheduler

from bench.kernel_leaks import CELL_INTO, measure
from bench.rest_load import LoadResult, run_load
from nbcluster.metrics import install


def test_rest_answers_stay_right_under_20_polling_clients_while_clusters_come_and_go(tmp_path):
    result, left = run_load(tmp_path, clients=20, duration=10, cycles=4, pause=0.25)
    assert result.errors == []
    assert left == []
    assert len(result.cycle_s) == 4 and len(result.list_ms) > 200
    # Generous for a loaded 2-core CI machine; the bench reports the real numbers.
    assert LoadResult.pct(result.list_ms, 0.5) < 1000, LoadResult.pct(result.list_ms, 0.5)


def test_a_kernel_stays_flat_over_300_distribute_cells(runtime_dir, monkeypatch):
    # Dask keeps each comm's last 1,000 messages (distributed.admin.low-level-log-length),
    # a bounded log that takes a few hundred cells to fill; shortened here so that 300
    # cells show a leak of ours rather than that fill (bench/kernel_leaks.py keeps Dask's
    # default and shows the plateau).
    monkeypatch.setenv("DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH", "10")
    # --into: IPython's output history (Out) would keep each cell's Results by design.
    samples = measure(300, cell=CELL_INTO)
    first, last = samples[:100], samples[-100:]
    # A sample can catch a run's short-lived work (its watch thread reading /proc), so a
    # couple of extra fds or threads at one moment is no leak; one per cell would be 200.
    assert max(s.fds for s in last) <= max(s.fds for s in first) + 2
    assert max(s.threads for s in last) <= max(s.threads for s in first) + 2
    grown = statistics.median(s.rss for s in last) - statistics.median(s.rss for s in first)
    # ~10 KB per cell would show as 2 MiB over the 200 cells between the two windows.
    assert grown < 3 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


def test_scheduler_metrics_memory_stays_flat_over_a_million_tasks():
    report = {"worker": "tls://127.0.0.1:1", "startstops": [{"action": "compute", "start": 1.0, "stop": 1.5}]}
    me = psutil.Process()

    async def main() -> tuple[int, list[int]]:
        async with Scheduler(dashboard_address=":0", port=0) as s:
            plugin = await install(s)
            transition = plugin.transition
            rss = []
            for block in range(10):  # 10 x 100,000 reports, distinct keys as client.map gives
                for i in range(block * 100_000, (block + 1) * 100_000):
                    transition(f"tiny-{i:x}", "processing", "memory", **report)
                gc.collect()
                rss.append(me.memory_info().rss)
            return len(plugin.tasks), rss

    held, rss = asyncio.run(main())
    assert held == 20_000  # the ring's capacity: older records were replaced
    # After 200,000 the rings (and dask's 100,000-key key_split cache) are full; 800,000 more
    # reports must not grow the process. A leak of 20 bytes per report (one small object)
    # would be 16 MB; the allocator alone showed one step of ~7 MiB here, then nothing up to
    # 2,000,000 reports (bench/RESULTS.md).
    grown = max(rss[2:]) - rss[1]
    assert grown < 16 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB: {[r // 2**20 for r in rss]} MiB"
