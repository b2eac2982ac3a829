"""Time from "start a 2-worker cluster" to the first finished task, against the peers.

    python bench/startup.py [--runs 5]

Measures, in one run and interleaved so machine noise hits all alike:
- nbcluster: `%cluster start --workers 2 --threads 1` in an IPython shell, then one task
  (`%load_ext` has launched a spare supervisor, as in a notebook);
- nbcluster cold: `nbcluster.start` with no spare supervisor;
- Dask: `LocalCluster(n_workers=2, threads_per_worker=1)` + `Client`, then one task;
- ipyparallel: `Cluster(n=2).start_and_connect_sync()`, then one task on an engine.
Each sample includes stopping nothing: teardown happens after the clock stops.
Prints a markdown table (median, min, max seconds; ratio of medians to plain LocalCluster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _quiet import settle  # bench/, the script's own folder


def nbcluster_once() -> float:
    from IPython.core.interactiveshell import InteractiveShell

    import nbcluster

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbcluster")
    t0 = time.perf_counter()
    ip.run_line_magic("cluster", "start --workers 2 --threads 1 --name bench")
    assert nbcluster.current().client.submit(lambda: 1).result() == 1
    elapsed = time.perf_counter() - t0
    ip.run_line_magic("cluster", "stop bench")
    return elapsed


def nbcluster_cold_once() -> float:
    """The same without the spare supervisor `%load_ext` launches: a cold Python start-up.

    Through `nbcluster.start`, which starts as `%cluster start` does (its client connects
    while the workers start), not `nbcluster.cluster.handle.start`, which connects no client
    (for servers and scripts): until 2026-12-02 this row used that one, and its client
    connected only once the cluster was up."""
    import nbcluster
    from nbcluster.cluster import launcher

    launcher.discard_spare()
    t0 = time.perf_counter()
    cluster = nbcluster.start(workers=2, threads=1, name="bench-cold")
    assert cluster.client.submit(lambda: 1).result() == 1
    elapsed = time.perf_counter() - t0
    cluster.stop()
    launcher.prewarm()  # back to the notebook's state for the next %cluster start sample
    return elapsed


def localcluster_once() -> float:
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    assert client.submit(lambda: 1).result() == 1
    elapsed = time.perf_counter() - t0
    client.close()
    cluster.close()
    return elapsed


def ipyparallel_once() -> float:
    import ipyparallel as ipp

    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=2, log_level=40)
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(2, timeout=120)
    assert rc[0].apply_sync(lambda: 1) == 1
    elapsed = time.perf_counter() - t0
    rc.close()
    cluster.stop_cluster_sync()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    peers = {"nbcluster %cluster start": nbcluster_once, "nbcluster cold (no spare supervisor)": nbcluster_cold_once,
             "dask LocalCluster + Client": localcluster_once, "ipyparallel Cluster(n=2)": ipyparallel_once}  # fmt: skip
    samples: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(args.runs):
        for name, fn in peers.items():
            settle()
            samples[name].append(fn())
    base = statistics.median(samples["dask LocalCluster + Client"])
    print(f"Startup to first finished task, 2 workers, {args.runs} runs, {os.cpu_count()} cores\n")
    print("| peer | median s | min s | max s | ratio to LocalCluster |")
    print("|---|---|---|---|---|")
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"| {name} | {med:.2f} | {min(xs):.2f} | {max(xs):.2f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
