"""Real work on nbcluster's workers: per-item time, speedup and memory against peers.

    .venv/bin/python bench/real_work.py [--runs 5] [--write]

Overhead per task says little about the work people bring (training steps, simulations,
fits), so this measures that work itself, with four kernels:

- `mc50k`, `mc500k`: a numpy Monte Carlo estimate of pi, 6 M points drawn in chunks of
  50 k or 500 k (arrays of 0.4 MB and 4 MB, allocated and freed in a loop);
- `python`: a pure-Python integer loop;
- `lstsq`: 400 small numpy least-squares fits (200 x 20).

1. **Per-item time** of each kernel, run one item at a time (so every environment has the
   machine to itself), in: a fresh Python process, a `multiprocessing.Pool` worker, a
   plain Dask worker (`LocalCluster`, Dask's default worker environment) and an nbcluster
   worker. Medians over `--runs` rounds, environments interleaved; the ratio to the fresh
   process is what nbcluster's workers are tuned for (target <= 1.05).
2. **Speedup** of 12 `mc50k` items of 30 M points (~0.3 s each) on 2 workers against the
   serial run (the same 12 items in one fresh process) for `%%distribute`
   (`nbcluster.distribute`), `client.map` on nbcluster's workers right after it,
   `client.map` on the plain Dask cluster, and `Pool(2).map` (forked from this process,
   as a user's kernel would fork it). Every method runs once per round, on the same
   workers or pool each round: repeated cells, as in a notebook. The first round (the
   first cell) and the median of the later ones are shown apart, because a worker that
   slows down after its first batch looks fine in a first-cell benchmark. Each item also
   reports its own thread's CPU time: on a busy machine wall times move with the load, CPU
   times show whether a worker's environment makes the work itself slower. The Pool's
   processes have run part 1's kernels first, whose 4 MB arrays raise glibc's dynamic mmap
   threshold there; a Pool forked before any work faults its arrays in afresh and takes
   about twice the CPU an item (/tmp probes, issue 21), so this is the Pool at its best.
3. **Memory**: RSS of a worker after a task that allocates and frees about 2 GB in arrays
   of 1 to 50 MB (a few alive at a time, small objects kept between them), against a
   plain Dask worker (target: at most Dask's default + 10 %).

4. **The first cell** (`--first-cell`): each round is a fresh kernel process (an IPython
   shell, as a notebook's) that imports numpy, defines a Monte Carlo function in a cell,
   runs ``%load_ext nbcluster``, forks a `multiprocessing.Pool(2)`, runs
   ``%cluster start --workers 2 --threads 1``, and then times the first ``%%distribute``
   cell of 12 items of about 0.18 s and the Pool's first ``map`` of the same 12 items (in
   turns: which one goes first alternates by round), then the 12 items serially in the kernel.
   The ratio of speedups is the Pool's time over the cell's, in the same kernel and round
   (target >= 0.95).

`--write` replaces the `## real work` section of bench/RESULTS.md (with `--first-cell`,
the `## real work: the first cell` section).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _results import write_section  # bench/, the script's own folder

KERNELS = ("mc50k", "mc500k", "python", "lstsq")
# The environment as this script got it. A LocalCluster started here copies Dask's
# pre-spawn variables (MALLOC_TRIM_THRESHOLD_, ...) into os.environ; a "fresh process"
# must not inherit them.
FRESH_ENV = dict(os.environ)
SPEEDUP_ITEMS = 12
SPEEDUP_POINTS = 30_000_000  # an item of ~0.3 s, as in BUILD-NOTES.md's table
FIRST_CELL_POINTS = 22_000_000  # an item of ~0.18 s on a quiet core here

# The notebook of one first-cell round: its cells, as a student's would be.
FIRST_CELL_SETUP = """
import numpy as np

