"""Overhead of `%%distribute` against its peers, on 2 workers x 1 thread.

    .venv/bin/python bench/overhead.py [--repeats 3] [--write]

Five measurements, each a median over `--repeats` runs, peers interleaved round-robin
so drift in the machine's load hits them alike:

1. Tiny items (`x + 1`, 20,000 of them): amortized wall time per item for `%%distribute`
   (through a real IPython shell), raw `client.map` + `gather`, joblib's dask backend,
   ipyparallel's `DirectView.map_sync` (2 engines) and `multiprocessing.Pool(2).map`, the
   practical floor. `client.map` runs 5,000 items: at ~2 ms per task, 20,000 would take a
   minute per run; its cost per item does not depend on the count. The three that take tens
   of ms (ours, `map_sync`, `Pool`) are sampled `TINY_RUNS` (15) times, the others
   `--repeats` times.
2. 400 items of ~10 ms of CPU work (a fixed loop, calibrated here, so a busy machine shows
   as lost efficiency rather than hiding in a wall-clock spin): parallel efficiency
   `serial time / (2 x wall)`, the serial time measured in this process just before.
   `client.map` batched by hand into 40 tasks of 10 items is what Dask itself reaches on
   this machine once per-task costs are out of the way.
3. A 200 MB array, held by an object, captured by a cell over 1,000 items, run twice: how
   many copies of the array each worker process received (writeable arrays unpickled there),
   how many per-item objects it made (each around a read-only view of its one copy), and the
   time of each run; the second run should send nothing.

4. An 8-item cell (`x + 1`), 25 samples: the fixed cost of a small cell, through the magic, through
   `distribute(fn)`, ipyparallel's `%%px` (a cell on both engines) and `map_sync`,
   `client.map` + `gather` and `Pool.map`.
5. 1,000,000 tiny items through the magic, `distribute(fn)` (also with every
   value read back as a list, `.values()`, what `map_sync` returns) and ipyparallel
   `map_sync`: the time per item (median of `--repeats`) and the kernel's peak RSS growth
   while the first run ran (sampled every 2 ms from a thread; the results kept, as a user's
   `--into` keeps them).

`--rss magic` / `--rss fn` measures only 5, one way, in a fresh process.

Before each sample the bench waits until the processes it started are idle (`_quiet.py`):
a peer's 20,000 Dask tasks are still being released on the workers when the next sample
starts, and a notebook's next cell does not run into that.

`--write` replaces the `## overhead` section of bench/RESULTS.md with the table.

`--quick N` measures only 1 and 4 (ours, `map_sync`, `%%px`), N samples each, interleaved;
`--variant NAME:KEY=VALUE` (repeatable) adds a row of ours run under that Dask config
setting, in the same rounds: the cost of a code path against the lead over ipyparallel.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _quiet import idle_share, settle
from _results import write_section
from _work import calibrate, work  # bench/, the script's own folder

TINY = 20_000
MILLION = 1_000_000
SMALL = 8
SMALL_RUNS = 25  # samples of each small cell
# Samples of 20,000 tiny items for the peers that take tens of ms (ours, map_sync, Pool): five
# of one 10 ms cell each moved the median by 1.5x between runs minutes apart.
TINY_RUNS = 15
QUICK = ("%%distribute", "ipyparallel map_sync", "multiprocessing.Pool.map")
MAP_ITEMS = 5_000
WORK_ITEMS = 400
# A sample starts once the processes started here (2 workers, a scheduler, ipyparallel's,
# Pool's) use at most this share of a core over what they use idle (`IDLE`, measured once
# everything is warm: an idle Dask cluster's heartbeats alone are ~0.2 of a core here).
QUIET = 0.05
IDLE = [0.0]
UNSETTLED = [0]  # samples taken without the machine having settled (printed)


def quiet(settled: bool) -> None:
    if not settled:
        UNSETTLED[0] += 1


def inc(x: int) -> int:
    return x + 1


def work_item(n: int) -> int:
    """`work` from this script's `__main__`: Dask pickles a graph by reference unless it
    names `__main__` (then cloudpickle, which sends `_work` by value); `work` alone would
    reach the workers as an import of `_work`, which they cannot do."""
    return work(n)


def work_batch(n: int, k: int) -> int:
    """`k` items of `work` in one task: client.map batched by hand, Dask's own floor."""
    for _ in range(k):
        work(n)
    return k


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_growth(fn: Callable[[], Any]) -> tuple[float, int, Any]:
    """(seconds, peak RSS growth in bytes, what `fn` returned), RSS sampled every 2 ms."""
    import gc
    import threading

    gc.collect()
    base = _rss()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    kept = fn()
    elapsed = time.perf_counter() - t
    done.set()
    sampler.join()
    return elapsed, max(peak[0], _rss()) - base, kept


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--write", action="store_true", help="update the ## overhead section of bench/RESULTS.md"
    )
    parser.add_argument(
        "--rss", choices=["magic", "fn"],
        help="only 1,000,000 tiny items once, this way, in this fresh process: time and peak RSS growth",
    )  # fmt: skip
    parser.add_argument("--quick", type=int, metavar="N", help="only tiny items and the 8-item cell, N samples")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE")
    args = parser.parse_args()
    if args.rss:
        print(_fresh_rss(args.rss))
        return

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    # Fork the pool first: IPython replaces sys.modules["__main__"], and forked children
    # must still find `inc` and `work` there.
    pool = multiprocessing.get_context("fork").Pool(2)
    import ipyparallel as ipp
    import numpy as np
    from IPython.core.interactiveshell import InteractiveShell
    from joblib import Parallel, delayed, parallel_config

    import nbcluster
    from nbcluster.run.api import distribute

    handle = nbcluster.start(workers=2, threads=1, name="bench-overhead")
    ipp_cluster = ipp.Cluster(n=2, log_level=40)
    try:
        if args.quick:
            print(_quick(args, handle, ipp_cluster, InteractiveShell))
            return
        table = _measure(
            args,
            handle,
            ipp_cluster,
            pool,
            ipp,
            np,
            InteractiveShell,
            Parallel,
            delayed,
            parallel_config,
            distribute,
        )
    finally:
        pool.terminate()
        ipp_cluster.stop_cluster_sync()
        handle.stop()
    print(table)
    if args.write:
        write_section("overhead", " ".join(["python", "bench/overhead.py", *sys.argv[1:]]), table)


