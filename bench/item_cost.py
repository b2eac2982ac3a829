"""Per-item cost of tiny items (`x + 1`), one checkout against another, in turns.

    .venv/bin/python bench/item_cost.py --trees /tmp/old-checkout . [--rounds 3] [--repeats 5]

Each round runs every tree once, in order, in a fresh process with that tree first on
`PYTHONPATH` (the workers it starts inherit it), so drift in the machine's load hits them
alike. A process measures, each a median over `--repeats`:

- `worker`: `run_items` + `dump_result` of a 10,000-item batch in this process (the worker's
  share), per item, for a one-expression cell and for a function;
- `kernel`: unpickling that result blob and `RunState.deliver` (the kernel's share), and
  `kernel+read` the same with every value read back;
- `magic 20k`, `magic 1M`, `fn 1M`: wall time per item on a 2-worker x 1-thread cluster,
  through a real IPython shell's `%%distribute` and through `distribute(fn)`, the results
  kept (`fn 1M + values()`: and every value read as a list), and for the 1M runs the kernel's peak RSS growth (one run each, after the timed ones).

The last lines print each tree's medians over the rounds and the ratio to the first tree.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from typing import Any

BATCH = 10_000


def inc(x: int) -> int:
    return x + 1


def _median_time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _in_process(repeats: int) -> dict[str, float]:
    import cloudpickle

    from nbcluster.run.cell import Cell
    from nbcluster.run.state import RunState
    from nbcluster.worker import Context, dump_result, install, run_items

    install()
    cell = Cell.parse("x + 1", filename="<bench-cell>")
    spec = {"kind": "cell", "mode": "over", "names": ("x",), "target": "x", "unpacks": False,
            "seed": None, "large": [], "filename": cell.filename,
            "source": cell.source, "body": cell.body, "last": cell.last}  # fmt: skip
    contexts = {"cell": Context(spec, {"__name__": "__main__"}),
                "fn": Context({**spec, "kind": "function", "fn": inc}, {"__name__": "__main__"})}  # fmt: skip
    items = list(range(BATCH))
    out: dict[str, float] = {}
    for label, context in contexts.items():
        blob = b""

        def work(context: Any = context) -> None:
            nonlocal blob
            blob = dump_result(run_items(context, range(BATCH), items, capture=True, token="bench"))

        out[f"worker {label}"] = _median_time(work, repeats) / BATCH * 1e6

        def kernel(blob: bytes = blob, read: bool = False) -> None:
            data = cloudpickle.loads(blob)
            values = data["values"]
            if isinstance(values, bytes):  # builtin data, pickled by the worker as one list
                values = pickle.loads(values)
            state = RunState(BATCH)
            state.deliver(range(BATCH), values, data["errors"], data["outputs"])
            if read:
                list(state.values)

        out[f"kernel {label}"] = _median_time(kernel, repeats) / BATCH * 1e6
        out[f"kernel+read {label}"] = _median_time(lambda: kernel(read=True), repeats) / BATCH * 1e6
    return out


def _cluster(repeats: int) -> dict[str, float]:
    from IPython.core.interactiveshell import InteractiveShell
    from overhead import peak_growth  # bench/, this script's folder

    import nbcluster
    from nbcluster.run.api import distribute

    handle = nbcluster.start(workers=2, threads=1, name="bench-item-cost")
    try:
        handle.client.wait_for_workers(2)
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "nbcluster")

        def magic(n: int) -> Any:
            result = ip.run_cell(f'%%distribute --over "x in range({n})" --into r\nx + 1')
            assert result.success, result.error_in_exec
            return ip.user_ns.pop("r")

        def fn(n: int) -> Any:
            return distribute(inc, over=range(n))

        assert magic(1000).ok and fn(1000).ok  # warm: imports, connections, worker caches
        out = {"magic 20k": _median_time(lambda: magic(20_000), repeats) / 20_000 * 1e6}
        out["magic 1M"] = _median_time(lambda: magic(1_000_000), max(repeats // 2, 1)) / 1e6 * 1e6
        out["fn 1M"] = _median_time(lambda: fn(1_000_000), max(repeats // 2, 1)) / 1e6 * 1e6
        # The same, and every value read as a list (what ipyparallel's map_sync returns).
        out["fn 1M + values()"] = _median_time(lambda: fn(1_000_000).values(), max(repeats // 2, 1)) / 1e6 * 1e6
        for label, run in (("magic 1M", magic), ("fn 1M", fn)):
            ip.displayhook.flush()
            _, grown, kept = peak_growth(lambda run=run: run(1_000_000))
            assert kept.ok
            del kept
            out[f"{label} RSS MB"] = grown / 1e6
        return out
    finally:
        handle.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=["."], help="checkouts to compare; the first is the base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: this tree only
    parser.add_argument("--no-cluster", action="store_true", help="only the in-process measurements")
    args = parser.parse_args()
    if args.one:
        out = _in_process(args.repeats)
        if not args.no_cluster:
            out.update(_cluster(args.repeats))
        print(json.dumps(out))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.trees}
    for round_ in range(args.rounds):
        for tree in args.trees:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(tree), here])}
            command = [sys.executable, os.path.join(here, "item_cost.py"), "--one", "--repeats", str(args.repeats)]
            if args.no_cluster:
                command.append("--no-cluster")
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1} {tree}: {runs[tree][-1]}", flush=True)
    base = args.trees[0]
    print(f"medians over {args.rounds} rounds (us per item; MB), ratio to {base}:")
    for key in runs[base][0]:
        cells = []
        for tree in args.trees:
            value = statistics.median(r[key] for r in runs[tree])
            ratio = value / statistics.median(r[key] for r in runs[base])
            cells.append(f"{tree}: {value:.3f} ({ratio:.2f}x)")
        print(f"  {key:16} " + "  ".join(cells))


if __name__ == "__main__":
    main()