def mc(i, points={points}):
    rng = np.random.default_rng(i)
    inside = 0
    for _ in range(points // 50_000):
        x = rng.random(50_000)
        y = rng.random(50_000)
        inside += int(np.count_nonzero(x * x + y * y <= 1.0))
    return 4 * inside / points
"""


def kernel(name: str, seed: int = 0, points: int = 6_000_000) -> float:
    """One item of work; returns its result (so nothing is optimised away)."""
    import numpy as np

    if name.startswith("mc"):
        chunk = 50_000 if name == "mc50k" else 500_000
        total = points
        rng = np.random.default_rng(seed)
        inside = 0
        for _ in range(total // chunk):
            x = rng.random(chunk)
            y = rng.random(chunk)
            inside += int(np.count_nonzero(x * x + y * y <= 1.0))
        return 4 * inside / total
    if name == "python":
        acc = 0
        for i in range(1_500_000):
            acc = (acc + i * i) % 1_000_003
        return float(acc)
    if name == "lstsq":
        rng = np.random.default_rng(seed)
        total = 0.0
        for _ in range(400):
            x = rng.random((200, 20))
            y = x @ np.arange(20.0) + rng.normal(0, 0.1, 200)
            total += float(np.linalg.lstsq(x, y, rcond=None)[0][3])
        return total
    raise ValueError(name)


def cpu_of(name: str, seed: int, points: int) -> float:
    """One item's CPU time in the thread that ran it: unlike wall time, other processes on a
    busy machine barely change it, so it shows whether an environment slows the work itself."""
    t = time.thread_time()
    kernel(name, seed, points)
    return time.thread_time() - t


def timed(name: str, seed: int = 0) -> float:
    t = time.perf_counter()
    kernel(name, seed)
    return time.perf_counter() - t


def churn(total_bytes: int = 2_000_000_000, seed: int = 0) -> int:
    """Allocate and free ~2 GB in 1-50 MB arrays; return this process's RSS afterwards."""
    import gc

    import numpy as np
    import psutil

    rng = np.random.default_rng(seed)
    alive: list[Any] = []
    small: list[bytes] = []
    allocated = 0
    while allocated < total_bytes:
        size = int(rng.integers(1, 51)) * 1_000_000
        alive.append(np.ones(size // 8))  # touched, so the pages are really resident
        small.append(bytes(200))  # small objects between the big ones, as real code makes
        allocated += size
        if len(alive) > 4:
            alive.pop(0)
    del alive
    gc.collect()
    return psutil.Process().memory_info().rss


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def child(args: list[str]) -> None:
    """`real_work.py --child KERNEL N`: N items timed in this fresh process, as JSON."""
    import numpy  # noqa: F401 - imported before any timing, as in a kernel that ran a cell

    name, n = args[0], int(args[1])
    if name == "first-cell":
        print(json.dumps(first_cell_round(pool_first=bool(n))))
        return
    if name == "churn":
        print(json.dumps([rss(), churn()]))
        return
    if name == "serial":
        t = time.perf_counter()
        cpu = [cpu_of("mc50k", i, SPEEDUP_POINTS) for i in range(n)]
        print(json.dumps([time.perf_counter() - t, cpu]))
        return
    print(json.dumps([timed(name, i) for i in range(n)]))


def first_cell_round(pool_first: bool) -> dict[str, float]:
    """`real_work.py --child first-cell 0|1`: one kernel's first cell against its forked Pool."""
    import multiprocessing

    from IPython.core.interactiveshell import InteractiveShell

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    shell = InteractiveShell.instance()

    def run(source: str) -> None:
        result = shell.run_cell(source)
        if not result.success:
            raise RuntimeError(f"cell failed: {source.splitlines()[0]}")

    run(FIRST_CELL_SETUP.format(points=FIRST_CELL_POINTS))
    run("%load_ext nbcluster")
    pool = multiprocessing.get_context("fork").Pool(2)
    run("%cluster start --workers 2 --threads 1 --name first-cell")
    times: dict[str, float] = {}
    try:
        for method in ("pool", "cell") if pool_first else ("cell", "pool"):
            t = time.perf_counter()
            if method == "pool":
                pool.map(shell.user_ns["mc"], range(SPEEDUP_ITEMS), chunksize=1)
            else:
                run(f'%%distribute --over "i in range({SPEEDUP_ITEMS})" --into first\nmc(i)')
                assert shell.user_ns["first"].ok
            times[method] = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(SPEEDUP_ITEMS):
            shell.user_ns["mc"](i)
        times["serial"] = time.perf_counter() - t
    finally:
        pool.terminate()
        run("%cluster stop first-cell")
    return times


def first_cell(runs: int) -> str:
    """Part 4: `runs` rounds, each in a fresh kernel process; a table of each and the medians."""
    rounds = [fresh("first-cell", str(r % 2)) for r in range(runs)]
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end), {runs} rounds, each a fresh kernel: "
        f"`%cluster start --workers 2 --threads 1`, then the first `%%distribute` cell of "
        f"{SPEEDUP_ITEMS} `mc` items of {FIRST_CELL_POINTS / 1e6:.0f} M points, and a "
        "`Pool(2)` forked from the same kernel (its first `map`), in turns.",
        "",
        "| round | first | serial s | first cell s | Pool s | cell speedup | Pool speedup | cell / Pool |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r, times in enumerate(rounds):
        first = "Pool" if r % 2 else "cell"
        lines.append(
            f"| {r + 1} | {first} | {times['serial']:.2f} | {times['cell']:.2f} | {times['pool']:.2f} "
            f"| {times['serial'] / times['cell']:.2f}x | {times['serial'] / times['pool']:.2f}x "
            f"| {times['pool'] / times['cell']:.2f}x |"
        )
    ratios = [t["pool"] / t["cell"] for t in rounds]
    lines += ["", f"Median cell / Pool: **{statistics.median(ratios):.2f}x** (target >= 0.95)."]
    return "\n".join(lines)


def fresh(*args: str) -> Any:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True, env=FRESH_ENV
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # a kernel child prints its cells first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update ## real work in bench/RESULTS.md")
    parser.add_argument("--first-cell", action="store_true", help="part 4 alone: the first cell")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.first_cell:
        text = first_cell(args.runs)
        print(text)
        if args.write:
            write_section("real work: the first cell", "python bench/real_work.py " + " ".join(sys.argv[1:]), text)
        return

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    pool = multiprocessing.get_context("fork").Pool(2)
    from distributed import Client, LocalCluster

    import nbcluster

    plain = LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0")
    plain_client = Client(plain)
    handle = nbcluster.start(workers=2, threads=1, name="bench-real-work")
    try:
        handle.client.wait_for_workers(2)
        text = measure(args.runs, pool, plain_client, handle)
    finally:
        pool.terminate()
        plain_client.close()
        plain.close()
        handle.stop()
    print(text)
    if args.write:
        write_section("real work", "python bench/real_work.py " + " ".join(sys.argv[1:]), text)


def measure(runs: int, pool: Any, plain: Any, handle: Any) -> str:
    import nbcluster

    nb = handle.client
    per_item: dict[tuple[str, str], list[float]] = {}
    envs = ("fresh process", "Pool worker", "Dask worker (default env)", "nbcluster worker")
    for r in range(runs):
        for name in KERNELS:
            samples = {
                envs[0]: lambda name=name: statistics.median(fresh(name, "3")[1:]),  # first warms up
                envs[1]: lambda name=name, r=r: pool.apply(timed, (name, r)),
                envs[2]: lambda name=name, r=r: plain.submit(timed, name, r, pure=False).result(),
                envs[3]: lambda name=name, r=r: nb.submit(timed, name, r, pure=False).result(),
            }
            for env, sample in samples.items():
                sample()  # warm-up: imports, first allocations
                per_item.setdefault((name, env), []).append(sample())
        print(f"per-item round {r + 1}/{runs} done", file=sys.stderr)

    speed: dict[str, list[float]] = {}
    item_cpu: dict[str, list[float]] = {}  # every item's CPU seconds, later cells only
    n = SPEEDUP_ITEMS
    args = (["mc50k"] * n, range(n), [SPEEDUP_POINTS] * n)

    def record(label: str, seconds: float, cpu: list[float], cell: int) -> None:
        speed.setdefault(label, []).append(seconds)
        if cell:
            item_cpu.setdefault(label, []).extend(cpu)

    for cell in range(max(runs, 2)):  # at least one cell after the first
        record("serial (fresh process)", *fresh("serial", str(n)), cell)
        t = time.perf_counter()
        results = nbcluster.distribute(lambda i: cpu_of("mc50k", i, SPEEDUP_POINTS), over=range(n), on=nb)
        assert results.ok
        record("%%distribute", time.perf_counter() - t, list(results.values()), cell)
        t = time.perf_counter()
        cpu = nb.gather(nb.map(cpu_of, *args, pure=False))
        record("client.map (nbcluster's workers, after %%distribute)", time.perf_counter() - t, cpu, cell)
        t = time.perf_counter()
        cpu = plain.gather(plain.map(cpu_of, *args, pure=False))
        record("client.map (plain Dask)", time.perf_counter() - t, cpu, cell)
        t = time.perf_counter()
        cpu = pool.starmap(cpu_of, zip(*args, strict=True), chunksize=1)
        record("multiprocessing.Pool(2), forked", time.perf_counter() - t, cpu, cell)

    memory: dict[str, list[float]] = {}
    for _ in range(max(3, runs // 2)):
        _, after = fresh("churn", "1")
        memory.setdefault("fresh process", []).append(after / 2**20)
        for label, client in (("Dask worker (default env)", plain), ("nbcluster worker", nb)):
            client.restart()  # a worker that has run nothing else yet
            worker = next(iter(client.scheduler_info()["workers"]))
            memory.setdefault(label, []).append(
                client.submit(churn, pure=False, workers=[worker]).result() / 2**20
            )
            # nbcluster's workers trim the heap within `nbcluster.worker.trim-interval` (1 s)
            # of a task's end: RSS a moment later is what stays.
            time.sleep(2)
            memory.setdefault(f"{label}, 2 s later", []).append(client.run(rss, workers=[worker])[worker] / 2**20)

    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end), 2 workers x 1 thread, medians of {runs} rounds.",
        "",
        "**Per-item time**, seconds (one item at a time), and the ratio to a fresh process:",
        "",
        "| kernel | " + " | ".join(envs) + " |",
        "|---|" + "---:|" * len(envs),
    ]
    for name in KERNELS:
        base = statistics.median(per_item[(name, envs[0])])
        cells = []
        for env in envs:
            m = statistics.median(per_item[(name, env)])
            cells.append(f"{m:.3f}" if env == envs[0] else f"{m:.3f} ({m / base:.2f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    serial = statistics.median(speed["serial (fresh process)"])
    lines += [
        "",
        f"**Speedup**, {SPEEDUP_ITEMS} `mc50k` items of {SPEEDUP_POINTS / 1e6:.0f} M points on 2 workers "
        "against the serial run, in the first round (cell) and in the later ones (median), and "
        "each method's later-cell time against the forked Pool's; then the median CPU time of one "
        "item in the later cells (the thread's own, which a busy machine barely changes) against "
        "the Pool's:",
        "",
        "| method | first cell s | later cells s | speedup, later cells | vs Pool | item CPU s | vs Pool |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    pool_label = "multiprocessing.Pool(2), forked"
    pool_later = statistics.median(speed[pool_label][1:])
    pool_cpu = statistics.median(item_cpu[pool_label])
    for label, values in speed.items():
        later = statistics.median(values[1:])
        cpu = statistics.median(item_cpu[label])
        lines.append(
            f"| {label} | {values[0]:.2f} | {later:.2f} | {serial / later:.2f}x | {later / pool_later:.2f}x "
            f"| {cpu:.3f} | {cpu / pool_cpu:.2f}x |"
        )
    dask_rss = statistics.median(memory["Dask worker (default env), 2 s later"])
    lines += [
        "",
        "**Memory**: RSS of the process after allocating and freeing ~2 GB in 1-50 MB arrays (at the",
        "task's end, and 2 s later):",
        "",
        "| where | RSS MiB | vs Dask's default |",
        "|---|---:|---:|",
    ]
    for label, values in memory.items():
        m = statistics.median(values)
        lines.append(f"| {label} | {m:.0f} | {m / dask_rss:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
