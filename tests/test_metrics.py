"""The metrics plugin: ring buffers, cursor semantics and the snapshot format.

Most tests use the session's real cluster (`cluster` fixture: a supervisor process that
installs the plugin, two worker processes with one thread each) through
`ClusterHandle.metrics` and a plain Dask client. The
bounded-memory tests drive a real in-process scheduler's plugin directly with synthetic
task reports, because filling a ring of thousands of records through real tasks would only
make the test slow.
"""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
from types import SimpleNamespace

import dask.config
import pytest
from distributed import Scheduler

from nbcluster.cluster.handle import ClusterHandle
from nbcluster.metrics import MetricsWindow, client_feed, ensure_plugin, install
from nbcluster.metrics._ring import SeqRing
from nbcluster.metrics.plugin import resource_sample

# -- SeqRing ------------------------------------------------------------------------------


def test_ring_is_bounded_and_reads_since_a_cursor() -> None:
    ring: SeqRing[str] = SeqRing(3)
    for seq, rec in enumerate("abcde"):
        ring.append(seq, rec)
    assert len(ring) == 3
    assert list(ring) == ["c", "d", "e"]
    assert ring.since(None) == ["c", "d", "e"]
    assert ring.since(3) == ["d", "e"]
    assert ring.since(5) == []
    # Records 0 and 1 were dropped: a reader still at cursor 0 or 1 missed something.
    assert ring.lost_since(0) and ring.lost_since(1)
    assert not ring.lost_since(2)
    assert not ring.lost_since(None)


def test_ring_with_shared_counter_skips_other_rings_numbers() -> None:
    tasks: SeqRing[str] = SeqRing(10)
    samples: SeqRing[str] = SeqRing(10)
    tasks.append(0, "t0")
    samples.append(1, "s1")
    tasks.append(2, "t2")
    assert tasks.since(1) == ["t2"]
    assert samples.since(1) == ["s1"]
    assert samples.since(2) == []


def test_ring_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SeqRing(0)


# -- plugin on an in-process scheduler, synthetic task reports -----------------------------


def _report(i: int, worker: str = "tcp://10.0.0.1:1", ok: bool = True) -> dict:
    """What a worker's task-finished message adds to the transition's keyword arguments."""
    t = 1000.0 + i
    return {
        "worker": worker,
        "startstops": [{"action": "compute", "start": t, "stop": t + 0.5}],
        "stimulus_id": f"test-{i}",
    }


def _run_with_plugin(body, **kwargs) -> object:
    async def main():
        async with Scheduler(dashboard_address=":0", port=0) as s:
            plugin = await install(s, **kwargs)
            return body(s, plugin)

    return asyncio.run(main())


def test_task_ring_stays_bounded_and_old_cursors_see_a_gap() -> None:
    def body(s, plugin):
        first = plugin.nbcluster_metrics()
        for i in range(25):
            plugin.transition(f"inc-{i}", "processing", "memory", **_report(i))
        snap = plugin.nbcluster_metrics(since=first["cursor"])
        assert len(plugin.tasks) == 10
        assert [t["start"] for t in snap["tasks"]] == [1000.0 + i for i in range(15, 25)]
        assert snap["gap"] is True
        fresh = plugin.nbcluster_metrics(since=snap["cursor"] - 2)
        assert len(fresh["tasks"]) == 2 and fresh["gap"] is False
        return True

    assert _run_with_plugin(body, task_capacity=10)


def test_ring_sizes_come_from_dask_config() -> None:
    def body(s, plugin):
        for i in range(12):
            plugin.transition(f"inc-{i}", "processing", "memory", **_report(i))
        snap = plugin.nbcluster_metrics()
        return len(snap["tasks"]), plugin.samples.capacity, plugin.sample_interval

    settings = {
        "nbcluster.metrics.task-capacity": 5,
        "nbcluster.metrics.sample-capacity": 3,
        "nbcluster.metrics.sample-interval": "2s",
    }
    with dask.config.set(settings):
        assert _run_with_plugin(body) == (5, 3, 2.0)


