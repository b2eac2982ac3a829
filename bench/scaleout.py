"""nbcluster on SLURM, SSH and dask-gateway against the same Dask deployment class used directly.

    PYTHONPATH=$PWD .venv/bin/python bench/scaleout.py [--backends slurm,ssh,gateway] [--runs 5]
        [--tiny 2000] [--write]

For each backend, a real service is started with the tests' helpers (`tests/slurm_service.py`,
`tests/ssh_service.py`, `tests/gateway_service.py`; needs root for SLURM and sshd). Then, in
each of `--runs` rounds, nbcluster and its peer run one after the other (the order alternates
by round), each on a fresh 2-worker x 1-thread cluster:

- nbcluster: `nbcluster.start(profile=..., workers=2)` with the profile set through
  `dask.config.set`, then `handle.client`, as the Python API does;
- peer: the class the profile names, with the same options (`SLURMCluster(...)`, `.scale(2)`,
  `SSHCluster(...)`, `GatewayCluster(...)`, `.scale(2)`), and `Client(cluster)`.

What is timed, per cluster:

1. **start**: from the start call until 2 workers are connected (`wait_for_workers(2)` on
   both); for nbcluster also when `start` itself returned;
2. **tiny items**: `--tiny` items of `x + 1`: `nbcluster.distribute(...)` (what `%%distribute`
   runs) against `client.map` + `gather`, wall time per item;
3. **per-item time** of real work on one worker, one item at a time, against a fresh Python
   process (`bench/real_work.py`'s `python` and `mc50k` kernels, after one warm-up item);
4. **speedup**: real_work's 12 `mc50k` items of 30 M points on the 2 workers, against the
   serial run in a fresh process and `multiprocessing.Pool(2)` (both measured in each round);
5. **stop**: from the stop call until nothing is left: `squeue` empty; every process the
   SSH sessions or the gateway ran before the stop has exited (`SSHCluster.close()` returns
   in ~0.03 s, but the remote Pythons, orphaned, live on for seconds).

Both sides get the dashboard off (nbcluster's default) and 127.0.0.1 addresses; nbcluster's
clusters use TLS (always), the peers Dask's default plain TCP, as a user calling the class
gets. Only one SLURM may run on the machine: if a `slurmctld` runs (a test suite), this waits
for it to end. `--write` replaces the `## scale-out` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import dask.config
import psutil
import real_work  # bench/, the script's own folder
from _results import write_section

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.* (the services) and this checkout's nbcluster
# Imported before any `dask.config.set` block: one that adds the first `nbcluster.*` key
# removes the whole `nbcluster` section on exit, defaults an import inside it put there too.
import nbcluster  # noqa: E402

# Workers elsewhere cannot import bench/real_work.py: its kernel travels by value.
cloudpickle.register_pickle_by_value(real_work)

KERNELS = ("python", "mc50k")
SPEEDUP_ITEMS = real_work.SPEEDUP_ITEMS
SPEEDUP_POINTS = real_work.SPEEDUP_POINTS


def inc(x: int) -> int:
    return x + 1


# Functions of this module travel by value (it is __main__) with the globals they name: the
# kernel itself, not the real_work module (whose other imports workers cannot resolve).
KERNEL = real_work.kernel


def mc(i: int) -> float:
    return KERNEL("mc50k", i, SPEEDUP_POINTS)


def timed(name: str, seed: int) -> float:
    t = time.perf_counter()
    KERNEL(name, seed)
    return time.perf_counter() - t


@dataclass
class Backend:
    """One running service: the profile nbcluster gets, how to make the peer, and how to
    tell that nothing of a stopped cluster is left."""

    name: str
    settings: dict[str, Any]  # Dask config: the profile (and the backend's own settings)
    make_peer: Callable[[], Any]  # -> a started Dask cluster object with 2 workers asked for
    leftovers: Callable[[], list[Any]]  # what of a cluster still runs (jobs, processes)


# -- the services ------------------------------------------------------------------------


def wait_for_free_slurm() -> None:
    """One SLURM per machine: wait for someone else's (the lead's test suite) to end."""
    while subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode == 0:
        print("a slurmctld is running (someone else's); waiting 30 s", file=sys.stderr)
        time.sleep(30)


@contextlib.contextmanager
def slurm_backend(folder: Path) -> Iterator[Backend]:
    from dask_jobqueue import SLURMCluster

    from tests.slurm_service import running, slurm_options

    wait_for_free_slurm()
    options = slurm_options(folder / "jobs", scheduler_options={"host": "127.0.0.1", "dashboard": False})

    def peer() -> Any:
        cluster = SLURMCluster(**options)
        cluster.scale(2)
        return cluster

    with running() as service:
        settings = {"nbcluster.profiles.bench-slurm": {"backend": "slurm", "options": options}}
        yield Backend("slurm", settings, peer, service.jobs)


@contextlib.contextmanager
def ssh_backend(folder: Path) -> Iterator[Backend]:
    from distributed import SSHCluster

    from tests.ssh_service import SSHServer

    with SSHServer(folder / "sshd") as server:
        options = {
            "hosts": ["127.0.0.1"] * 3,  # the scheduler's, then two workers'
            "connect_options": server.connect_options(),
            "worker_options": {"host": "127.0.0.1", "nthreads": 1},
            "scheduler_options": {"host": "127.0.0.1", "port": 0, "dashboard": False},
            "remote_python": sys.executable,
        }
        assert server.proc is not None
        sshd = psutil.Process(server.proc.pid)
        settings = {"nbcluster.profiles.bench-ssh": {"backend": "ssh", "options": options}}
        yield Backend("ssh", settings, lambda: SSHCluster(**options), lambda: sshd.children(recursive=True))


@contextlib.contextmanager
def gateway_backend(folder: Path) -> Iterator[Backend]:
    from dask_gateway import GatewayCluster

    from tests.gateway_service import GatewayServer

    with GatewayServer(folder / "gateway") as server:
        settings = server.config(profile="bench-gateway")

        def peer() -> Any:
            cluster = GatewayCluster(address=server.address)
            cluster.scale(2)
            return cluster

        yield Backend("gateway", settings, peer, server.clusters_running)


SERVICES = {"slurm": slurm_backend, "ssh": ssh_backend, "gateway": gateway_backend}


# -- one cluster, measured ---------------------------------------------------------------


def wait_gone(backend: Backend, before: list[Any], timeout: float = 60) -> None:
    """Until nothing of the cluster is left: every process it had before the stop has
    exited (an SSH session's Python outlives the session's end by seconds, as an orphan,
    so "sshd has no children" is not enough), and the backend lists nothing."""
    _, alive = psutil.wait_procs([p for p in before if isinstance(p, psutil.Process)], timeout=timeout)
    if alive:
        raise RuntimeError(f"{backend.name}: processes still there {timeout:g} s after stop: {alive}")
    # squeue has no event to wait on: poll it.
    deadline = time.monotonic() + timeout
    while left := backend.leftovers():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{backend.name}: still there {timeout:g} s after stop: {left}")
        time.sleep(0.05)


def measure_cluster(side: str, backend: Backend, tiny: int, out: dict[str, list[float]]) -> None:
    """Start one cluster (nbcluster or the peer), run everything on it, stop it; append the
    samples to `out` under ``"<what>|<side>"``."""
    from distributed import Client

    def add(what: str, value: float) -> None:
        out.setdefault(f"{what}|{side}", []).append(value)

    t0 = time.perf_counter()
    handle = cluster = client = None
    try:
        if side == "nbcluster":
            handle = nbcluster.start(profile=f"bench-{backend.name}", workers=2, name=f"bench-{backend.name}")
            add("start returned", time.perf_counter() - t0)
            client = handle.client
        else:
            cluster = backend.make_peer()
            client = Client(cluster)
        client.wait_for_workers(2, timeout=120)
        add("start", time.perf_counter() - t0)

        t = time.perf_counter()
        if side == "nbcluster":
            assert nbcluster.distribute(inc, over=range(tiny), on=client).ok
        else:
            client.gather(client.map(inc, range(tiny)))
        add("tiny", (time.perf_counter() - t) / tiny)

        for name in KERNELS:
            client.submit(timed, name, 0, pure=False).result()  # warm-up
            add(f"item {name}", client.submit(timed, name, 1, pure=False).result())

        t = time.perf_counter()
        if side == "nbcluster":
            assert nbcluster.distribute(mc, over=range(SPEEDUP_ITEMS), on=client).ok
        else:
            client.gather(client.map(mc, range(SPEEDUP_ITEMS), pure=False))
        add("speedup", time.perf_counter() - t)
    finally:
        before = backend.leftovers()
        t = time.perf_counter()
        if handle is not None:
            handle.stop()
        else:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        wait_gone(backend, before)
        add("stop", time.perf_counter() - t)


def measure(backend: Backend, runs: int, tiny: int, pool: Any) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with dask.config.set(backend.settings):
        for r in range(runs):
            sides = ("nbcluster", "peer") if r % 2 == 0 else ("peer", "nbcluster")
            for side in sides:
                measure_cluster(side, backend, tiny, out)
            for name in KERNELS:
                out.setdefault(f"item {name}|fresh", []).append(statistics.median(real_work.fresh(name, "3")[1:]))
            out.setdefault("speedup|serial", []).append(real_work.fresh("serial", str(SPEEDUP_ITEMS)))
            t = time.perf_counter()
            pool.map(mc, range(SPEEDUP_ITEMS), chunksize=1)
            out.setdefault("speedup|pool", []).append(time.perf_counter() - t)
            print(f"{backend.name}: round {r + 1}/{runs} done", file=sys.stderr)
    return out


# -- the report --------------------------------------------------------------------------


def table(name: str, s: dict[str, list[float]], tiny: int) -> list[str]:
    def med(key: str) -> float:
        return statistics.median(s[key])

    def row(label: str, what: str, unit: float = 1.0, fmt: str = "{:.2f}") -> str:
        nb, peer = med(f"{what}|nbcluster") * unit, med(f"{what}|peer") * unit
        return f"| {label} | {fmt.format(nb)} | {fmt.format(peer)} | {nb / peer:.2f}x |"

    serial = med("speedup|serial")
    lines = [
        f"**{name}** (medians of {len(s['start|peer'])} rounds)",
        "",
        "| measure | nbcluster | peer | ratio |",
        "|---|---:|---:|---:|",
        row("start to 2 workers, s", "start"),
        f"| (nbcluster's `start` returned after, s) | {med('start returned|nbcluster'):.2f} | | |",
        row(f"tiny items ({tiny}), ms per item", "tiny", 1000, "{:.3f}"),
    ]
    for k in KERNELS:
        fresh = med(f"item {k}|fresh")
        nb, peer = med(f"item {k}|nbcluster"), med(f"item {k}|peer")
        lines.append(
            f"| `{k}` item on a worker, s (fresh process {fresh:.3f}) | {nb:.3f} ({nb / fresh:.2f}x) "
            f"| {peer:.3f} ({peer / fresh:.2f}x) | {nb / peer:.2f}x |"
        )
    nb, peer, pool = med("speedup|nbcluster"), med("speedup|peer"), med("speedup|pool")
    lines += [
        f"| {SPEEDUP_ITEMS} `mc50k` items, s (serial {serial:.2f}, Pool(2) {pool:.2f} = {serial / pool:.2f}x) "
        f"| {nb:.2f} ({serial / nb:.2f}x) | {peer:.2f} ({serial / peer:.2f}x) | {nb / peer:.2f}x |",
        row("stop until nothing is left, s", "stop"),
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="slurm,ssh,gateway")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tiny", type=int, default=2000, help="tiny items per run")
    parser.add_argument("--write", action="store_true", help="update ## scale-out in bench/RESULTS.md")
    args = parser.parse_args()
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(chosen) - set(SERVICES)
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(sorted(unknown))}: choose from {', '.join(SERVICES)}")

    folder = Path(tempfile.mkdtemp(prefix="nbcluster-scaleout-"))
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", str(folder / "runtime"))
    pool = multiprocessing.get_context("fork").Pool(2)
    results = {}
    try:
        for name in chosen:
            with SERVICES[name](folder) as backend:
                results[name] = measure(backend, args.runs, args.tiny, pool)
    finally:
        pool.terminate()
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end), 2 workers x 1 thread. Peer: the deployment class "
        "used directly (`SLURMCluster`, `SSHCluster`, `GatewayCluster` + `Client`); ratio = "
        "nbcluster / peer (below 1: nbcluster faster). Per-item times in parentheses are against a "
        "fresh Python process; wall times against the serial run.",
    ]
    for name, samples in results.items():
        lines += ["", *table(name, samples, args.tiny)]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("scale-out", "python bench/scaleout.py " + " ".join(sys.argv[1:]), text)


if __name__ == "__main__":
    main()
