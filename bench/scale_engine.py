"""The engine at scale: joining and leaving, `%%distribute`, the metrics plugin under load and
adaptivity's decision at 10, 100 and 1,000 workers (issue "The scale envelope", item 3).

Every cluster here is a real nbcluster cluster (its own supervisor process hosting the
scheduler and nbcluster's plugins, over TLS) with 1 real worker, and N-1 SIMULATED
workers: real `distributed.Worker`s hosted up to 125 to a process, each process on its
own loopback address (tests/sim_workers.py). On 2 cores they share the CPU: what is
measured is the scheduler's and the kernel's side, not the workers' speed. Four parts:

1. Joining and leaving: the time from starting N-1 simulated workers to the scheduler
   counting all of them, then to `%cluster status` (`handle.info()`) listing them, and from
   closing them to all gone (and status listing 1); with the scheduler process's CPU time
   meanwhile (psutil). Peer: the same workers joining a plain `distributed.LocalCluster`
   scheduler (TLS, no nbcluster plugin) in a process of its own, alternating with
   nbcluster's in the same run.
2. `%%distribute` of --items items through a real IPython shell (tiny: ``x + 1``; and
   ``time.sleep(0.001)``, 1 ms that a simulated worker spends waiting, not computing, so
   that 1,000 of them can run at once on 2 cores): wall time, per item, the kernel's CPU
   (this process's, the client's event loop included) and the Dask tasks the engine made.
   Peer: `client.map` over the same items cut by hand into that many tasks, gathered.
3. The metrics plugin under load: tiny tasks submitted on the clock at --rate per second
   for --window seconds, the scheduler process's CPU (psutil) with the plugin at work and
   one view open (`nbcluster_metrics(since, detail=16)` 4 times a second, as the widget
   and the sidebar poll) against the same load with the plugin taken out (its sampling
   stopped and its transition hook removed, on the same scheduler), windows alternating;
   and py-spy on the scheduler during one more window with the plugin: the share of its
   samples in nbcluster/metrics.
4. Adaptivity: the cost of one decision of nbcluster's adaptive (`KindAdaptive`, as
   `adapt --max 1000` makes it: its target, then its recommendations) on the scheduler
   with N workers and a %%distribute backlog of 100,000 items reported. Not measured:
   adapt actually starting or retiring workers at this scale (simulated workers cannot be
   started by adapt's `scale_up` here; bench/scale_adapt.py measures that with simulated
   workers the cluster starts itself, as spec entries of a process each).

Run: /work/venv/bin/python bench/scale_engine.py [--sizes 10,100,1000] [--runs 3]
     [--items 100000] [--rate 1000] [--window 8] [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402

PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # installed beside this Python
PER_PROCESS = 125  # simulated workers per process


def _counts(simulated: int) -> list[int]:
    """Simulated workers per process: at most PER_PROCESS each, spread evenly."""
    processes = max(1, math.ceil(simulated / PER_PROCESS))
    return [simulated // processes + (1 if k < simulated % processes else 0) for k in range(processes)]


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _n_workers(dask_scheduler: Any = None) -> int:
    return len(dask_scheduler.workers)


# -- the peer: a plain LocalCluster scheduler in its own process -----------------------------


PEER = """
import json, sys
from distributed import LocalCluster
from nbcluster.cluster.credentials import security_from
cluster = LocalCluster(n_workers=0, protocol="tls", host="127.0.0.1", scheduler_port=0,
                       dashboard_address=None, security=security_from(json.loads(sys.argv[1])))