def test_memory_stays_flat_when_the_ring_is_full() -> None:
    def body(s, plugin):
        def burst(start: int, n: int) -> None:
            for i in range(start, start + n):
                # Few distinct keys: dask's key_split cache would otherwise keep every one.
                plugin.transition(f"inc-{i % 50}", "processing", "memory", **_report(i))

        tracemalloc.start()
        # The first burst fills the ring with traced records; the second replaces them.
        burst(0, 20_000)
        before = tracemalloc.take_snapshot()
        burst(20_000, 20_000)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
        return len(plugin.tasks), grown

    held, grown = _run_with_plugin(body, task_capacity=1_000)
    assert held == 1_000
    # 20,000 more records would take ~2 MB if kept; a full ring replaces, so ~nothing.
    assert grown < 64_000, f"memory grew by {grown} bytes"


def test_future_cursor_restarts_the_reader() -> None:
    def body(s, plugin):
        plugin.transition("inc-1", "processing", "memory", **_report(1))
        snap = plugin.nbcluster_metrics(since=10_000)
        assert snap["gap"] is True
        assert len(snap["tasks"]) == 1
        return True

    assert _run_with_plugin(body)


def test_erred_without_a_worker_is_not_drawn() -> None:
    def body(s, plugin):
        plugin.transition("inc-1", "processing", "erred", worker=None, stimulus_id="x")
        plugin.transition("inc-2", "processing", "erred", **_report(2))
        plugin.transition("inc-3", "waiting", "processing", stimulus_id="x")
        return plugin.nbcluster_metrics()["tasks"]

    tasks = _run_with_plugin(body)
    assert [(t["prefix"], t["status"]) for t in tasks] == [("inc", "error")]


def test_gpu_fields_are_reported_only_when_present() -> None:
    # A simulation: this machine has no GPU, so the worker is a stand-in carrying what
    # distributed's NVML diagnostics put into a GPU worker's heartbeat.
    gpu_worker = SimpleNamespace(
        memory_limit=4_000_000_000,
        extra={"gpu": {"name": "Simulated GPU", "memory-total": 80_000_000_000}},
        metrics={},
    )
    metrics = {
        "time": 5.0,
        "cpu": 50.0,
        "memory": 1000,
        "host_net_io": {"read_bps": 1.0, "write_bps": 2.0},
        "gpu_utilization": 87,
        "gpu_memory_used": 3_000_000_000,
    }
    s = resource_sample("tcp://gpu:1", gpu_worker, metrics)
    assert (s["gpu_util"], s["gpu_memory"], s["gpu_memory_total"]) == (87, 3_000_000_000, 80_000_000_000)

    # The other route distributed uses: the `gpu` metric; utilisation unsupported (None).
    metrics2 = {"time": 6.0, "cpu": 1.0, "memory": 1, "gpu": {"utilization": None, "memory-used": 7}}
    s2 = resource_sample("tcp://gpu:1", gpu_worker, metrics2)
    assert "gpu_util" not in s2 and s2["gpu_memory"] == 7

    cpu_worker = SimpleNamespace(memory_limit=0, extra={}, metrics={})
    s3 = resource_sample("tcp://cpu:1", cpu_worker, {"time": 1.0, "cpu": 3.0, "memory": 9})
    assert not [k for k in s3 if k.startswith("gpu")]
    assert s3["net_read"] == 0.0 and s3["memory_limit"] == 0


# -- a real cluster -----------------------------------------------------------------------
# The session's cluster is shared with other test modules, so its rings hold their tasks
# too: these tests look at their own prefixes, or at what is new since a cursor.


def _task_functions():
    # The scheduler and workers cannot import this test module. Functions local to a call
    # cannot be pickled by reference, so Dask falls back to cloudpickle and ships them by value.
    def slow_inc(x: int) -> int:
        time.sleep(0.02)
        return x + 1

    def fail_on(x: int) -> int:
        raise ValueError(f"bad item {x}")

    return slow_inc, fail_on


slow_inc, fail_on = _task_functions()