def _measure(args: Any, handle: Any, ipp_cluster: Any, pool: Any, ipp: Any, np: Any, InteractiveShell: Any,
             Parallel: Any, delayed: Any, parallel_config: Any, distribute: Any) -> str:  # fmt: skip
    client = handle.client
    client.wait_for_workers(2)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbcluster")
    rc = ipp_cluster.start_and_connect_sync()
    rc.wait_for_engines(2, timeout=120)
    view = rc[:]
    n_work = calibrate()
    ip.user_ns.update(inc=inc, work=work, n_work=n_work)

    def cell(source: str) -> None:
        result = ip.run_cell(source)
        assert result.success, result.error_in_exec
        assert ip.user_ns["r"].ok

    tiny: dict[str, tuple[int, Callable[[], Any]]] = {
        "%%distribute": (TINY, lambda: cell(f'%%distribute --over "x in range({TINY})" --into r\nx + 1')),
        "client.map + gather": (
            MAP_ITEMS,
            lambda: client.gather(client.map(inc, range(MAP_ITEMS), pure=False)),
        ),
        "joblib, dask backend": (
            TINY,
            lambda: _joblib(Parallel, delayed, parallel_config, client, inc, TINY),
        ),
        "ipyparallel map_sync": (TINY, lambda: view.map_sync(inc, range(TINY))),
        "multiprocessing.Pool.map": (TINY, lambda: pool.map_async(inc, range(TINY)).get(300)),
    }
    work_runs: dict[str, Callable[[], Any]] = {
        "%%distribute": lambda: cell(
            f'%%distribute --over "x in range({WORK_ITEMS})" --into r\nwork(n_work)'
        ),
        "client.map + gather": lambda: client.gather(client.map(work_item, [n_work] * WORK_ITEMS, pure=False)),
        "client.map, batched by hand (40 x 10)": lambda: client.gather(
            client.map(work_batch, [n_work] * 40, [WORK_ITEMS // 40] * 40, pure=False)
        ),
        "multiprocessing.Pool.map": lambda: pool.map_async(work, [n_work] * WORK_ITEMS).get(300),
    }

    # Warm up every path once (imports, connections, worker caches).
    for name, (_, fn) in tiny.items():
        if name != "client.map + gather":
            fn()
    settle(share=1.0)  # the warm-ups' tasks released
    IDLE[0] = idle_share()
    tiny_times: dict[str, list[float]] = {name: [] for name in tiny}
    work_times: dict[str, list[float]] = {name: [] for name in work_runs}
    serial_times: list[float] = []
    for run in range(max(args.repeats, TINY_RUNS)):
        for name, (_, fn) in tiny.items():
            if run < (TINY_RUNS if name in QUICK else args.repeats):
                quiet(settle(share=QUIET + IDLE[0]))  # the last peer's tasks released: not this sample's cost
                tiny_times[name].append(timed(fn))
        if run >= args.repeats:
            continue
        serial_times.append(timed(lambda: [work(n_work) for _ in range(WORK_ITEMS)]))
        for name, fn in work_runs.items():
            quiet(settle(share=QUIET + IDLE[0]))
            work_times[name].append(timed(fn))

    small: dict[str, Callable[[], Any]] = {
        "%%distribute": lambda: cell(f'%%distribute --over "x in range({SMALL})" --into r\nx + 1'),
        "distribute(fn)": lambda: distribute(inc, over=range(SMALL)),
        "ipyparallel %%px": lambda: ip.run_cell_magic("px", "", "y = 1 + 1"),
        "ipyparallel map_sync": lambda: view.map_sync(inc, range(SMALL)),
        "client.map + gather": lambda: client.gather(client.map(inc, range(SMALL), pure=False)),
        "multiprocessing.Pool.map": lambda: pool.map_async(inc, range(SMALL)).get(300),
    }
    rc.activate()  # registers %%px in the shell, on all engines
    for fn in small.values():
        fn()
    small_times: dict[str, list[float]] = {name: [] for name in small}
    for _ in range(SMALL_RUNS):  # a small cell's time moves by 2x between runs: many samples
        for name, fn in small.items():
            quiet(settle(share=QUIET + IDLE[0]))
            small_times[name].append(timed(fn))

    million: dict[str, Callable[[], Any]] = {
        "%%distribute": lambda: cell(f'%%distribute --over "x in range({MILLION})" --into r\nx + 1')
        or ip.user_ns["r"],
        "distribute(fn)": lambda: distribute(inc, over=range(MILLION)),
        # map_sync's answer is a list of the values: this row reads every value, as that list.
        "distribute(fn), .values()": lambda: distribute(inc, over=range(MILLION)).values(),
        "ipyparallel map_sync": lambda: view.map_sync(inc, range(MILLION)),
    }
    # The peak RSS growth of each one's first run (a later run reuses what the first freed);
    # the time, the median of `--repeats` runs, interleaved.
    million_times: dict[str, list[float]] = {name: [] for name in million}
    million_grown: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, fn in million.items():
            quiet(settle(share=QUIET + IDLE[0]))
            ip.user_ns.pop("r", None)
            ip.displayhook.flush()  # IPython's output history must not keep an earlier run's results
            seconds, grown, kept = peak_growth(fn)
            million_times[name].append(seconds)
            million_grown.setdefault(name, grown)
            del kept
    ip.user_ns.pop("r", None)
    million_rows = [
        f"| {name} | {statistics.median(million_times[name]) / MILLION * 1e6:.2f} µs | +{million_grown[name] / 1e6:.0f} MB |"
        for name in million
    ]

    big_rows = _big_array(client, distribute, np)

    load = os.getloadavg()
    serial = statistics.median(serial_times)
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average at the end "
        f"{load[0]:.1f}), 2 workers x 1 thread (nbcluster: TLS, supervisor process), "
        f"median of {args.repeats} interleaved runs, each sample taken once the processes started here "
        f"used under {QUIET:.0%} of a core over their idle {IDLE[0]:.0%} (samples taken without: "
        f"{UNSETTLED[0]}, after 15 s).",
        "",
        f"**Tiny items** (`x + 1`), amortized wall time per item (median of {TINY_RUNS} for "
        f"%%distribute, map_sync and Pool, of {args.repeats} for the others):",
        "",
        "| method | items | per item | vs %%distribute |",
        "|---|---:|---:|---:|",
    ]
    ours = statistics.median(tiny_times["%%distribute"]) / TINY
    for name, (n, _) in tiny.items():
        per = statistics.median(tiny_times[name]) / n
        lines.append(f"| {name} | {n:,} | {per * 1e6:.2f} µs | {per / ours:.1f}x |")
    lines += [
        "",
        f"**{WORK_ITEMS} items of ~10 ms CPU work** (serial in one process: {serial:.2f} s): "
        "parallel efficiency = serial / (2 x wall):",
        "",
        "| method | wall | efficiency |",
        "|---|---:|---:|",
    ]
    for name, times in work_times.items():
        wall = statistics.median(times)
        lines.append(f"| {name} | {wall:.2f} s | {serial / (2 * wall):.2f} |")
    # On a shared machine other processes take cores too; the Pool (no scheduler, no
    # network) shows how much parallelism there was to have.
    ratio = statistics.median(work_times["multiprocessing.Pool.map"]) / statistics.median(
        work_times["%%distribute"]
    )
    lines += ["", f"%%distribute efficiency relative to multiprocessing.Pool in the same runs: {ratio:.2f}."]
    lines += [
        "",
        f"**An {SMALL}-item cell** (`x + 1`), wall time per cell, median of {SMALL_RUNS}:",
        "",
        "| method | per cell | vs %%distribute |",
        "|---|---:|---:|",
    ]
    ours_small = statistics.median(small_times["%%distribute"])
    for name, times in small_times.items():
        per = statistics.median(times)
        lines.append(f"| {name} | {per * 1e3:.1f} ms | {per / ours_small:.2f}x |")
    lines += [
        "",
        f"**{MILLION:,} tiny items**, time per item (median of the runs), kernel peak RSS growth in the first (results kept):",
        "",
        "| method | per item | peak RSS growth |",
        "|---|---:|---:|",
        *million_rows,
    ]
    lines += ["", "**200 MB captured array over 1,000 items**, two cells in a row:", "", *big_rows]
    return "\n".join(lines)


def _quick(args: Any, handle: Any, ipp_cluster: Any, InteractiveShell: Any) -> str:
    """Tiny items and the 8-item cell only: ours (and each `--variant`) against ipyparallel."""
    import dask

    handle.client.wait_for_workers(2)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbcluster")
    rc = ipp_cluster.start_and_connect_sync()
    rc.wait_for_engines(2, timeout=120)
    view = rc[:]
    rc.activate()
    ip.user_ns.update(inc=inc)

    def cell(n: int, settings: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            with dask.config.set(settings):
                result = ip.run_cell(f'%%distribute --over "x in range({n})" --into r\nx + 1')
            assert result.success, result.error_in_exec
            assert ip.user_ns["r"].ok
        return run

    variants: dict[str, dict[str, Any]] = {"%%distribute": {}}
    for spec in args.variant:
        name, _, setting = spec.partition(":")
        key, _, value = setting.partition("=")
        variants[f"%%distribute, {name}"] = {key: value}
    rows: dict[str, tuple[int, Callable[[], Any]]] = {}
    for name, settings in variants.items():
        rows[f"tiny {name}"] = (TINY, cell(TINY, settings))
    rows["tiny ipyparallel map_sync"] = (TINY, lambda: view.map_sync(inc, range(TINY)))
    for name, settings in variants.items():
        rows[f"cell {name}"] = (1, cell(SMALL, settings))
    rows["cell ipyparallel %%px"] = (1, lambda: ip.run_cell_magic("px", "", "y = 1 + 1"))
    rows["cell ipyparallel map_sync"] = (1, lambda: view.map_sync(inc, range(SMALL)))
    for _, fn in rows.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.quick):
        for name, (_, fn) in rows.items():
            settle(quiet_s=0.1, at_most_s=2.0, share=0.3)
            times[name].append(timed(fn))
    load = os.getloadavg()
    lines = [f"Quick run {time.strftime('%Y-%m-%d %H:%M')}, median of {args.quick}, load {load[0]:.1f} (machine shared)",
             "", "| row | median | vs ipyparallel map_sync |", "|---|---:|---:|"]  # fmt: skip
    for name, (n, _) in rows.items():
        per = statistics.median(times[name]) / n
        peer = statistics.median(times[f"{name.split()[0]} ipyparallel map_sync"]) / n
        unit = f"{per * 1e6:.2f} µs/item" if n > 1 else f"{per * 1e3:.2f} ms/cell"
        lines.append(f"| {name} | {unit} | {per / peer:.2f}x |")
    return "\n".join(lines)


def _fresh_rss(how: str) -> str:
    """1,000,000 tiny items in a fresh kernel-like process: the heap holds nothing from earlier runs."""
    from IPython.core.interactiveshell import InteractiveShell

    import nbcluster
    from nbcluster.run.api import distribute

    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    handle = nbcluster.start(workers=2, threads=1, name="bench-overhead-rss")
    try:
        handle.client.wait_for_workers(2)
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "nbcluster")
        ip.user_ns["inc"] = inc

        def run(n: int) -> Any:
            if how == "fn":
                return distribute(lambda x: x + 1, over=range(n))
            ip.run_cell(f'%%distribute --over "x in range({n})" --into r\nx + 1')
            return ip.user_ns["r"]

        assert run(1000).ok  # warm: imports, connections, worker caches
        seconds, grown, kept = peak_growth(lambda: run(MILLION))
        assert kept.ok
        return f"{how}: {seconds / MILLION * 1e6:.2f} µs per item, peak RSS growth +{grown / 1e6:.0f} MB"
    finally:
        handle.stop()