print(cluster.scheduler_address, flush=True)
sys.stdin.read()
cluster.close()
"""


class Peer:
    """A plain `distributed.LocalCluster` (no worker of its own, no nbcluster plugin) in a
    process of its own, with TLS credentials made as nbcluster makes a cluster's."""

    def __init__(self, directory: Path):
        from distributed import Client

        from nbcluster.cluster.credentials import write_credentials

        self.security, self.tls = write_credentials(directory, "peer")
        self.proc = subprocess.Popen([sys.executable, "-c", PEER, json.dumps(self.tls)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        self.process = psutil.Process(self.proc.pid)
        self.client = Client(self.address, security=self.security, timeout=60)

    def close(self) -> None:
        self.client.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# -- 1. joining and leaving -----------------------------------------------------------------


def _until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not get there in time")
        time.sleep(0.02)


def join_leave(
    address: str, tls: Any, client: Any, process: psutil.Process, simulated: int, base: int,
    status: Callable[[], int] | None,
) -> dict[str, float]:  # fmt: skip
    """Start `simulated` workers, time them joining, then leaving (see the module docstring)."""
    from tests.scale_helpers import Simulated

    out: dict[str, float] = {}
    cpu0, t0 = _cpu(process), time.perf_counter()
    group = Simulated(address, tls, _counts(simulated), prefix="j")
    try:
        _until(lambda: client.run_on_scheduler(_n_workers) >= base + simulated, 600)
        out["join_s"] = time.perf_counter() - t0
        out["join_cpu_s"] = _cpu(process) - cpu0
        if status is not None:
            _until(lambda: status() == base + simulated, 60)
            out["join_status_s"] = time.perf_counter() - t0
        group.wait_ready(60)
    finally:
        cpu0, t0 = _cpu(process), time.perf_counter()
        group.close()
    _until(lambda: client.run_on_scheduler(_n_workers) <= base, 120)
    out["leave_s"] = time.perf_counter() - t0
    out["leave_cpu_s"] = _cpu(process) - cpu0
    if status is not None:
        _until(lambda: status() == base, 60)
        out["leave_status_s"] = time.perf_counter() - t0
    group.wait_closed()
    return out


# -- 2. %%distribute -----------------------------------------------------------------------


def _tasks_made(results: Any) -> int:
    """How many Dask tasks (batches) the run's engine submitted: its key counter's position."""
    seq = results._control.engine._seq  # itertools.count: its repr is count(NEXT)
    return int(repr(seq)[len("count(") : -1])


def _chunks(n: int, tasks: int) -> list[range]:
    size = math.ceil(n / tasks)
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _tiny_chunk(chunk: range) -> list[int]:
    return [x + 1 for x in chunk]


def _ms_chunk(chunk: range) -> list[None]:
    import time as t

    return [t.sleep(0.001) for _ in chunk]


CELLS = {
    "tiny": ("x + 1", _tiny_chunk, lambda x: x + 1),
    "1 ms": ("time.sleep(0.001)", _ms_chunk, lambda x: None),
}


class Spy:
    """py-spy recording processes until stopped (SIGINT), raw stacks to `directory`."""

    def __init__(self, pids: dict[str, int], directory: Path, tag: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.procs = [
            subprocess.Popen(
                [
                    PY_SPY,
                    "record",
                    "-p",
                    str(pid),
                    "-r",
                    "100",
                    "-f",
                    "raw",
                    "--nonblocking",
                    "-o",
                    str(directory / f"{tag}-{what}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for what, pid in pids.items()
        ]
        time.sleep(1)  # py-spy attached

    def stop(self) -> None:
        import signal

        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            p.wait(60)


def distribute_runs(
    shell: Any,
    client: Any,
    items: int,
    runs: int,
    profile: tuple[dict[str, int], Path] | None = None,
    kinds: list[str] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Per kind of item: the magic's and the hand-batched `client.map`'s figures, interleaved;
    with `profile` (pids by name, a folder), py-spy records one more run of each kind."""
    from tests.shell_helpers import cell

    cell(shell, "import time")
    cell(shell, '%%distribute --over "x in range(100)" --into out\nx')  # warm: imports, the journal's folder
    figures: dict[str, dict[str, list[float]]] = {}
    for kind, (body, chunk_fn, expect) in CELLS.items():
        if kinds is not None and kind.replace(" ", "") not in kinds:
            continue
        f = figures[kind] = {k: [] for k in ("wall", "cpu", "tasks", "peer_wall", "peer_cpu", "few_wall")}
        # With `profile`, a first run more, under py-spy, not counted.
        for run in range(-1 if profile else 0, runs):
            spy = Spy(profile[0], profile[1], kind.replace(" ", "")) if profile and run < 0 else None
            c0, t0 = time.process_time(), time.perf_counter()
            cell(shell, f'%%distribute --over "x in range({items})" --into out\n{body}')
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if spy is not None:
                spy.stop()
                shell.user_ns.pop("out")
                continue
            f["wall"].append(wall)
            f["cpu"].append(cpu)
            out = shell.user_ns.pop("out")
            done = out.counts()["done"]
            if done != items or out[0] != expect(0) or out[items - 1] != expect(items - 1):
                raise AssertionError(f"{kind}: {out.counts()}")
            tasks = _tasks_made(out)
            f["tasks"].append(tasks)
            del out
            c0, t0 = time.process_time(), time.perf_counter()
            futures = client.map(chunk_fn, _chunks(items, tasks), pure=False)
            values = [v for part in client.gather(futures) for v in part]
            f["peer_wall"].append(time.perf_counter() - t0)
            f["peer_cpu"].append(time.process_time() - c0)
            del futures
            assert len(values) == items and values[-1] == expect(items - 1)
            if kind == "tiny":  # what 8 tasks take: all a tiny item needs
                t0 = time.perf_counter()
                client.gather(client.map(chunk_fn, _chunks(items, 8), pure=False))
                f["few_wall"].append(time.perf_counter() - t0)
    return figures


# -- 3. the metrics plugin under load -------------------------------------------------------


def _inc(x: int) -> int:
    return x + 1


def _plugin(on: bool, dask_scheduler: Any = None) -> bool:
    """Take nbcluster's metrics plugin out of the scheduler (or put it back): its sampling
    stopped, its transition hook no longer called; its RPC handler stays."""
    stash = dask_scheduler.extensions.setdefault("bench-stash", {})
    if on and "plugin" in stash:
        plugin = stash.pop("plugin")
        dask_scheduler.plugins[plugin.name] = plugin
        plugin._callback.start()
    elif not on and "nbcluster-metrics" in dask_scheduler.plugins:
        plugin = stash["plugin"] = dask_scheduler.plugins.pop("nbcluster-metrics")
        plugin._callback.stop()
    return "nbcluster-metrics" in dask_scheduler.plugins


class Load:
    """Tiny tasks submitted on the clock, `rate` a second in slices of 50 ms; counts them done."""

    def __init__(self, client: Any, rate: int):
        from distributed import as_completed

        self.client, self.rate = client, rate
        self.done = 0
        self._stop = threading.Event()
        self._completed = as_completed()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._submit, self._count)]
        for t in self._threads:
            t.start()

    def _submit(self) -> None:
        per = max(1, self.rate // 20)
        k, next_at = 0, time.monotonic()
        while not self._stop.is_set():
            # On the clock, but never more than a second's worth out: a cluster slower than
            # the rate must not pile up a backlog that holds up everything else it is asked.
            if k - self.done < self.rate:
                self._completed.update(self.client.map(_inc, range(k, k + per), pure=False))
                k += per
            next_at += 0.05
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _count(self) -> None:
        while not self._stop.is_set():
            if self._completed.is_empty():
                time.sleep(0.01)
                continue
            try:
                self.done += len(self._completed.next_batch(block=True))
            except StopIteration:  # emptied meanwhile
                continue

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._completed.clear()


class Viewer:
    """One open live view: `nbcluster_metrics(since=cursor, detail=16)` 4 times a second."""

    def __init__(self, handle: Any):
        self.handle = handle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        cursor = None
        while not self._stop.wait(0.25):
            cursor = self.handle.metrics(cursor, detail=16)["cursor"]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _window(process: psutil.Process, load: Load, seconds: float) -> tuple[float, float]:
    """Percent of one core the scheduler used over `seconds`, and the tasks done per second."""
    c0, d0, t0 = _cpu(process), load.done, time.perf_counter()
    time.sleep(seconds)
    dt = time.perf_counter() - t0
    return 100 * (_cpu(process) - c0) / dt, (load.done - d0) / dt


IDLE = (
    "select (selectors.py",
    "wait (threading.py",
    "Condition.wait",
    "_worker (concurrent/futures/thread.py",
)


def spy_shares(path: Path) -> dict[str, float]:
    """From py-spy's raw stacks of the scheduler process: the share of its busy samples in
    nbcluster's metrics plugin, and in any of nbcluster's code called from the event loop.

    Busy: py-spy, not pausing the process (--nonblocking), also counts threads waiting in
    `select`, `Event.wait` (the supervisor's owner watch) or an idle executor; those are
    left out.
    """
    total = metrics = nbc = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or any(idle in frames[-1] for idle in IDLE):
            continue
        n = int(count)
        total += n
        # What runs in an event-loop callback (the supervisor's own main frames are below
        # every one of them): the frames after the last of asyncio's.
        loop = [k for k, f in enumerate(frames) if "asyncio/" in f]
        called = ";".join(frames[loop[-1] + 1 :] if loop else frames)
        if "nbcluster/metrics/" in called:
            metrics += n
        if "nbcluster/" in called:
            nbc += n
    return {"spy_metrics_pct": 100 * metrics / max(total, 1), "spy_nbcluster_pct": 100 * nbc / max(total, 1),
            "spy_samples": total}  # fmt: skip


def _py_spy_share(pid: int, seconds: float, directory: Path) -> dict[str, float]:
    """py-spy on the scheduler process for `seconds`: `spy_shares` of what it recorded."""
    out = directory / f"spy-{pid}-{time.monotonic_ns()}.txt"
    subprocess.run([PY_SPY, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "-f", "raw",
                    "--nonblocking", "-o", str(out)], capture_output=True, check=True)  # fmt: skip
    return {**spy_shares(out), "spy_file": str(out)}


def plugin_under_load(handle: Any, runs: int, rate: int, seconds: float, directory: Path) -> dict[str, Any]:
    client = handle.client
    process = psutil.Process(handle.entry["supervisor_pid"])
    on_cpu, off_cpu, on_rate, off_rate = [], [], [], []
    load = Load(client, rate)
    try:
        time.sleep(2)  # the load settles
        for _ in range(runs):
            assert client.run_on_scheduler(_plugin, False) is False
            cpu, r = _window(process, load, seconds)
            off_cpu.append(cpu)
            off_rate.append(r)
            assert client.run_on_scheduler(_plugin, True) is True
            viewer = Viewer(handle)
            try:
                cpu, r = _window(process, load, seconds)
            finally:
                viewer.stop()
            on_cpu.append(cpu)
            on_rate.append(r)
        viewer = Viewer(handle)
        try:
            spy = _py_spy_share(process.pid, seconds, directory)
        finally:
            viewer.stop()
    finally:
        load.stop()  # first: a backlog of its tasks holds up the scheduler's answers
        client.run_on_scheduler(_plugin, True)
    return {"on_cpu": on_cpu, "off_cpu": off_cpu, "on_rate": on_rate, "off_rate": off_rate, **spy}


# -- 4. adaptivity's decision ---------------------------------------------------------------


async def _adaptive_decision(repeats: int, dask_scheduler: Any = None) -> dict[str, Any]:
    """On the scheduler (the supervisor's process): nbcluster's CPU adaptive as
    `adapt --max 1000` makes it, never started, with a backlog of 100,000 items of 1 ms
    reported; the time of its target and of its recommendations, median of `repeats`."""
    import time as t

    from nbcluster.cluster.adaptive import KindAdaptive, backlogs

    cluster = dask_scheduler.handlers["nbcluster_adapt"].__self__.deployment.cluster
    backlogs(dask_scheduler).report("bench-backlog", "cpu", 100_000, 100.0)
    adaptive = KindAdaptive(cluster, "cpu", minimum=0, maximum=1000, interval="500ms", wait_count=3)
    adaptive.stop(reason="bench: decisions only, never acting")
    targets, recs, said = [], [], None
    try:
        for _ in range(repeats):
            t0 = t.perf_counter()
            target = await adaptive.safe_target()
            t1 = t.perf_counter()
            try:
                said = await adaptive.recommendations(target)
            except Exception as e:
                said = {"status": f"{type(e).__name__}: {e}"}
            recs.append(t.perf_counter() - t1)
            targets.append(t1 - t0)
    finally:
        backlogs(dask_scheduler).report("bench-backlog", "cpu", 0, 0.0)
    targets.sort()
    recs.sort()
    return {"target_ms": 1000 * targets[len(targets) // 2], "recommend_ms": 1000 * recs[len(recs) // 2],
            "target": target, "said": str(said)}  # fmt: skip


def _follow_cost(client: Any) -> dict[str, float]:
    """What a running `%%distribute`'s watch thread asks twice a second (engine._follow_cluster):
    `scheduler_info()`, every worker described; its time in the kernel and its size."""
    import pickle

    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        info = client.scheduler_info()
        walls.append(time.perf_counter() - t0)
    totals = []
    for _ in range(5):
        t0 = time.perf_counter()
        client.scheduler_info(n_workers=0)
        totals.append(time.perf_counter() - t0)
    return {"follow_ms": 1000 * _med(walls), "follow_kb": len(pickle.dumps(info)) / 1000,
            "totals_ms": 1000 * _med(totals)}  # fmt: skip


# -- one size -------------------------------------------------------------------------------


def one_size(n: int, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    import dask

    import nbcluster
    from nbcluster import _current
    from tests.scale_helpers import Simulated
    from tests.shell_helpers import load_shell

    simulated = n - 1
    row: dict[str, Any] = {"workers": n, "processes": len(_counts(simulated)), "runs": args.runs,
                           "items": args.items, "rate": args.rate, "window": args.window}  # fmt: skip
    handle = nbcluster.start(workers=1, threads=1, name=f"engine{n}", runtime_dir=directory / f"rt{n}")
    parts = args.parts.split(",")
    peer = Peer(directory) if "join" in parts else None
    try:
        nb_process = psutil.Process(handle.entry["supervisor_pid"])
        joins: dict[str, list[dict[str, float]]] = {"nbcluster": [], "peer": []}
        for _ in range(args.runs if peer is not None else 0):
            assert peer is not None
            joins["nbcluster"].append(join_leave(handle.address, handle.entry["tls"], handle.client, nb_process,
                                                 simulated, 1, lambda: len(handle.info().data["workers"])))  # fmt: skip
            joins["peer"].append(
                join_leave(peer.address, peer.tls, peer.client, peer.process, simulated, 0, None)
            )
            print(n, "join/leave", joins["nbcluster"][-1], joins["peer"][-1], flush=True)
        if peer is not None:
            row["join"] = joins
            peer.close()
            peer = None

        group = Simulated(handle.address, handle.entry["tls"], _counts(simulated))
        try:
            group.wait_ready(600)
            handle.client.wait_for_workers(n, timeout=120)
            shell = load_shell()
            _current.use(handle)
            with dask.config.set({"nbcluster.journal.path": str(directory / "journal")}):
                profile = None
                if "distribute" not in parts:
                    args.kinds = ""
                if args.profile:
                    pids = {"kernel": os.getpid(), "scheduler": handle.entry["supervisor_pid"]}
                    profile = (pids, Path(args.profile) / str(n))
                kinds = [k for k in args.kinds.split(",") if k]
                if kinds:
                    row["distribute"] = distribute_runs(
                        shell, handle.client, args.items, args.runs, profile, kinds
                    )
                    print(n, "distribute", row["distribute"], flush=True)
            if "plugin" in parts:
                row["plugin"] = plugin_under_load(handle, args.runs, args.rate, args.window, directory)
                print(n, "plugin", row["plugin"], flush=True)
            if "adaptive" in parts:
                row["adaptive"] = handle.client.run_on_scheduler(_adaptive_decision, 5)
                row["adaptive"].update(_follow_cost(handle.client))
                print(n, "adaptive", row["adaptive"], flush=True)
        finally:
            group.close()
            group.wait_closed()
        row["load"] = os.getloadavg()
    finally:
        if peer is not None:
            peer.close()
        handle.stop()
    return row


# -- the tables -----------------------------------------------------------------------------


def _f(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def _m(rs: list[dict[str, float]], k: str) -> float:
    return _med([x[k] for x in rs])


def tables(rows: list[dict[str, Any]]) -> str:
    rows = sorted(rows, key=lambda r: r["workers"])
    loads = "; ".join(f"{r['workers']}: {r['load'][0]:.1f}" for r in rows)
    out = [f"A real nbcluster cluster per size: 1 real worker, the rest SIMULATED ({PER_PROCESS} Dask "
           "workers at most to a process, each process on its own loopback address, tests/sim_workers.py), "
           "on this 2-core machine shared with other helpers' tests; 1-minute load average at the end of "
           f"each size: {loads}. Medians of the runs given per size; ratio = nbcluster / peer in the "
           "same run.", ""]  # fmt: skip

    out += ["**Joining and leaving** (peer: the same simulated workers and a plain `LocalCluster` scheduler "
            "with TLS, in its own process, alternating):", "",
            "| workers (processes) | runs | join: scheduler has all, s (peer, ratio) | `%cluster status` lists "
            "all, s | scheduler CPU while joining, s (peer, ratio) | leave: all gone, s (peer) | status lists "
            "1, s | scheduler CPU while leaving, s (peer) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "join" not in r:
            continue
        nb, pe = r["join"]["nbcluster"], r["join"]["peer"]
        out.append(
            f"| {r['workers']} ({r['processes']}) | {len(nb)} | {_f(_m(nb, 'join_s'))} ({_f(_m(pe, 'join_s'))}, "
            f"{_m(nb, 'join_s') / _m(pe, 'join_s'):.2f}x) | {_f(_m(nb, 'join_status_s'))} | "
            f"{_f(_m(nb, 'join_cpu_s'))} ({_f(_m(pe, 'join_cpu_s'))}, "
            f"{_m(nb, 'join_cpu_s') / _m(pe, 'join_cpu_s'):.2f}x) | "
            f"{_f(_m(nb, 'leave_s'))} ({_f(_m(pe, 'leave_s'))}) | {_f(_m(nb, 'leave_status_s'))} | "
            f"{_f(_m(nb, 'leave_cpu_s'))} ({_f(_m(pe, 'leave_cpu_s'))}) |"
        )
    items = rows[0]["items"]
    out += ["", f"**`%%distribute` of {items:,} items** through a real IPython shell (peer: `client.map` "
            "over the same items cut by hand into as many tasks as the engine made, then gathered; same "
            "cluster, alternating; for tiny items also `client.map` in 8 tasks, all that tiny items need). "
            "`1 ms` items sleep: simulated workers share 2 cores, so only waiting scales with them; "
            "ideal = items x 1 ms / threads:", "",
            "| workers | items | runs | wall, s (peer, ratio) | per item, µs | kernel CPU, s (peer) | Dask tasks "
            "| 8 tasks, s | ideal wall, s |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for kind, f in r.get("distribute", {}).items():
            ideal = r["items"] * 0.001 / r["workers"] if kind == "1 ms" else None
            wall, pwall = _med(f["wall"]), _med(f["peer_wall"])
            out.append(
                f"| {r['workers']} | {kind} | {len(f['wall'])} | {_f(wall)} ({_f(pwall)}, {wall / pwall:.2f}x) | "
                f"{1e6 * wall / r['items']:.1f} | {_f(_med(f['cpu']))} ({_f(_med(f['peer_cpu']))}) | "
                f"{_med(f['tasks']):.0f} | {_f(_med(f['few_wall'])) if f['few_wall'] else ''} | "
                f"{_f(ideal) if ideal is not None else ''} |"
            )
    out += ["", "**The metrics plugin's share of the scheduler's CPU** under tiny tasks submitted on the clock "
            f"(asked: {rows[0]['rate']}/s) in {rows[0]['window']:g} s windows, alternating: the scheduler "
            "process's CPU with the plugin at work and one view open (4 polls/s of `detail=16`), and with the "
            "plugin taken out (sampling stopped, transition hook removed); then py-spy on the scheduler for "
            "one more window with the plugin (200 samples/s, active samples only; \"nbcluster code\": "
            "frames of nbcluster's called from the event loop, i.e. its plugins and handlers):", "",
            "| workers | tasks/s done (with / without) | scheduler CPU, % of a core: with plugin + view "
            "| without | difference, % of the scheduler's CPU | py-spy: samples in nbcluster/metrics "
            "| py-spy: in any nbcluster code |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "plugin" not in r:
            continue
        p = r["plugin"]
        on, off = _med(p["on_cpu"]), _med(p["off_cpu"])
        out.append(
            f"| {r['workers']} | {_med(p['on_rate']):.0f} / {_med(p['off_rate']):.0f} | {on:.1f} | {off:.1f} | "
            f"{100 * (on - off) / on:+.1f}% | {p['spy_metrics_pct']:.1f}% of {p['spy_samples']} | "
            f"{p['spy_nbcluster_pct']:.1f}% |"
        )
    out += ["", "**Adaptivity's decision** (`KindAdaptive` as `adapt --max 1000` makes it, on the scheduler, "
            "with a backlog of 100,000 items of 1 ms reported; median of 5; never acting), and what a running "
            "`%%distribute` asks twice a second to follow the cluster (`scheduler_info()`, from the kernel, "
            "median of 5):", "",
            "| workers | target, ms | recommendations, ms | target | recommendation | `scheduler_info()`, ms "
            "| its size, kB | `scheduler_info(n_workers=0)`, ms |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "adaptive" not in r:
            continue
        a = r["adaptive"]
        out.append(f"| {r['workers']} | {a['target_ms']:.2f} | {a['recommend_ms']:.2f} | {a['target']} | "
                   f"{a['said'][:80]} | {a['follow_ms']:.1f} | {a['follow_kb']:.0f} | {a.get('totals_ms', 0):.1f} |")  # fmt: skip
    out += ["", *growth(rows)]
    return "\n".join(out)


def growth(rows: list[dict[str, Any]]) -> list[str]:
    """Each figure at the smallest and the largest size, and its cost per added worker."""
    if len(rows) < 2:
        return []
    a, b = rows[0], rows[-1]

    def d(r: dict[str, Any], kind: str, k: str) -> float:
        return _med(r["distribute"][kind][k])

    def share(r: dict[str, Any]) -> float:
        on, off = _med(r["plugin"]["on_cpu"]), _med(r["plugin"]["off_cpu"])
        return 100 * (on - off) / on

    figures: list[tuple[str, Callable[[dict[str, Any]], float], str, float]] = [
        ("join: scheduler CPU, nbcluster's extra over the peer (s)",
         lambda r: _m(r["join"]["nbcluster"], "join_cpu_s") - _m(r["join"]["peer"], "join_cpu_s"), "ms", 1000),
        ("join: time to `%cluster status` listing all (s)", lambda r: _m(r["join"]["nbcluster"], "join_status_s"),
         "ms", 1000),
        ("leave: time to status listing 1 (s)", lambda r: _m(r["join"]["nbcluster"], "leave_status_s"), "ms", 1000),
        ("tiny items: `%%distribute` wall (s)", lambda r: d(r, "tiny", "wall"), "ms", 1000),
        ("tiny items: Dask tasks made", lambda r: d(r, "tiny", "tasks"), "tasks", 1),
        ("tiny items: kernel CPU (s)", lambda r: d(r, "tiny", "cpu"), "ms", 1000),
        ("1 ms items: `%%distribute` wall (s)", lambda r: d(r, "1 ms", "wall"), "ms", 1000),
        ("1 ms items: kernel CPU (s)", lambda r: d(r, "1 ms", "cpu"), "ms", 1000),
        ("metrics plugin: on - off, % of the scheduler's CPU", share, "points", 1),
        ("metrics plugin: py-spy share of the scheduler's samples (%)", lambda r: r["plugin"]["spy_metrics_pct"],
         "points", 1),
        ("adaptivity: one decision, target + recommendations (ms)",
         lambda r: r["adaptive"]["target_ms"] + r["adaptive"]["recommend_ms"], "ms", 1),
        ("a run's watch poll, every worker described (ms)", lambda r: r["adaptive"]["follow_ms"], "ms", 1),
        ("a run's watch poll, totals only (ms)", lambda r: r["adaptive"].get("totals_ms", float("nan")), "ms", 1),
    ]  # fmt: skip
    out = ["**Growth**: each figure at the smallest and the largest size, and its cost per added worker "
           "(the slope between them):", "",
           f"| figure | at {a['workers']} | at {b['workers']} | per added worker |", "|---|---|---|---|"]  # fmt: skip
    for name, value, unit, scale in figures:
        try:
            va, vb = value(a), value(b)
        except (KeyError, TypeError):  # a part not measured at one of the two sizes
            continue
        if math.isnan(va) or math.isnan(vb):
            continue
        slope = (vb - va) * scale / (b["workers"] - a["workers"])
        out.append(f"| {name} | {va:.3g} | {vb:.3g} | {slope:+.3g} {unit} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--parts", default="join,distribute,plugin,adaptive", help="what to measure")
    parser.add_argument("--kinds", default="tiny,1ms", help="the items of the distribute part")
    parser.add_argument("--profile", help="a folder: py-spy records the kernel and the scheduler in it")
    parser.add_argument("--json", help="write each size's raw figures to this file as it ends")
    parser.add_argument(
        "--tables", help="instead of measuring: the tables of these --json files (comma-separated)"
    )
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    rows: list[dict[str, Any]] = []
    if args.tables:
        for name in args.tables.split(","):
            rows += json.loads(Path(name).read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for n in [int(s) for s in args.sizes.split(",")]:
                rows.append(one_size(n, args, Path(tmp)))
                rows[-1]["command"] = " ".join(["/work/venv/bin/python bench/scale_engine.py", *sys.argv[1:]])
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    body = tables(rows)
    print(body)
    if args.write:
        commands = list(dict.fromkeys(r.get("command", "") for r in rows))
        if args.tables:
            commands.append(" ".join(["/work/venv/bin/python bench/scale_engine.py", *sys.argv[1:]]))
        write_section("scale: engine", "`, then `".join(commands), body)


if __name__ == "__main__":
    main()
