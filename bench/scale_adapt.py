"""`adapt --max N` really starting and retiring N workers, and the metrics plugin under a
sustained load, at 10, 100 and 1,000 workers (issue 22, item 3, "A thousand workers").

A SIMULATION of a big cluster: the scheduler is a real nbcluster cluster's (its supervisor
process, nbcluster's plugins, TLS), started with no worker; its new CPU workers come as
spec entries that each stand for one process hosting up to --per-process real
`distributed.Worker`s on its own loopback address (tests/sim_workers.py `group_spec`, Dask's
"group" as dask-jobqueue uses it for a job with several processes). On 2 cores they share
the CPU: what is measured is the scheduler's and the adaptive loop's side.

Per size N, in one cluster:

1. Up: `adapt(0, N)` and a backlog reported as a running `%%distribute` reports it
   (`nbcluster_backlog`: items held back, their seconds); the time until the scheduler has N
   workers and `%cluster status` (`handle.info()`) lists them, the scheduler process's CPU
   meanwhile (/proc/PID/stat), and the adaptive loop's own CPU: each `KindAdaptive.adapt`
   round timed on the scheduler (thread CPU time; a round that scales includes starting or
   closing the processes).
2. Idle: the scheduler's CPU for --window seconds with N idle workers (heartbeats), and one
   adaptive decision (target + recommendations) timed alone, median of 5.
3. The metrics plugin under load (adaptivity off, `scale(N)`): tiny tasks kept flowing at
   --rate per second with at most --outstanding unfinished (submitted as others finish, so
   a slower cluster never piles up a backlog), in --window second windows alternating with
   the plugin taken out (sampling stopped, transition hook removed) and at work with one
   view open (`nbcluster_metrics(detail=16)` 4 times a second); the scheduler's CPU in each;
   then py-spy on the scheduler for one more window: the share of its busy samples in
   nbcluster/metrics.
4. Down: `adapt(0, N)` again and the backlog withdrawn; the time until no worker is left and
   status lists none, the scheduler's CPU and the adaptive rounds meanwhile.

Run: PYTHONPATH=. python bench/scale_adapt.py [--sizes 10,100,1000] [--runs 2] [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402
from bench.scale_engine import Viewer, _plugin, _py_spy_share  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
LIMITS = {"nbcluster.limits.max-workers": 5000, "nbcluster.limits.max-threads": 5000}


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid`, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# -- on the scheduler -----------------------------------------------------------------------


def _n_workers(dask_scheduler: Any = None) -> int:
    return len(dask_scheduler.workers)


def _time_rounds(dask_scheduler: Any = None) -> int:
    """Time each round of the cluster's CPU adaptive from now on (thread CPU, wall, what it
    said), kept on the scheduler for `_rounds` to read."""
    import time as t

    cluster = dask_scheduler.handlers["nbcluster_adapt"].__self__.deployment.cluster
    adaptive = cluster._kind_adaptives[0]
    dask_scheduler.extensions["bench-rounds"] = []
    inner = adaptive.adapt

    async def timed() -> None:
        c0, w0, n0 = t.thread_time(), t.perf_counter(), len(adaptive.log)
        await inner()
        said = adaptive.log[-1][1]["status"] if len(adaptive.log) > n0 else "same"
        dask_scheduler.extensions["bench-rounds"].append((t.thread_time() - c0, t.perf_counter() - w0, said))

    # The periodic callback calls `self.adapt` by attribute each round.
    adaptive.adapt = timed
    return 0


def _rounds(dask_scheduler: Any = None) -> list[tuple[float, float, str]]:
    out: list[tuple[float, float, str]] = dask_scheduler.extensions.pop("bench-rounds", [])
    dask_scheduler.extensions["bench-rounds"] = []
    return list(out)


async def _decision(repeats: int, dask_scheduler: Any = None) -> dict[str, float]:
    """One decision of the running CPU adaptive (target, then recommendations), timed alone."""
    import time as t

    cluster = dask_scheduler.handlers["nbcluster_adapt"].__self__.deployment.cluster
    adaptive = cluster._kind_adaptives[0]
    times = []
    for _ in range(repeats):
        t0 = t.perf_counter()
        target = await adaptive.safe_target()
        await adaptive.recommendations(target)
        times.append(t.perf_counter() - t0)
    adaptive.close_counts.clear()  # what these asked must not count as rounds
    times.sort()
    return {"decision_ms": 1000 * times[len(times) // 2], "target": target}


# -- the load -------------------------------------------------------------------------------


def _inc(x: int) -> int:
    return x + 1


class Sustained:
    """Tiny tasks at `rate` a second, never more than `outstanding` unfinished: each tick
    (20 ms) submits what the clock asks for, within the room finished tasks left. A cluster
    slower than the rate gets a steady `outstanding` and no backlog (the earlier generator
    piled one up and held up everything asked of the scheduler)."""

    def __init__(self, client: Any, rate: int, outstanding: int):
        self.client, self.rate, self.cap = client, rate, outstanding
        self.submitted = self.finished = 0
        self._pending: deque[Any] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def done(self) -> int:
        """Tasks finished so far."""
        return self.finished + sum(1 for f in list(self._pending) if f.status == "finished")

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(0.02):
            while self._pending and self._pending[0].status == "finished":
                self._pending.popleft()  # released: the scheduler forgets it
                self.finished += 1
            due = int(self.rate * (time.monotonic() - t0)) - self.submitted
            n = min(due, self.cap - len(self._pending))
            if n > 0:
                self._pending.extend(self.client.map(_inc, range(self.submitted, self.submitted + n), pure=False))
                self.submitted += n

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._pending.clear()


def _others(pid: int) -> float:
    """CPU seconds of this process (the client) and of the scheduler's children (the
    simulated workers' processes): where the rest of the machine's time went."""
    import psutil

    kids = sum(sum(c.cpu_times()[:2]) for c in psutil.Process(pid).children(recursive=True))
    return sum(os.times()[:2]) + kids


def _window(pid: int, load: Sustained, seconds: float) -> tuple[float, float, float]:
    """Percent of one core the scheduler used over `seconds`, tasks finished a second, and
    percent of a core the client and the simulated workers used together."""
    c0, o0, d0, t0 = proc_cpu(pid), _others(pid), load.done(), time.perf_counter()
    time.sleep(seconds)
    dt = time.perf_counter() - t0
    return 100 * (proc_cpu(pid) - c0) / dt, (load.done() - d0) / dt, 100 * (_others(pid) - o0) / dt


def plugin_share(handle: Any, pid: int, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    client = handle.client
    out: dict[str, list[float]] = {k: [] for k in ("off_cpu", "on_cpu", "off_rate", "on_rate", "off_rest", "on_rest")}
    load = Sustained(client, args.rate, args.outstanding)
    try:
        time.sleep(2)  # the load settles
        for _ in range(args.runs):
            for on in (False, True):
                assert client.run_on_scheduler(_plugin, on) is on
                viewer = Viewer(handle) if on else None
                try:
                    cpu, rate, rest = _window(pid, load, args.window)
                finally:
                    if viewer is not None:
                        viewer.stop()
                out[("on" if on else "off") + "_cpu"].append(cpu)
                out[("on" if on else "off") + "_rate"].append(rate)
                out[("on" if on else "off") + "_rest"].append(rest)
                print("  plugin", "on" if on else "off", f"{cpu:.1f}% {rate:.0f}/s, rest {rest:.0f}%", flush=True)
        viewer = Viewer(handle)
        try:
            spy = _py_spy_share(pid, args.window, directory)
        finally:
            viewer.stop()
    finally:
        load.stop()
        client.run_on_scheduler(_plugin, True)
    return {**out, **spy}


# -- one size -------------------------------------------------------------------------------


def _until(check: Any, timeout: float) -> float:
    t0 = time.perf_counter()
    while not check():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("the cluster did not get there in time")
        time.sleep(0.05)
    return time.perf_counter() - t0


def one_size(n: int, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    import dask

    import nbcluster
    from tests.sim_workers import Backlog, use_groups

    per = min(args.per_process, n)
    groups = math.ceil(n / per)
    row: dict[str, Any] = {"workers": n, "processes": groups, "per_process": per}
    with dask.config.set(LIMITS):
        handle = nbcluster.start(workers=0, name=f"adapt{n}", runtime_dir=directory / f"rt{n}")
    try:
        client, pid = handle.client, handle.entry["supervisor_pid"]
        client.run_on_scheduler(use_groups, per, handle.entry["tls"])
        count = lambda: client.run_on_scheduler(_n_workers)  # noqa: E731
        listed = lambda: len(handle.info().data["workers"])  # noqa: E731

        # 1. up
        with dask.config.set(LIMITS):
            handle.adapt(0, n, force=True)
        client.run_on_scheduler(_time_rounds)
        c0, t0 = proc_cpu(pid), time.perf_counter()
        # Enough held-back work for N workers at Dask's 5 s target duration, twice over.
        backlog = Backlog(client, items=100 * n, seconds=10.0 * n)  # renewed as a run renews it
        _until(lambda: count() >= n, 900)
        row["up_s"], row["up_cpu_s"] = time.perf_counter() - t0, proc_cpu(pid) - c0
        _until(lambda: listed() >= n, 120)
        row["up_status_s"] = time.perf_counter() - t0
        row["up_rounds"] = client.run_on_scheduler(_rounds)
        print(n, "up", {k: v for k, v in row.items() if k != "up_rounds"}, flush=True)

        # 2. idle, and one decision with N workers
        c0 = proc_cpu(pid)
        time.sleep(args.window)
        row["idle_cpu_pct"] = 100 * (proc_cpu(pid) - c0) / args.window
        row["idle_rounds"] = client.run_on_scheduler(_rounds)
        row.update(client.run_on_scheduler(_decision, 5))

        # 3. the plugin, adaptivity off (an explicit scale keeps the N workers there)
        with dask.config.set(LIMITS):
            handle.scale(n, force=True)
        backlog.stop()
        if "plugin" in args.parts:
            row["plugin"] = plugin_share(handle, pid, args, directory)
            print(n, "plugin", row["plugin"], flush=True)

        # 4. down
        with dask.config.set(LIMITS):
            handle.adapt(0, n, force=True)
        client.run_on_scheduler(_time_rounds)
        c0, t0 = proc_cpu(pid), time.perf_counter()
        _until(lambda: count() == 0, 600)
        row["down_s"], row["down_cpu_s"] = time.perf_counter() - t0, proc_cpu(pid) - c0
        _until(lambda: listed() == 0, 120)
        row["down_status_s"] = time.perf_counter() - t0
        row["down_rounds"] = client.run_on_scheduler(_rounds)
        print(n, "down", {k: v for k, v in row.items() if k.startswith("down") and k != "down_rounds"}, flush=True)
        row["load"] = os.getloadavg()
    finally:
        handle.stop()
    return row


# -- the tables -----------------------------------------------------------------------------


def _rounds_cpu(rounds: list[list[Any]]) -> tuple[float, float, int]:
    """Total thread CPU of the rounds (s), median of the rounds that only decided (ms), count."""
    same = [r[0] for r in rounds if r[2] == "same"]
    return sum(r[0] for r in rounds), 1000 * _med(same), len(rounds)


def tables(rows: list[dict[str, Any]]) -> str:
    rows = sorted(rows, key=lambda r: r["workers"])
    loads = "; ".join(f"{r['workers']}: {r['load'][0]:.1f}" for r in rows)
    out = [
        "A real nbcluster scheduler (supervisor process, nbcluster's plugins, TLS) started with no "
        "worker; adaptivity and `scale` start its workers as spec entries that are each one process "
        "hosting up to 125 SIMULATED workers (real `distributed.Worker`s, one thread each) on its own "
        "loopback address (tests/sim_workers.py `group_spec`: Dask's spec \"group\"). On 2 cores the "
        f"simulated workers share the CPU. 1-minute load average at the end of each size: {loads}.",
        "",
        "**`adapt(0, N)` with a `%%distribute` backlog reported (`nbcluster_backlog`), then withdrawn** "
        "(scheduler CPU: the supervisor process from /proc; adaptive rounds: each `KindAdaptive.adapt` "
        "timed on the scheduler in thread CPU, a round that scales includes starting or closing "
        "processes; a decision: target + recommendations with N workers, median of 5):",
        "",
        "| workers (processes) | up: scheduler has all, s | status lists all, s | scheduler CPU up, s "
        "| adaptive rounds up: CPU s (rounds) | down: none left, s | status lists none, s "
        "| scheduler CPU down, s | adaptive rounds down: CPU s (rounds) | one decision at N, ms "
        "| a deciding round at N, ms | scheduler idle at N, % of a core |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        up, down, idle = _rounds_cpu(r["up_rounds"]), _rounds_cpu(r["down_rounds"]), _rounds_cpu(r["idle_rounds"])
        out.append(
            f"| {r['workers']} ({r['processes']}) | {r['up_s']:.2f} | {r['up_status_s']:.2f} | {r['up_cpu_s']:.2f} "
            f"| {up[0]:.3f} ({up[2]}) | {r['down_s']:.2f} | {r['down_status_s']:.2f} | {r['down_cpu_s']:.2f} "
            f"| {down[0]:.3f} ({down[2]}) | {r['decision_ms']:.2f} | {idle[1]:.2f} | {r['idle_cpu_pct']:.1f} |"
        )
    plug = [r for r in rows if "plugin" in r]
    if plug:
        p0 = plug[0]["plugin"]
        out += [
            "",
            f"**The metrics plugin's share of the scheduler's CPU** under tiny tasks kept flowing (asked: "
            f"{ARGS.rate}/s, at most {ARGS.outstanding} unfinished), {ARGS.window:g} s windows, "
            f"{len(p0['on_cpu'])} of each, alternating: plugin out (sampling stopped, transition hook removed) "
            "and plugin at work with one view open (4 polls/s of `detail=16`); then py-spy on the scheduler "
            "for one more window with the plugin (200 samples/s, busy samples only):",
            "",
            "| workers | tasks/s done: off / on | scheduler CPU, % of a core: off / on (medians) | on - off, % of "
            "the scheduler's CPU | windows, off / on (%) | client + simulated workers, % of a core "
            "| py-spy: nbcluster/metrics | py-spy: any nbcluster |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in plug:
            p = r["plugin"]
            on, off = _med(p["on_cpu"]), _med(p["off_cpu"])
            pairs = ", ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(p["off_cpu"], p["on_cpu"], strict=True))
            out.append(
                f"| {r['workers']} | {_med(p['off_rate']):.0f} / {_med(p['on_rate']):.0f} | {off:.1f} / {on:.1f} "
                f"| {100 * (on - off) / on:+.1f}% | {pairs} | {_med(p['off_rest'] + p['on_rest']):.0f} "
                f"| {p['spy_metrics_pct']:.1f}% of {p['spy_samples']} "
                f"| {p['spy_nbcluster_pct']:.1f}% |"
            )
    out += ["", *growth(rows)]
    return "\n".join(out)


def growth(rows: list[dict[str, Any]]) -> list[str]:
    """Each figure at every size, and its cost per added worker from the smallest to the largest."""
    figures: list[tuple[str, Any]] = [
        ("up: time to all (s)", lambda r: r["up_s"]),
        ("up: scheduler CPU (s)", lambda r: r["up_cpu_s"]),
        ("up: adaptive rounds' CPU (s)", lambda r: _rounds_cpu(r["up_rounds"])[0]),
        ("down: time to none (s)", lambda r: r["down_s"]),
        ("down: scheduler CPU (s)", lambda r: r["down_cpu_s"]),
        ("one adaptive decision (ms)", lambda r: r["decision_ms"]),
        ("scheduler idle (% of a core)", lambda r: r["idle_cpu_pct"]),
        ("plugin: py-spy share of the scheduler (%)", lambda r: r["plugin"]["spy_metrics_pct"]),
        ("plugin: on - off, % of the scheduler's CPU",
         lambda r: 100 * (_med(r["plugin"]["on_cpu"]) - _med(r["plugin"]["off_cpu"])) / _med(r["plugin"]["on_cpu"])),
    ]  # fmt: skip
    sizes = [r["workers"] for r in rows]
    out = ["**Growth** (per added worker: the slope from the smallest to the largest size):", "",
           "| figure | " + " | ".join(f"at {s}" for s in sizes) + " | per added worker |",
           "|---" * (len(sizes) + 2) + "|"]  # fmt: skip
    for name, value in figures:
        try:
            vs = [value(r) for r in rows]
        except KeyError:
            continue
        slope = (vs[-1] - vs[0]) / (sizes[-1] - sizes[0]) if len(rows) > 1 else float("nan")
        out.append(f"| {name} | " + " | ".join(f"{v:.3g}" for v in vs) + f" | {slope:+.3g} |")
    return out


ARGS = argparse.Namespace()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--runs", type=int, default=2, help="plugin windows of each kind")
    parser.add_argument("--per-process", type=int, default=125)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--outstanding", type=int, default=500)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--parts", default="adapt,plugin")
    parser.add_argument("--json", help="write the raw rows here as each size ends")
    parser.add_argument("--tables", help="instead of measuring: the tables of this --json file")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(namespace=ARGS)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    rows: list[dict[str, Any]] = []
    if args.tables:
        rows = json.loads(Path(args.tables).read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for n in [int(s) for s in args.sizes.split(",")]:
                rows.append(one_size(n, args, Path(tmp)))
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    body = tables(rows)
    print(body)
    if args.write:
        write_section("scale: adapt and the plugin at 1,000", "PYTHONPATH=. /work/main/.venv/bin/python "
                      "bench/scale_adapt.py " + " ".join(sys.argv[1:]), body)  # fmt: skip


if __name__ == "__main__":
    main()