def _joblib(Parallel: Any, delayed: Any, parallel_config: Any, client: Any, fn: Any, n: int) -> Any:
    with parallel_config(backend="dask", wait_for_workers_timeout=30):
        return Parallel(n_jobs=-1)(delayed(fn)(x) for x in range(n))


BIG_SOURCE = """
import numpy as np
def _rebuild(data):
    import sys
    counts = sys.__dict__.setdefault("_nbcluster_bench_loads", [0, 0])
    counts[not data.flags.writeable] += 1  # [own copies of the array, read-only views of one]
    return Counted(data)
class Counted:
    def __init__(self, data):
        self.data = data
    def __reduce__(self):
        return (_rebuild, (self.data,))
big = Counted(np.ones(25_000_000))  # 200 MB of float64
"""


def _big_array(client: Any, distribute: Any, np: Any) -> list[str]:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(BIG_SOURCE, ns)
    size = ns["big"].data.nbytes
    rows = [
        "| run | wall | array copies received per worker | bytes received per worker | objects (read-only views) |",
        "|---|---:|---:|---:|---:|",
    ]
    previous = dict.fromkeys(client.scheduler_info()["workers"], (0, 0))
    for run in ("first", "second"):
        t = time.perf_counter()
        res = distribute("float(big.data[x])", over="x in range(1000)", namespace=ns)
        wall = time.perf_counter() - t
        assert res.ok
        loads = client.run(lambda: tuple(__import__("sys").__dict__.get("_nbcluster_bench_loads", (0, 0))))
        copies = [loads[w][0] - previous.get(w, (0, 0))[0] for w in sorted(loads)]
        views = [loads[w][1] - previous.get(w, (0, 0))[1] for w in sorted(loads)]
        previous = loads
        rows.append(
            f"| {run} | {wall:.2f} s | {', '.join(map(str, copies))} | "
            f"{', '.join(f'{c * size / 1e6:.0f} MB' for c in copies)} | {', '.join(map(str, views))} |"
        )
    return rows


if __name__ == "__main__":
    main()