def _plain(x: object) -> bool:
    """Only JSON/msgpack data (Dask's msgpack hands lists back as tuples)."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (str, int, float, bool))


def _wait_for(predicate, timeout: float = 20.0, what: str = "condition"):
    # Heartbeats have no event a client can await; poll the scheduler instead.
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_snapshot_format_from_a_real_cluster(cluster: ClusterHandle) -> None:
    client = cluster.client
    start = cluster.metrics()
    client.gather(client.map(slow_inc, range(10)))
    with pytest.raises(ValueError, match="bad item 3"):
        client.submit(fail_on, 3).result()

    snap = cluster.metrics(start["cursor"])
    assert _plain(snap)
    assert snap["version"] == 1 and snap["gap"] is False
    assert isinstance(snap["cursor"], int) and snap["cursor"] > start["cursor"]
    assert abs(snap["now"] - time.time()) < 60

    assert len(snap["workers"]) == 2
    for info in snap["workers"].values():
        assert set(info) == {"name", "nthreads", "memory_limit", "resources", "processing"}
        assert info["nthreads"] == 1 and isinstance(info["resources"], dict)

    tasks = snap["tasks"]
    assert sorted(t["prefix"] for t in tasks) == ["fail_on"] + ["slow_inc"] * 10
    for t in tasks:
        assert set(t) == {"key", "prefix", "group", "worker", "start", "stop", "status"}
        assert t["key"].startswith(t["prefix"] + "-")
        assert t["worker"] in snap["workers"]
        assert t["start"] <= t["stop"]
    assert [t["status"] for t in tasks if t["prefix"] == "fail_on"] == ["error"]
    ok = [t for t in tasks if t["prefix"] == "slow_inc"]
    assert all(t["status"] == "ok" and t["stop"] - t["start"] >= 0.015 for t in ok)
    # Two single-threaded workers share the work: both lanes get bars.
    assert len({t["worker"] for t in ok}) == 2

    groups = {g["prefix"]: g for g in snap["groups"]}
    assert groups["fail_on"]["failed"] == 1


def test_cursor_returns_only_new_records(cluster: ClusterHandle) -> None:
    client = cluster.client
    cursor = cluster.metrics()["cursor"]
    client.gather(client.map(slow_inc, range(100, 105)))
    snap = cluster.metrics(cursor)
    assert [t["prefix"] for t in snap["tasks"]] == ["slow_inc"] * 5
    again = cluster.metrics(snap["cursor"])
    assert not again["tasks"]
    assert again["cursor"] >= snap["cursor"]


def test_resource_samples_arrive_per_worker(cluster: ClusterHandle) -> None:
    cursor = cluster.metrics()["cursor"]

    def both_workers_sampled():
        snap = cluster.metrics(cursor)
        return snap if {r["worker"] for r in snap["resources"]} == set(snap["workers"]) else None

    snap = _wait_for(both_workers_sampled, what="a sample from each worker")
    for r in snap["resources"]:
        assert {"worker", "time", "cpu", "memory", "memory_limit", "net_read", "net_write"} <= set(r)
        assert r["memory"] > 10_000_000  # a Python process, in bytes
        assert r["memory_limit"] == snap["workers"][r["worker"]]["memory_limit"]
        # No NVML GPU here: GPU fields are absent, not zero.
        assert not [k for k in r if k.startswith("gpu")]


def test_client_feed_from_a_thread_and_plugin_is_idempotent(cluster: ClusterHandle) -> None:
    client = cluster.client
    client.gather(client.map(slow_inc, range(300, 302)))
    ensure_plugin(client)  # already installed by the supervisor: must keep its rings
    feed = client_feed(client)
    result: list[dict] = []
    t = threading.Thread(target=lambda: result.append(feed(None)))
    t.start()
    t.join(30)
    assert result, "the feed did not answer"
    assert sum(t["prefix"] == "slow_inc" for t in result[0]["tasks"]) >= 2


def test_window_folds_snapshots_and_stays_bounded(cluster: ClusterHandle) -> None:
    client = cluster.client
    client.gather(client.map(slow_inc, range(200, 206)))
    # The bounds every live view shares (the widget and the sidebar get them from Python).
    with dask.config.set({"nbcluster.widget.max-tasks": 4, "nbcluster.widget.max-samples": 3}):
        window = MetricsWindow()
    window.apply(cluster.metrics(window.cursor))
    assert window.cursor is not None and len(window.workers) == 2
    assert len(window.tasks) == 4  # only the newest four
    client.gather(client.map(slow_inc, range(210, 212)))
    delta = cluster.metrics(window.cursor)
    window.apply(delta)
    assert [t["prefix"] for t in delta["tasks"]] == ["slow_inc"] * 2
    view = window.to_view()
    assert len(view["tasks"]) == 4
    assert all(len(s) <= 3 for s in view["samples"].values())


# -- summaries that do not grow with the workers ------------------------------------------


def test_spread_and_band_describe_every_worker_in_three_numbers() -> None:
    from nbcluster.metrics.summary import band, spread

    assert spread([]) is None and spread([5.0]) == (5.0, 5.0, 5.0)
    assert spread([4.0, 1.0, 3.0, 2.0]) == (1.0, 2.5, 4.0)
    samples = [{"cpu": float(i), "memory": 10 * i, "memory_limit": 100} for i in range(1000)]
    b = band(7.0, [*samples, {"cpu": 50.0, "memory": 0, "memory_limit": 100, "gpu_util": 80.0}])
    assert b["workers"] == 1001 and b["cpu"] == (0.0, 499.0, 999.0) and b["memory_limit"] == 100
    assert b["gpu_util"] == (80.0, 80.0, 80.0)  # over the workers that report a GPU only
    assert "gpu_util" not in band(7.0, samples)


def test_run_progress_reports_are_kept_per_run_and_bounded() -> None:
    from nbcluster._wire import PROGRESS_TOPIC
    from nbcluster.metrics.plugin import MAX_RUNS

    def body(s, plugin):
        # Through the scheduler's own event log, which hands each event to its plugins.
        for i in range(MAX_RUNS + 5):
            s.log_event(PROGRESS_TOPIC, {"run": f"run{i}", "done": i, "total": 20, "state": "running", "junk": 1})
        s.log_event(PROGRESS_TOPIC, {"run": "run7", "done": 20, "total": 20, "state": "done", "elapsed": 3.0})
        s.log_event("elsewhere", {"run": "run8", "done": 99})  # another topic: not a report
        runs = plugin.nbcluster_metrics()["runs"]
        assert len(runs) == MAX_RUNS and runs[-1]["run"] == "run7" and runs[-1]["state"] == "done"
        assert "junk" not in runs[0] and runs[0]["run"] == "run5"  # the oldest five went
        assert next(r["done"] for r in runs if r["run"] == "run8") == 8
        return True

    assert _run_with_plugin(body)


def test_window_drops_a_departed_workers_charts_and_keeps_bands() -> None:
    from nbcluster.metrics.feed import MetricsWindow

    a, b = "tls://127.0.0.1:1", "tls://127.0.0.1:2"
    sample = {"cpu": 1.0, "memory": 1, "memory_limit": 2, "net_read": 0.0, "net_write": 0.0}
    window = MetricsWindow(max_tasks=10, max_samples=3)
    window.apply({"cursor": 2, "workers": {a: {}, b: {}}, "resources": [{**sample, "worker": a, "time": 1.0},
                  {**sample, "worker": b, "time": 1.0}], "bands": [{"time": 1.0, "workers": 2}] * 5})  # fmt: skip
    # Adapt took `a` away (restarts and adapt bring new addresses all the time).
    window.apply({"cursor": 3, "workers": {b: {}}, "summary": {"workers": 1}, "resources": []})
    assert set(window.samples) == {b} and len(window.bands) == 3
    assert window.to_view()["summary"] == {"workers": 1}


def test_the_schedulers_own_view_of_many_workers_is_drawn_as_distributions() -> None:
    # A scheduler without nbcluster's plugin: its `identity` answer, 20 workers.
    from nbcluster.metrics.basic import basic_snapshot
    from nbcluster.metrics.feed import MetricsWindow
    from nbcluster.widgets._static import render_resources

    identity = {"workers": {
        f"tls://10.0.0.{i}:1": {"name": str(i), "host": f"10.0.0.{i}", "nthreads": 1, "memory_limit": 2**30,
                               "last_seen": 100.0, "metrics": {"time": 100.0, "cpu": float(i), "memory": 2**20}}
        for i in range(20)
    }}  # fmt: skip
    snap = basic_snapshot(identity)
    assert snap["bands"][0]["workers"] == 20 and snap["bands"][0]["cpu"] == (0.0, 9.5, 19.0)
    assert basic_snapshot(identity, since=snap["cursor"])["bands"] == []  # no news, no band
    window = MetricsWindow()
    window.apply(snap)
    html = render_resources(window.to_view())
    assert 'class="nbc-resource-band"' in html and 'class="nbc-resource-worker"' not in html


def test_summary_busiest_and_bands_stay_right_when_only_some_workers_change() -> None:
    # 30 workers of the light SIMULATION (tests/sim_light.py: Dask's real protocol over real
    # comms to a real scheduler), heartbeating only when told: the plugin samples and sums
    # only what changed, and what it answers must equal what all the workers say now.
    from distributed import Client, wait

    from nbcluster.metrics.plugin import resource_sample
    from nbcluster.metrics.summary import band
    from tests.sim_light import start_workers

    def expected(s: Scheduler) -> tuple[dict, dict]:
        by_host: dict[str, list[int]] = {}
        for ws in s.workers.values():
            t = by_host.setdefault(ws.host, [0, 0, 0, 0, 0])
            for i, v in enumerate((1, ws.nthreads, len(ws.processing), ws.metrics.get("memory", 0) or 0,
                                   ws.memory_limit or 0)):  # fmt: skip
                t[i] += v
        hosts = {h: dict(zip(("workers", "threads", "processing", "memory", "memory_limit"), t, strict=True))
                 for h, t in by_host.items()}  # fmt: skip
        latest = band(0.0, [resource_sample(a, ws, ws.metrics) for a, ws in s.workers.items()])
        return hosts, {**latest, "time": None}

    def check(s: Scheduler, snap: dict, plugin) -> None:
        hosts, latest = expected(s)
        summary = snap["summary"]
        assert summary["workers"] == len(s.workers) and summary["more_hosts"] == 0
        assert {h["host"]: {k: v for k, v in h.items() if k != "host"} for h in summary["hosts"]} == hosts
        for k in ("threads", "processing", "memory", "memory_limit"):
            assert summary[k] == sum(h[k] for h in hosts.values()), k
        assert {**plugin.bands.since(None)[-1], "time": None} == latest

    async def main() -> None:
        async with Scheduler(dashboard_address=":0", port=0) as s:
            plugin = await install(s, sample_interval=3600)  # rounds only when the test runs one
            workers, pool = await start_workers(s.address, None, 30, 3, "light", heartbeats=False)
            try:
                plugin.sample()
                idle = plugin.nbcluster_metrics(detail=4)
                check(s, idle, plugin)
                # All idle: the four described are the first four by name, in that order.
                by_name = sorted(s.workers.values(), key=lambda ws: str(ws.name))
                assert list(idle["workers"]) == [ws.address for ws in by_name[:4]]

                # Five workers report new memory; the others say nothing new.
                cursor = plugin.nbcluster_metrics()["cursor"]
                for i, w in enumerate(workers[3:8]):
                    await w.beat(memory=(i + 1) * 2**30, cpu=90.0)
                plugin.sample()
                snap = plugin.nbcluster_metrics(since=cursor, detail=4)
                assert sorted(r["worker"] for r in plugin.samples.since(cursor)) == sorted(
                    w.address for w in workers[3:8]
                )
                check(s, snap, plugin)
                assert snap["bands"][-1]["cpu"][2] == 90.0

                # Two workers busy with tasks they hold: the busiest, counted by host.
                async with Client(s.address, asynchronous=True) as c:
                    busy = workers[25:27]
                    for w in workers:
                        w.hold = w in busy
                    futures = [c.submit(int, i, workers=[w.address for w in busy], pure=False) for i in range(6)]
                    while sum(len(s.workers[w.address].processing) for w in busy) < 6:
                        await asyncio.sleep(0.01)
                    snap = plugin.nbcluster_metrics(detail=2)
                    assert set(snap["workers"]) == {w.address for w in busy}
                    check(s, snap, plugin)
                    for w in busy:
                        w.release()
                    await wait(futures)  # not gathered: nothing listens at a simulated worker
                    assert {f.status for f in futures} == {"finished"}

                # Ten leave, two of them reporting first; then one heartbeat is news.
                for w in workers[:10]:
                    await w.close()
                while len(s.workers) > 20:
                    await asyncio.sleep(0.01)
                await workers[15].beat(memory=3 * 2**30)
                plugin.sample()
                snap = plugin.nbcluster_metrics(detail=4)
                assert snap["summary"]["workers"] == 20 and snap["bands"][-1]["workers"] == 20
                check(s, snap, plugin)

                # Five join (with addresses of their own); their first samples are news.
                more, pool2 = await start_workers(s.address, None, 5, 1, "later", port=21000, heartbeats=False)
                plugin.sample()
                snap = plugin.nbcluster_metrics(detail=4)
                assert snap["summary"]["workers"] == 25 and snap["bands"][-1]["workers"] == 25
                check(s, snap, plugin)
                for w in more:
                    await w.close()
                await pool2.close()
            finally:
                for w in workers[10:]:
                    await w.close()
                await pool.close()

    asyncio.run(main())
