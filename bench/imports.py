"""What `import nbcluster` costs, in a kernel and on a worker.

    .venv/bin/python bench/imports.py [--runs 10] [--compare PATH] [--write]

Per checkout (this one, and with `--compare PATH` an earlier one, measured in the same run):

- **fresh import**: the median wall time of `--runs` fresh `python -c "import nbcluster"`
  processes, interleaved with `python -c "import dask"` (the peer: what any Dask user pays)
  and `python -c pass` (the interpreter alone); the ratio is nbcluster's over dask's;
- **-X importtime**: the cumulative time of the `nbcluster` package in one
  `python -X importtime -c "import nbcluster"` (the median of `--runs`), and how many
  modules (and nbcluster modules) that one import loads;
- **worker**: a 2-worker cluster runs a `%%distribute` cell of 200 items and an
  `--everywhere` cell; then each worker reports its RSS, how many modules it has loaded and
  how many of them are nbcluster's (the median over the workers).

`--write` replaces the `## imports` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_section  # bench/, the script's own folder

PEERS = {"nbcluster": "import nbcluster", "dask": "import dask", "python": "pass"}


def env_for(checkout: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(checkout)}


def fresh_imports(checkout: Path, runs: int) -> dict[str, list[float]]:
    """Wall seconds of fresh processes for each peer, interleaved round-robin."""
    times: dict[str, list[float]] = {name: [] for name in PEERS}
    env = env_for(checkout)
    for _ in range(runs):
        for name, code in PEERS.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, cwd=checkout, check=True)
            times[name].append(time.perf_counter() - start)
    return times


def importtime(checkout: Path, runs: int) -> dict[str, float]:
    """`-X importtime` of `import nbcluster`: its cumulative ms, modules loaded (medians)."""
    cumulative, modules, ours = [], [], []
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import nbcluster"],
            env=env_for(checkout), cwd=checkout, capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
        rows = [m.groups() for m in re.finditer(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", err)]
        top = [int(cum) for _, cum, indent, name in rows if name == "nbcluster" and len(indent) == 1]
        cumulative.append(top[-1] / 1000)
        modules.append(len(rows))
        ours.append(sum(1 for *_, name in rows if name.startswith("nbcluster")))
    return {
        "ms": statistics.median(cumulative),
        "modules": statistics.median(modules),
        "nbcluster_modules": statistics.median(ours),
    }


def worker_child() -> None:
    """In a child process run from the checkout: a cluster, two cells, the workers' state."""
    os.environ.setdefault("NBCLUSTER_RUNTIME_DIR", tempfile.mkdtemp(prefix="nbcluster-bench-"))
    import nbcluster
    from nbcluster.run.api import distribute, everywhere

    handle = nbcluster.start(workers=2, threads=1, name=f"bench-imports-{os.getpid()}")
    try:
        handle.client.wait_for_workers(2)
        distribute("print(x)\nx * 2", over="x in range(200)", namespace={})
        everywhere("import os\nos.getpid()", namespace={})

        def state() -> dict[str, int]:
            import psutil

            return {
                "rss": psutil.Process().memory_info().rss,
                "modules": len(sys.modules),
                "nbcluster_modules": sum(1 for m in sys.modules if m.startswith("nbcluster")),
            }

        print(json.dumps(list(handle.client.run(state).values())))
    finally:
        handle.stop()


def worker_state(checkout: Path) -> dict[str, float]:
    child = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child"],
        env=env_for(checkout), cwd=checkout, capture_output=True, text=True, check=True,
    )  # fmt: skip
    workers = json.loads(child.stdout.strip().splitlines()[-1])
    return {k: statistics.median(w[k] for w in workers) for k in ("rss", "modules", "nbcluster_modules")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--compare", help="another nbcluster checkout to measure the same way")
    parser.add_argument("--write", action="store_true", help="update ## imports in bench/RESULTS.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        worker_child()
        return
    here = Path(__file__).resolve().parent.parent
    checkouts = {"this checkout": here}
    if args.compare:
        checkouts = {args.compare: Path(args.compare).resolve(), **checkouts}
    fresh = {label: fresh_imports(path, args.runs) for label, path in checkouts.items()}
    timed = {label: importtime(path, args.runs) for label, path in checkouts.items()}
    workers = {label: worker_state(path) for label, path in checkouts.items()}
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end); medians of {args.runs} fresh processes each.",
        "",
        "| checkout | `import nbcluster` | `import dask` | `python -c pass` | nbcluster / dask "
        "| -X importtime nbcluster | modules loaded (nbcluster's) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label in checkouts:
        med = {name: statistics.median(t) * 1000 for name, t in fresh[label].items()}
        t = timed[label]
        lines.append(
            f"| {label} | {med['nbcluster']:.0f} ms | {med['dask']:.0f} ms | {med['python']:.0f} ms "
            f"| {med['nbcluster'] / med['dask']:.2f} | {t['ms']:.0f} ms "
            f"| {t['modules']:.0f} ({t['nbcluster_modules']:.0f}) |"
        )
    lines += [
        "",
        "A worker of a 2-worker cluster after a 200-item `%%distribute` cell and an `--everywhere` cell"
        " (median over the workers):",
        "",
        "| checkout | worker RSS | modules loaded | nbcluster modules |",
        "|---|---:|---:|---:|",
    ]
    for label in checkouts:
        w = workers[label]
        lines.append(f"| {label} | {w['rss'] / 2**20:.0f} MiB | {w['modules']:.0f} | {w['nbcluster_modules']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("imports", "python bench/imports.py " + " ".join(sys.argv[1:]), text)


if __name__ == "__main__":
    main()
