"""REST API under load: many sidebars polling while clusters come and go.

    python bench/rest_load.py [--clients 20] [--duration 60] [--cycles 30] [--pause 0.25]

A real `jupyter server` with nbcluster's extension (a subprocess, loopback only, token auth).
CLIENTS concurrent clients each loop: ``GET api/clusters``, then ``GET .../metrics`` of one
listed cluster, then PAUSE seconds (a sidebar polls twice a second). Meanwhile one more
client runs CYCLES create -> scale to 2 -> scale to 1 -> delete cycles. The pollers run for
DURATION seconds or until the cycles are done, whichever is later.

Every answer is checked: a listing is 200 with unique names, each a cluster the cycling
client has created and not finished deleting; metrics are 200 with a cursor, or 404/503 for a
cluster being deleted; each cycle step gets exactly its documented status. Afterwards no
supervisor process, registry entry, certificate or log may be left. Prints p50/p99 latencies
as a markdown block for bench/RESULTS.md.

`run_load` is also what `tests/test_load.py` runs, shorter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


@dataclass
class LoadResult:
    list_ms: list[float] = field(default_factory=list)
    metrics_ms: list[float] = field(default_factory=list)
    cycle_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @staticmethod
    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _call(http: AsyncHTTPClient, server: Any, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
    data = None if body is None else json.dumps(body)
    request = HTTPRequest(
        f"{server.url}nbcluster/{path}", method=method, body=data,
        headers={"Authorization": f"token {server.token}"}, request_timeout=180,
    )  # fmt: skip
    t0 = time.perf_counter()
    try:
        response = await http.fetch(request)
    except HTTPClientError as error:
        if error.response is None:
            raise
        response = error.response
    elapsed = time.perf_counter() - t0
    return response.code, (json.loads(response.body) if response.body else None), elapsed


async def _load(server: Any, clients: int, duration: float, cycles: int, pause: float) -> LoadResult:
    result = LoadResult()
    http = AsyncHTTPClient(force_instance=True, max_clients=clients + 4)
    created: set[str] = set()  # names the cycler has asked for (a listing may show them)
    deleting: set[str] = set()  # names whose DELETE has been sent (metrics may say 404/503)
    done = asyncio.Event()

    async def cycler() -> None:
        try:
            for i in range(cycles):
                name = f"load-{i}"
                t0 = time.perf_counter()
                created.add(name)
                steps = [
                    ("POST", "api/clusters", {"workers": 1, "name": name}, 201, 1),
                    ("POST", f"api/clusters/{name}/scale", {"workers": 2}, 200, 2),
                    ("POST", f"api/clusters/{name}/scale", {"workers": 1}, 200, 1),
                    ("DELETE", f"api/clusters/{name}", None, 204, None),
                ]
                for method, path, body, want, workers in steps:
                    if method == "DELETE":
                        deleting.add(name)
                    status, reply, _ = await _call(http, server, method, path, body)
                    if status != want:
                        result.errors.append(f"{method} {path}: {status} {reply}")
                    elif workers is not None and len(reply["workers"]) != workers:
                        result.errors.append(f"{method} {path}: {len(reply['workers'])} workers, not {workers}")
                created.discard(name)
                result.cycle_s.append(time.perf_counter() - t0)
        finally:
            done.set()

    async def poller(k: int) -> None:
        end = time.monotonic() + duration
        while time.monotonic() < end or not done.is_set():
            possible = set(created)  # before the request: what may legitimately be listed
            status, reply, took = await _call(http, server, "GET", "api/clusters")
            possible |= created
            result.list_ms.append(took * 1000)
            names = [c["name"] for c in reply["clusters"]] if status == 200 else None
            if names is None or len(names) != len(set(names)) or not set(names) <= possible:
                result.errors.append(f"client {k}: listing {status} {names} (possible: {sorted(possible)})")
            elif names:
                name = names[k % len(names)]
                status, snapshot, took = await _call(http, server, "GET", f"api/clusters/{name}/metrics")
                result.metrics_ms.append(took * 1000)
                ok = status == 200 and isinstance(snapshot.get("cursor"), int) and snapshot.get("version") == 1
                gone = status in (404, 503) and (name in deleting or name not in created)
                if not (ok or gone):
                    result.errors.append(f"client {k}: metrics of {name}: {status} {snapshot}")
            await asyncio.sleep(pause)

    started = time.perf_counter()
    await asyncio.gather(cycler(), *(poller(k) for k in range(clients)))
    result.seconds = time.perf_counter() - started
    http.close()
    return result


def leftovers(server: Any) -> list[str]:
    """Supervisor processes of the server, and files in its registry folder, still there."""
    import psutil

    from nbcluster.cluster.launcher import is_supervisor

    def supervisor(p: psutil.Process) -> bool:
        try:
            return is_supervisor(p.cmdline())
        except psutil.Error:  # exited meanwhile, or a zombie: not running
            return False

    procs = [f"pid {p.pid}" for p in psutil.Process(server.proc.pid).children(recursive=True) if supervisor(p)]
    return procs + sorted(p.name for p in Path(server.runtime_dir).iterdir())


def run_load(tmp: Path, *, clients: int, duration: float, cycles: int, pause: float) -> tuple[LoadResult, list[str]]:
    """Start a server in `tmp`, run the load, and return the result and what was left over."""
    from tests.lifecycle_helpers import JupyterServer

    with JupyterServer(tmp) as server:
        result = asyncio.run(_load(server, clients, duration, cycles, pause))
        left = leftovers(server)
    return result, left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--duration", type=float, default=60)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.25)
    args = parser.parse_args()
    result, left = run_load(
        Path(tempfile.mkdtemp(prefix="nbcluster-rest-load-")),
        clients=args.clients, duration=args.duration, cycles=args.cycles, pause=args.pause,
    )  # fmt: skip
    pct = LoadResult.pct
    print(f"\nCommand: `python bench/rest_load.py --clients {args.clients} --duration {args.duration:g} "
          f"--cycles {args.cycles} --pause {args.pause:g}` ({result.seconds:.0f} s)\n")  # fmt: skip
    print("| request | count | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for label, values in (("GET api/clusters", result.list_ms), ("GET api/clusters/NAME/metrics", result.metrics_ms)):
        print(f"| {label} | {len(values)} | {pct(values, 0.5):.1f} | {pct(values, 0.99):.1f} | {max(values):.1f} |")
    print(f"| create, scale 2, scale 1, delete (one cycle) | {len(result.cycle_s)} | "
          f"{statistics.median(result.cycle_s) * 1000:.0f} | {pct(result.cycle_s, 0.99) * 1000:.0f} | "
          f"{max(result.cycle_s) * 1000:.0f} |")  # fmt: skip
    print(f"\nWrong answers: {len(result.errors)}. Left over afterwards: {left or 'nothing'}.")
    for error in result.errors[:20]:
        print("  ", error)
    sys.exit(1 if result.errors or left else 0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
