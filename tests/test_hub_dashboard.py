"""A cluster's HTTP servers (the dashboard, ``/json``, ``/metrics``) answer only holders of
its certificate, so another user of the machine cannot read them from loopback.

Two real clusters of this test's own: every listening port of A's supervisor and workers is
asked for A's data in plain HTTP, in TLS without a certificate, and in TLS with B's
certificate (another user's own, valid for B's cluster): nothing answers. With A's files it
answers. The same check from a second real Unix user is in test_hub.py.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import psutil
import pytest

import nbcluster
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.cluster.private_http import client_context

PATHS = ("/json/identity.json", "/metrics", "/status", "/health")


@pytest.fixture
def two(runtime_dir) -> Iterator[tuple[ClusterHandle, ClusterHandle]]:
    a = nbcluster.start(workers=1, name="alice", dashboard=True)
    b = nbcluster.start(workers=0, name="bob")
    yield a, b
    a.stop()
    b.stop()


def http_ports(handle: ClusterHandle) -> list[int]:
    """Every port the cluster's processes listen on (its comms and its HTTP servers)."""
    supervisor = psutil.Process(handle.entry["supervisor_pid"])
    ports = []
    for p in (supervisor, *supervisor.children(recursive=True)):
        ports += [c.laddr.port for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    return ports


def fetch(url: str, context: ssl.SSLContext | None = None) -> int | str:
    """The HTTP status of `url`, or the name of the error that stopped it."""
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError) as error:
        return type(getattr(error, "reason", error)).__name__


def no_certificate() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def test_nothing_of_a_cluster_answers_without_its_certificate(two) -> None:
    a, b = two
    ports = http_ports(a)
    assert len(ports) >= 4  # scheduler + nanny comms, the scheduler's and the worker's HTTP
    strangers = {"plain http": None, "no certificate": no_certificate(), "another cluster's": client_context(b.entry["tls"])}
    for port in ports:
        for who, context in strangers.items():
            scheme = "http" if context is None else "https"
            for path in PATHS:
                answer = fetch(f"{scheme}://127.0.0.1:{port}{path}", context)
                assert not isinstance(answer, int), f"{who} got HTTP {answer} from port {port}{path}"
    # The owner's files open it: the dashboard's own port, and the data on it.
    assert a.dashboard_link.startswith("https://127.0.0.1:")
    mine = client_context(a.entry["tls"])
    assert fetch(a.dashboard_link.replace("/status", "/json/identity.json"), mine) == 200
    assert fetch(a.dashboard_link, mine) == 200

