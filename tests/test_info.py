"""`%cluster status` and the sidebar's totals, from `nbcluster_info` answers (no cluster)."""

from __future__ import annotations

from typing import Any

from nbcluster.cluster.info import BUSIEST, MAX_ROWS, ClusterInfo, cluster_totals, proxied_dashboard

GIB = 2**30


def _worker(i: int, *, host: str = "127.0.0.1", processing: int = 0, kind: str = "cpu") -> dict[str, Any]:
    return {"name": str(i), "address": f"tls://{host}:{9000 + i}", "host": host, "kind": kind, "nthreads": 1,
            "memory_limit": 12 * GIB, "memory": GIB // 4, "cpu": 3.0, "processing": processing, "gpu": None}  # fmt: skip


def _info(workers: list[dict[str, Any]], **extra: Any) -> ClusterInfo:
    return ClusterInfo({"name": "c", "address": "tls://127.0.0.1:1", "workers": workers, "tasks": {},
                        "owner_pid": 1, "created": 0.0, **extra}, now=10.0)  # fmt: skip


def test_one_worker_reads_in_the_singular() -> None:
    assert "1 worker, 1 core, 256.00 MiB used of 12.00 GiB;" in repr(_info([_worker(0)]))


def test_memory_never_sums_past_the_hosts_ram() -> None:
    # Dask's default limit gives each worker its share of the machine when it starts: four
    # 1-thread workers on a 2-core, 23.5 GiB machine add up to 47 GiB ("50.6 GB" before).
    ram = int(23.5 * GIB)
    workers = [_worker(i) for i in range(4)] + [_worker(9, host="10.0.0.9")]
    totals = cluster_totals({"workers": workers, "host_memory": {"127.0.0.1": ram}})
    assert totals["memory_limit"] == ram + 12 * GIB  # the other host's RAM is not known here
    assert "used of 35.50 GiB" in repr(_info(workers, host_memory={"127.0.0.1": ram}))


def test_status_of_a_thousand_workers_is_a_summary() -> None:
    hosts = [f"10.0.0.{h}" for h in range(30)]
    workers = [
        _worker(
            i,
            host=hosts[i % 30],
            processing=(i % 97 == 0) * (1 + i % 4),
            kind="gpu" if i % 100 == 0 else "cpu",
        )
        for i in range(1000)
    ]
    text = repr(_info(workers))
    lines = text.splitlines()
    assert len(lines) < 35, text  # not 1,000 rows
    assert "1000 workers, 1000 cores" in lines[1] and "  by host and kind:" in lines
    assert "idle: 989 of 1000 workers run nothing; busiest:" in text
    # The busiest are listed, most running tasks first; the rest are counted, not named.
    busiest = [line.split()[0] for line in lines[-BUSIEST:]]
    assert busiest == ["291", "679", "194", "582", "970"]
    assert "and 13 more host groups (" in text  # 30 CPU groups and 3 GPU ones: the largest 20 named
    html = _info(workers)._repr_html_()
    assert html.count("<tr>") < 2 * MAX_ROWS + 10


def test_a_loopback_dashboard_is_linked_through_jupyter_under_the_hub_prefix() -> None:
    # It asks for the cluster's certificate, which a browser lacks; the server extension has it.
    local = {"name": "my run", "dashboard": "https://127.0.0.1:8787/status"}
    assert proxied_dashboard(local, prefix="/user/alice/") == "/user/alice/nbcluster/dashboard/my%20run/status"
    assert proxied_dashboard(local, prefix="/") == "/nbcluster/dashboard/my%20run/status"
    # A gateway's dashboard sits behind the gateway's own proxy and auth: linked as it is.
    remote = {"name": "gw", "dashboard": "https://gateway.example/clusters/gw/status"}
    assert proxied_dashboard(remote, prefix="/") is None
    assert "dashboard: https://gateway.example/clusters/gw/status" in repr(_info([], **remote))
