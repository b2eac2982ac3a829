"""The metrics plugin's share of the scheduler's CPU at 1,000 workers under ~1,000 tasks/s
(issue 22: at most 5%), with LIGHT SIMULATED workers.

A real nbcluster scheduler (its supervisor process, nbcluster's plugins, TLS) with N
workers that are a SIMULATION: `tests/sim_light.py`, N `LightWorker`s in one process
speaking Dask's real scheduler protocol over real TLS comms (register, heartbeat on the
scheduler's interval, answer each ``compute-task`` at once with ``task-finished``). The
scheduler does its real per-task and per-worker work; the simulated workers run nothing and
cost little, which is what lets a 2-core machine reach 1,000 tasks/s at 1,000 workers (the
real `distributed.Worker`s of tests/sim_workers.py reached 60/s: `## scale: adapt and the
plugin at 1,000`).

1. Under load: tiny tasks kept flowing (--rate a second, at most --outstanding
   unfinished; results released unread), in --window second windows alternating between the
   plugin taken out (sampling stopped, transition hook removed) and the plugin at work with
   --views open views (each `nbcluster_metrics(since, detail=16)` 4 times a second); the
   scheduler process's CPU in each (/proc), tasks finished a second; then py-spy on the
   scheduler for one more window with the plugin at work: its share of the busy samples.
2. Old code against new, on the same scheduler under the same load: the plugin as it was
   before (--old, a git revision: its `plugin.py` loaded into the scheduler process) and as
   it is, each timed on the scheduler's event loop (thread CPU): a sampling round every
   0.5 s, a `detail=16` answer every 0.25 s, called back to back, alternating which first.

Run: PYTHONPATH=. python bench/plugin_scale.py [--workers 1000] [--rate 1000] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402
from bench.scale_adapt import LIMITS, Sustained, proc_cpu  # noqa: E402
from bench.scale_engine import IDLE, Viewer, _plugin, _py_spy_share  # noqa: E402


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class LightProcess:
    """The process of light simulated workers (tests/sim_light.py); counts their tasks."""

    def __init__(self, address: str, tls: Any, count: int, hosts: int):
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        argv = [
            sys.executable,
            "-m",
            "tests.sim_light",
            address,
            json.dumps(tls),
            str(count),
            str(hosts),
            "light",
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=env)  # fmt: skip
        self.ready = threading.Event()
        self.done = self.beats = self.failed_beats = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                self.ready.set()
            elif line.startswith("done "):
                words = line.split()
                self.done, self.beats, self.failed_beats = int(words[1]), int(words[3]), int(words[5])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def plugin_share(path: Path) -> dict[str, float]:
    """`scale_engine.spy_shares` of py-spy's raw stacks, counting the old plugin too: py-spy
    names the frames of code loaded from a string by its bare file name, ``(plugin.py:N)``."""
    total = plugin = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or any(idle in frames[-1] for idle in IDLE):
            continue
        total += int(count)
        loop = [k for k, f in enumerate(frames) if "asyncio/" in f]
        called = ";".join(frames[loop[-1] + 1 :] if loop else frames)
        if "nbcluster/metrics/" in called or "(plugin.py:" in called:
            plugin += int(count)
    return {"spy_plugin_pct": 100 * plugin / max(total, 1), "spy_samples": total}


# -- on the scheduler -----------------------------------------------------------------------


def _n_workers(dask_scheduler: Any = None) -> int:
    return len(dask_scheduler.workers)


async def _use(code: str, old_source: str, dask_scheduler: Any = None) -> str:
    """Serve and record with the plugin code `code` ("old": `old_source` loaded here, "new":
    the one installed), the other one's sampling stopped. Its file name keeps
    ``nbcluster/metrics/`` so that py-spy counts it as the plugin."""
    import types

    codes = dask_scheduler.extensions.setdefault("bench-codes", {})
    current = dask_scheduler.plugins["nbcluster-metrics"]
    codes.setdefault("new", current)
    if code == "old" and "old" not in codes:
        module = types.ModuleType("nbcluster_old_plugin")
        exec(compile(old_source, "old/nbcluster/metrics/plugin.py", "exec"), module.__dict__)
        codes["old"] = module.MetricsPlugin()
    target = codes[code]
    if target is not current:
        current._callback.stop()
        dask_scheduler.plugins["nbcluster-metrics"] = target
        if target._callback is None:
            await target.start(dask_scheduler)
        else:
            dask_scheduler.handlers["nbcluster_metrics"] = target.nbcluster_metrics
            target._callback.start()
    return code


async def _old_against_new(old_source: str, seconds: float, dask_scheduler: Any = None) -> dict[str, Any]:
    """With the running plugin taken out: the old plugin code and the new, each timed on the
    event loop (thread CPU) for a sampling round every 0.5 s and a detail=16 answer every
    0.25 s, over the same workers and heartbeats, back to back, alternating which first."""
    import asyncio
    import time as t
    import types

    new = dask_scheduler.extensions["bench-stash"]["plugin"]  # taken out by `_plugin(False)`
    module = types.ModuleType("nbcluster_old_plugin")
    exec(compile(old_source, "old/plugin.py", "exec"), module.__dict__)
    old = module.MetricsPlugin(sample_interval=0.5)
    old._scheduler = dask_scheduler
    plugins = {"old": old, "new": new}
    cursors: dict[str, Any] = {}
    for name, p in plugins.items():
        p.sample()
        cursors[name] = p.nbcluster_metrics(detail=16)["cursor"]
    out: dict[str, list[float]] = {f"{k}_{n}": [] for k in ("round", "answer") for n in plugins}
    news: dict[str, list[int]] = {n: [] for n in plugins}
    end, tick = t.monotonic() + seconds, 0
    while t.monotonic() < end:
        await asyncio.sleep(0.25)
        tick += 1
        order = list(plugins) if tick % 2 else list(reversed(plugins))
        for name in order:
            p = plugins[name]
            if tick % 2 == 0:
                n0 = p._next
                c0 = t.thread_time()
                p.sample()
                out[f"round_{name}"].append(t.thread_time() - c0)
                news[name].append(p._next - n0)
            c0 = t.thread_time()
            cursors[name] = p.nbcluster_metrics(since=cursors[name], detail=16)["cursor"]
            out[f"answer_{name}"].append(t.thread_time() - c0)
    return {**out, "news": news, "workers": len(dask_scheduler.workers)}


# -- the bench ------------------------------------------------------------------------------


def _window(pid: int, sim: int, load: Sustained, seconds: float) -> dict[str, float]:
    """Percent of a core used by the scheduler, by the simulated workers and by this process
    (the client), and the tasks finished a second, over `seconds`."""
    c0, s0, o0, d0, t0 = proc_cpu(pid), proc_cpu(sim), sum(os.times()[:2]), load.done(), time.perf_counter()
    time.sleep(seconds)
    dt = time.perf_counter() - t0
    return {"cpu": 100 * (proc_cpu(pid) - c0) / dt, "rate": (load.done() - d0) / dt,
            "sim": 100 * (proc_cpu(sim) - s0) / dt, "client": 100 * (sum(os.times()[:2]) - o0) / dt}  # fmt: skip


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    import dask

    import nbcluster

    old_source = subprocess.run(["git", "show", f"{args.old}:nbcluster/metrics/plugin.py"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
    with dask.config.set(LIMITS):
        handle = nbcluster.start(workers=0, name="pluginscale", runtime_dir=directory / "rt")
    sim: LightProcess | None = None
    row: dict[str, Any] = {"workers": args.workers, "hosts": args.hosts, "views": args.views}
    try:
        client, pid = handle.client, handle.entry["supervisor_pid"]
        sim = LightProcess(client.scheduler.address, handle.entry["tls"], args.workers, args.hosts)
        t0 = time.perf_counter()
        if not sim.ready.wait(600):
            raise RuntimeError("the simulated workers did not join")
        while client.run_on_scheduler(_n_workers) < args.workers:
            time.sleep(0.2)
        row["join_s"] = time.perf_counter() - t0
        print(f"{args.workers} light workers joined in {row['join_s']:.1f} s", flush=True)
        time.sleep(5)  # heartbeats spread out
        load = Sustained(client, args.rate, args.outstanding)
        b0, tb = sim.beats, time.perf_counter()
        windows: dict[str, list[dict[str, float]]] = {"off": [], "old": [], "new": []}
        try:
            time.sleep(3)  # the load settles
            for _ in range(args.runs):
                for kind in ("off", "old", "new"):
                    assert client.run_on_scheduler(_plugin, kind != "off") is (kind != "off")
                    if kind != "off":
                        client.run_on_scheduler(_use, kind, old_source)
                    viewers = [Viewer(handle) for _ in range(args.views)] if kind != "off" else []
                    try:
                        # A new view's first answer holds all the rings do: not part of the window.
                        time.sleep(0.6)
                        w = _window(pid, sim.proc.pid, load, args.window)
                    finally:
                        for v in viewers:
                            v.stop()
                    windows[kind].append(w)
                    print("  plugin", kind, {k: round(v, 1) for k, v in w.items()}, flush=True)
            for kind in ("old", "new"):
                client.run_on_scheduler(_use, kind, old_source)
                viewers = [Viewer(handle) for _ in range(args.views)]
                try:
                    time.sleep(0.6)
                    row[f"spy_{kind}"] = _py_spy_share(pid, args.window, directory)
                    row[f"spy_{kind}"].update(plugin_share(Path(row[f"spy_{kind}"]["spy_file"])))
                    if args.spy_dir:  # the raw stacks, to read after the run
                        kept = Path(args.spy_dir) / f"spy-{kind}-{int(time.time())}.txt"
                        kept.write_text(Path(row[f"spy_{kind}"]["spy_file"]).read_text())
                        row[f"spy_{kind}"]["spy_file"] = str(kept)
                finally:
                    for v in viewers:
                        v.stop()
                print("  py-spy", kind, row[f"spy_{kind}"], flush=True)
            assert client.run_on_scheduler(_plugin, False) is False
            try:
                row["old_new"] = client.run_on_scheduler(_old_against_new, old_source, args.compare)
            finally:
                client.run_on_scheduler(_plugin, True)
        finally:
            load.stop()
        row["beats_s"] = (sim.beats - b0) / (time.perf_counter() - tb)
        row["failed_beats"] = sim.failed_beats
        row["windows"] = windows
        row["load"] = os.getloadavg()
    finally:
        if sim is not None:
            sim.close()
        handle.stop()
    return row


def tables(row: dict[str, Any], args: argparse.Namespace) -> str:
    w = row["windows"]
    med = {kind: {k: _med([x[k] for x in w[kind]]) for k in ("cpu", "rate", "sim", "client")} for kind in w}
    off = med["off"]
    lines = [
        f"A real nbcluster scheduler (supervisor process, nbcluster's plugins, TLS) with {row['workers']} "
        f'LIGHT SIMULATED workers on {row["hosts"]} loopback "hosts" (tests/sim_light.py: one process, Dask\'s '
        "real scheduler protocol over real TLS comms, each task answered `task-finished` at once, nothing "
        f"run; joined in {row['join_s']:.0f} s). Load: tiny tasks at {args.rate}/s asked, at most "
        f"{args.outstanding} unfinished, results released unread. {args.window:g} s windows, {args.runs} of "
        "each kind, in turn: plugin out (sampling stopped, transition hook removed) / the old plugin "
        f"(`{args.old}`'s plugin.py loaded into the scheduler in its place) / the new one, each at work with "
        f"{row['views']} open view(s) (`nbcluster_metrics(detail=16)` 4 times a second each, the view's first "
        "answer before the window); then py-spy on the scheduler for one more window with each (200 "
        f"samples/s, busy samples only). Heartbeats answered: {row['beats_s']:.0f}/s "
        f"({row['failed_beats']} failed). 1-minute load average at the end: {row['load'][0]:.1f}.",
        "",
        "| plugin | tasks/s done (median) | scheduler CPU, % of a core (median) | - out, % of the scheduler's CPU "
        "| windows (%) | simulated workers / client, % of a core | py-spy: the plugin "
        "| scheduler CPU per task, ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("off", "old", "new"):
        m = med[kind]
        spy = row.get(f"spy_{kind}")
        share = f"{spy['spy_plugin_pct']:.1f}% of {spy['spy_samples']}" if spy else "-"
        diff = f"{100 * (m['cpu'] - off['cpu']) / m['cpu']:+.1f}%" if kind != "off" else "-"
        each = ", ".join(f"{x['cpu']:.0f}" for x in w[kind])
        lines.append(
            f"| {dict(off='out', old='old', new='new')[kind]} | {m['rate']:.0f} | {m['cpu']:.1f} | {diff} "
            f"| {each} | {m['sim']:.0f} / {m['client']:.0f} | {share} "
            f"| {10 * m['cpu'] / m['rate']:.3f} |"
        )
    on = med["new"]
    o = row["old_new"]
    per = {k: 1000 * _med(v) for k, v in o.items() if k.startswith(("round_", "answer_"))}
    news = {n: _med([float(x) for x in v]) for n, v in o["news"].items()}
    # Per second: two rounds, and four answers per open view.
    per_s = {n: 2 * per[f"round_{n}"] + 4 * row["views"] * per[f"answer_{n}"] for n in ("old", "new")}
    lines += [
        "",
        f"**Old code against new** on the same scheduler, {o['workers']} workers, under the same load (plugin "
        f"out meanwhile; `{args.old}`'s plugin.py loaded into the scheduler beside the new one; each call timed "
        f"in thread CPU on the event loop, back to back, alternating which first, for {args.compare:g} s; "
        "medians):",
        "",
        "| code | sampling round, ms (records it made) | detail=16 answer, ms | per second: 2 rounds + "
        f"{4 * row['views']} answers, ms = % of a core | that, as % of the scheduler's CPU under load (on) |",
        "|---|---|---|---|---|",
    ]
    for n in ("old", "new"):
        lines.append(
            f"| {n} | {per[f'round_{n}']:.3f} ({news[n]:.0f}) | {per[f'answer_{n}']:.3f} "
            f"| {per_s[n]:.2f} = {per_s[n] / 10:.3f}% | {per_s[n] / 10 / on['cpu'] * 100:.2f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--outstanding", type=int, default=500)
    ap.add_argument("--views", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3, help="plugin windows of each kind")
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--compare", type=float, default=10.0, help="seconds of old-against-new timing")
    ap.add_argument("--old", default="29642cf", help="the git revision of the old plugin")
    ap.add_argument("--json", help="write the raw row here")
    ap.add_argument("--spy-dir", help="keep py-spy's raw stacks here")
    ap.add_argument("--tables", help="instead of measuring: the tables of this --json file")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    if args.tables:
        row = json.loads(Path(args.tables).read_text())
        for kind in ("old", "new"):
            spy = row.get(f"spy_{kind}")
            if spy and "spy_plugin_pct" not in spy and Path(spy["spy_file"]).exists():
                spy.update(plugin_share(Path(spy["spy_file"])))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(args, Path(tmp))
        if args.json:
            Path(args.json).write_text(json.dumps(row, indent=1, default=str))
    body = tables(row, args)
    print(body)
    if args.write:
        write_section("metrics plugin at 1,000 light workers", "PYTHONPATH=. /work/main/.venv/bin/python "
                      "bench/plugin_scale.py " + " ".join(sys.argv[1:]), body)  # fmt: skip


if __name__ == "__main__":
    main()
