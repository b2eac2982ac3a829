"""The server extension's routes, on a real Jupyter server (pytest-jupyter) with real clusters.

The server runs under a non-default base_url (as behind JupyterHub) for every test here, so
each route is also a check that the base_url is respected.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.config
import jsonschema
import psutil
import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado import web
from tornado.httpclient import HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.websocket import WebSocketClientConnection, WebSocketHandler

import nbcluster
from nbcluster._wire import Cluster, Snapshot, problems
from nbcluster.cluster import registry
from nbcluster.server import openapi

pytest_plugins = ["pytest_jupyter.jupyter_server"]

BASE_URL = "/user/alice%40example/"

# Every route with a method that changes nothing and one that would, for the 403 checks.
ROUTES = [
    ("GET", "api/profiles"),
    ("GET", "api/clusters"),
    ("POST", "api/clusters"),
    ("GET", "api/clusters/anything"),
    ("DELETE", "api/clusters/anything"),
    ("POST", "api/clusters/anything/scale"),
    ("POST", "api/clusters/anything/adapt"),
    ("POST", "api/clusters/anything/restart"),
    ("GET", "api/clusters/anything/metrics"),
    ("POST", "dashboard/anything/status"),
]


@pytest.fixture
def jp_base_url() -> str:
    return BASE_URL


@pytest.fixture
def jp_server_config(runtime_dir: Path) -> dict[str, Any]:
    # runtime_dir (tests/conftest.py) gives the server a private registry, and stops
    # whatever a test leaves running there.
    return {"ServerApp": {"jpserver_extensions": {"nbcluster.server": True}}}


@pytest.fixture
def api(jp_fetch):
    """`await api(method, path, body)` -> (status, JSON or None), never raising for 4xx."""

    async def call(method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        if body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        if body is None and method in ("POST", "PUT"):
            body = "{}"
        try:
            response = await jp_fetch("nbcluster", path, method=method, body=body, **kwargs)
        except HTTPClientError as error:
            assert error.response is not None, error
            response = error.response
        text = response.body.decode() if response.body else ""
        is_json = response.headers.get("Content-Type", "").startswith("application/json")
        reply = json.loads(text) if is_json and text else text
        if path.startswith("api/"):
            assert_documented(method, path, response.code, reply)
        return response.code, reply

    return call


# The components travel with each schema, where its `#/components/...` references point.
_COMPONENTS = openapi.document()["components"]


def assert_documented(method: str, path: str, status: int, reply: Any) -> None:
    """Every answer of an `api/` route is one the OpenAPI document (the docs' REST
    reference) declares, for that route, method and status."""
    try:
        shape = openapi.response_schema(method, path, status)
    except KeyError:
        pytest.fail(f"{method} {path} answered {status}, which the OpenAPI document does not declare")
    if shape is None:
        assert reply == "", f"{method} {path} -> {status} should have no body, got {reply!r}"
        return
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}"
        for e in jsonschema.Draft202012Validator({**shape, "components": _COMPONENTS}).iter_errors(reply)
    ]
    assert not errors, f"{method} {path} -> {status} differs from the OpenAPI document: {errors[:5]}"


def python(code: str, runtime_dir: Path, timeout: float = 60) -> str:
    """Run `code` with IPython in a separate process (like another kernel); its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor", "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NBCLUSTER_RUNTIME_DIR": str(runtime_dir)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_refuses_requests_without_a_token(api, method: str, path: str) -> None:
    # A valid XSRF token (cookie + header, as a page sends them) but no login: Jupyter's XSRF
    # check lets it through, so the 403 is nbcluster's own authentication refusing it.
    anonymous = {"Authorization": "", "Cookie": "_xsrf=t0ken", "X-XSRFToken": "t0ken"}
    status, reply = await api(method, path, {"workers": 1, "n": 1} if method == "POST" else None, headers=anonymous)
    assert status == 403
    assert "_xsrf" not in str(reply)
    assert nbcluster.clusters() == []


async def test_cookie_login_needs_the_xsrf_token_to_change_anything(api, jp_fetch, jp_serverapp) -> None:
    # A browser logged in by cookie: the cookie alone must not be enough to POST (XSRF).
    token = jp_serverapp.identity_provider.token
    first = await jp_fetch(
        "nbcluster", "api", "profiles", params={"token": token}, headers={"Authorization": ""}
    )
    login = "; ".join(c.split(";")[0] for c in first.headers.get_list("Set-Cookie"))
    assert login
    browser = {"Authorization": "", "Cookie": login}
    status, reply = await api("POST", "api/clusters", {"workers": "x"}, headers=browser)
    assert status == 403 and "_xsrf" in reply["message"]
    # The page's XSRF token (cookie + header, as JupyterLab sends them) lets it through,
    # here as far as the body check.
    with_xsrf = {**browser, "Cookie": f"{login}; _xsrf=t0ken", "X-XSRFToken": "t0ken"}
    status, reply = await api("POST", "api/clusters", {"workers": "x"}, headers=with_xsrf)
    assert status == 400 and "whole number" in reply["message"]


class ReadOnly(Authorizer):
    """An authorizer (as JupyterHub's scopes would be) granting only reads of nbcluster."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "nbcluster" or action == "read"


async def test_a_custom_authorizer_decides_who_may_change_clusters(api, jp_serverapp) -> None:
    jp_serverapp.web_app.settings["authorizer"] = ReadOnly(parent=jp_serverapp)
    assert (await api("GET", "api/clusters"))[0] == 200
    status, reply = await api("POST", "api/clusters", {"workers": 1})
    assert status == 403 and "not authorized to write on resource: nbcluster" in reply["message"]
    assert (await api("DELETE", "api/clusters/anything"))[0] == 403
    assert nbcluster.clusters() == []


async def test_stream_refuses_a_websocket_without_a_token(jp_ws_fetch) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("nbcluster", "api", "stream", headers={"Authorization": ""})
    assert refused.value.code == 403


class AskedAbout(Authorizer):
    """Grants all, noting whom it was asked about (JupyterHub's reads that user's scopes)."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        self.parent.asked_about.append(user)
        return True


async def test_dashboard_sends_an_anonymous_browser_to_the_login_page(jp_fetch, jp_serverapp, upstream) -> None:
    jp_serverapp.asked_about = []
    jp_serverapp.web_app.settings["authorizer"] = AskedAbout(parent=jp_serverapp)
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch(
            "nbcluster",
            "dashboard",
            "echo",
            "status",
            headers={"Authorization": ""},
            follow_redirects=False,
        )
    assert refused.value.code == 302
    assert refused.value.response.headers["Location"].startswith(BASE_URL + "login")
    # Nothing runs past the redirect: no authorizer is asked about nobody, nothing is relayed.
    assert jp_serverapp.asked_about == []
    assert upstream.seen == []


async def test_routes_live_under_the_base_url_only(http_server_client, jp_auth_header) -> None:
    with pytest.raises(HTTPClientError) as missing:
        await http_server_client.fetch("/nbcluster/api/profiles", headers=jp_auth_header)
    assert missing.value.code == 404


async def test_profiles_list_the_local_backend(api) -> None:
    status, body = await api("GET", "api/profiles")
    assert status == 200
    assert "local" in [p["name"] for p in body["profiles"]]


async def test_profiles_come_from_dask_config_with_backend_and_description(api) -> None:
    with dask.config.set({"nbcluster.profiles.hpc": {"backend": "slurm", "description": "Campus SLURM"}}):
        status, body = await api("GET", "api/profiles")
    assert status == 200
    assert {"name": "hpc", "backend": "slurm", "description": "Campus SLURM"} in body["profiles"]


async def test_profiles_carry_the_name_rule_the_server_enforces(api) -> None:
    # The sidebar's instant hint reads these: they must be the rule the server applies.
    _, body = await api("GET", "api/profiles")
    pattern = re.compile(f"(?:{body['name_pattern']})")
    for name in ("ok-1.b_c", "x" * 63, "x" * 64, "-lead", "no spaces", "ünï"):
        status, reply = await api("POST", "api/clusters", {"name": name, "workers": 100_000})
        # A good name gets as far as the size limit; a bad one is refused for its name.
        assert ("not usable" in reply["message"]) == (not pattern.fullmatch(name)), (name, reply)
        assert status == 400
        if not pattern.fullmatch(name):
            assert body["name_rule"] in reply["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"wokers": 2}, "unknown field(s) wokers"),
        ({"workers": -1}, "at least 0"),
        ({"workers": "two"}, "whole number"),
        ({"threads": 0}, "at least 1"),
        ({"memory": "lots"}, "not a size"),
        ({"name": "no spaces please"}, "not usable"),
        ({"keep": "yes"}, "keep must be true or false"),
        ({"profile": "mainframe"}, "unknown profile 'mainframe'"),
    ],
)
async def test_start_rejects_a_bad_body_with_a_message(api, body: Any, message: str) -> None:
    status, reply = await api("POST", "api/clusters", body)
    assert status == 400
    assert message in reply["message"]
    assert nbcluster.clusters() == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "api/clusters/nosuch"),
        ("DELETE", "api/clusters/nosuch"),
        ("POST", "api/clusters/nosuch/scale"),
        ("POST", "api/clusters/nosuch/restart"),
        ("GET", "api/clusters/nosuch/metrics"),
    ],
)
async def test_unknown_cluster_is_404_with_a_message(api, method: str, path: str) -> None:
    status, reply = await api(method, path, {"workers": 1} if path.endswith("scale") else None)
    assert status == 404
    assert "no cluster named 'nosuch'" in reply["message"]


async def test_metrics_cursor_must_be_a_number(api) -> None:
    status, reply = await api("GET", "api/clusters/nosuch/metrics", params={"since": "soon"})
    assert status == 400
    assert "cursor" in reply["message"]


async def test_a_cluster_through_every_route(api, jp_ws_fetch, runtime_dir: Path) -> None:
    status, cluster = await api("POST", "api/clusters", {"workers": 1, "name": "rest", "dashboard": True})
    assert status == 201, cluster
    assert problems(cluster, Cluster) == []  # the shape tokens.ts declares (tests/test_wire.py)
    assert cluster["state"] == "running"
    assert cluster["server_owned"] is True
    assert cluster["runs_on"] == "local"  # the words of `%cluster list`, for the sidebar card
    assert len(cluster["workers"]) == 1
    # What the card shows, computed once here; and no kernel uses it yet (stop asks then).
    assert cluster["totals"]["workers"] == 1 and cluster["totals"]["cores"] == 1
    assert cluster["totals"]["memory_limit"] > 0 and cluster["clients"] == 0

    # Another process (an IPython like another kernel's) sees it in `%cluster list`.
    out = python("%load_ext nbcluster\n%cluster list", runtime_dir)
    assert "rest" in out and "1 (1 core)" in out

    status, reply = await api("POST", "api/clusters", {"name": "rest"})
    assert status == 409
    assert "already running" in reply["message"]

    status, listing = await api("GET", "api/clusters")
    assert [c["name"] for c in listing["clusters"]] == ["rest"]
    assert problems(listing["clusters"], list[Cluster]) == []

    for bad, message in [
        ({"workers": "x"}, "whole number"),
        ({"workers": 2, "kind": "tpu"}, "kind must be"),
        ({}, "needs a number of workers"),
    ]:
        status, reply = await api("POST", "api/clusters/rest/scale", bad)
        assert (status, message in reply["message"]) == (400, True), reply
    status, reply = await api("POST", "api/clusters/rest/adapt", {"minimum": 3, "maximum": 1})
    assert status == 400 and "above maximum" in reply["message"]

    status, cluster = await api("POST", "api/clusters/rest/scale", {"workers": 2}, request_timeout=120)
    assert status == 200 and len(cluster["workers"]) == 2, cluster
    status, cluster = await api("POST", "api/clusters/rest/adapt", {"minimum": 1, "maximum": 2})
    assert status == 200 and cluster["adaptive"] == {"minimum": 1, "maximum": 2}
    status, cluster = await api("POST", "api/clusters/rest/restart", request_timeout=120)
    assert status == 200 and cluster["state"] == "running"

    status, snapshot = await api("GET", "api/clusters/rest/metrics")
    assert status == 200 and snapshot["version"] == 1
    assert problems(snapshot, Snapshot) == [] and snapshot["resources"], snapshot
    status, later = await api("GET", "api/clusters/rest/metrics", params={"since": snapshot["cursor"]})
    assert status == 200 and later["cursor"] >= snapshot["cursor"]

    # The live stream: the list first, then metrics once a cluster is watched.
    ws: WebSocketClientConnection = await jp_ws_fetch("nbcluster", "api", "stream")
    try:
        first = json.loads(await ws.read_message())
        assert first["type"] == "clusters" and first["clusters"][0]["name"] == "rest"
        # Totals, not one row per worker: a push costs the same at 2 workers or 2,000.
        assert "workers" not in first["clusters"][0] and "cores" in first["clusters"][0]["totals"]
        assert problems(first["clusters"], list[Cluster]) == []
        await ws.write_message(json.dumps({"watch": "rest"}))
        kinds = set()
        while "metrics" not in kinds:
            message = json.loads(await ws.read_message())
            kinds.add(message["type"])
        assert message["snapshot"]["version"] == 1 and "summary" in message["snapshot"]
        assert problems(message["snapshot"], Snapshot) == []
    finally:
        ws.close()

    # The dashboard, proxied behind Jupyter's auth under the base_url: the link `%cluster
    # status` shows opens it (the dashboard's own https address asks for the certificate).
    [handle] = nbcluster.clusters()
    href = re.search(r'Dashboard: <a href="([^"]+)"', handle.info()._repr_html_()).group(1)
    assert href == "/nbcluster/dashboard/rest/status" and "in Jupyter" in repr(handle.info())
    status, page = await api("GET", href.removeprefix("/nbcluster/"))
    assert status == 200 and "Dask" in page

    # A stopping scheduler's metrics plugin lets go of its handler while the cluster is
    # still listed: a sidebar polling then hears that it is stopping, not a 200 with nothing.
    handle.client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.handlers.pop("nbcluster_metrics") and None)
    status, reply = await api("GET", "api/clusters/rest/metrics")
    assert status == 503 and "is stopping" in reply["message"], reply

    status, _ = await api("DELETE", "api/clusters/rest")
    assert status == 204
    assert nbcluster.clusters() == []
    status, listing = await api("GET", "api/clusters")
    assert listing["clusters"] == []


async def test_a_cluster_from_another_kernel_shows_up_and_can_be_stopped_here(api, runtime_dir: Path) -> None:
    python("%load_ext nbcluster\n%cluster start --name elsewhere --workers 1 --keep", runtime_dir)
    status, listing = await api("GET", "api/clusters")
    (cluster,) = listing["clusters"]
    assert cluster["name"] == "elsewhere" and cluster["owner_pid"] is None
    assert cluster["server_owned"] is False
    status, _ = await api("DELETE", "api/clusters/elsewhere")
    assert status == 204
    assert nbcluster.clusters() == []


async def test_a_cluster_that_stops_answering_is_listed_as_unreachable(api) -> None:
    status, cluster = await api("POST", "api/clusters", {"workers": 0, "name": "frozen"})
    assert status == 201
    supervisor = cluster["supervisor_pid"]
    # A frozen supervisor: registered and alive, but its scheduler cannot answer.
    os.kill(supervisor, signal.SIGSTOP)
    try:
        status, listing = await api("GET", "api/clusters")
        (frozen,) = listing["clusters"]
        assert frozen["state"] == "unreachable" and frozen["name"] == "frozen"
        assert problems(frozen, Cluster) == []
        assert "tls" not in frozen  # credential paths stay on the server
        assert frozen["runs_on"] == "local"  # from the registry entry when it cannot answer
    finally:
        os.kill(supervisor, signal.SIGCONT)
    status, listing = await api("GET", "api/clusters")
    assert listing["clusters"][0]["state"] == "running"


async def test_a_cluster_without_dashboard_has_no_proxy(api) -> None:
    status, _ = await api("POST", "api/clusters", {"workers": 0, "name": "plain"})
    assert status == 201
    status, _ = await api("GET", "dashboard/plain/status")
    assert status == 404


# -- the dashboard proxy, against a stand-in dashboard that reports what reached it ----------


class Upstream:
    """A loopback HTTP + websocket server standing in for a cluster's Bokeh dashboard: it
    records every request's method and headers, and answers with headers of its own."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        upstream = self

        class Page(web.RequestHandler):
            def get(self, path: str) -> None:
                upstream.seen.append(("GET", dict(self.request.headers)))
                if path == "old":
                    self.redirect("/status")  # as Bokeh's root sends the browser to /status
                    return
                self.set_header("Set-Cookie", "upstream=session")
                self.set_header("X-Internal", "not for the browser")
                self.set_header("Cache-Control", "no-store")
                self.write({"path": path})

            def post(self, path: str) -> None:
                upstream.seen.append(("POST", dict(self.request.headers)))
                self.write("changed")

        class Socket(WebSocketHandler):
            def select_subprotocol(self, subprotocols: list[str]) -> str | None:
                return subprotocols[0] if subprotocols else None

            def open(self) -> None:
                upstream.seen.append(("WS", dict(self.request.headers)))

            def on_message(self, message: str | bytes) -> None:
                self.write_message(f"echo {message}")

        app = web.Application([(r"/ws", Socket), (r"/(.*)", Page)])
        sock, self.port = bind_unused_port("127.0.0.1")
        self.server = HTTPServer(app)
        self.server.add_sockets([sock])



def plant(directory: Path, name: str, dashboard: str) -> None:
    """A registry entry for cluster `name` with this `dashboard` address; this test's own
    process stands in for the supervisor, so the entry is live."""
    me = psutil.Process()
    entry = {
        "name": name, "state": "running", "address": "tls://127.0.0.1:9",
        "supervisor_pid": me.pid, "supervisor_started": me.create_time(), "dashboard": dashboard,
    }  # fmt: skip
    registry.update(directory, name, entry)


@pytest.fixture
def upstream(runtime_dir: Path, jp_serverapp: Any) -> Iterator[Upstream]:
    server = Upstream()  # on the server's event loop, which jp_serverapp has made current
    plant(runtime_dir, "echo", f"http://127.0.0.1:{server.port}/status")
    yield server
    server.server.stop()
    registry.remove(runtime_dir, "echo")


async def test_dashboard_proxy_passes_no_credentials_either_way(api, upstream, jp_auth_header) -> None:
    status, page = await api("GET", "dashboard/echo/status", headers={**jp_auth_header, "Cookie": "_xsrf=abc; login=secret"})
    assert status == 200 and page == {"path": "status"}
    ((method, headers),) = upstream.seen
    assert method == "GET" and headers["Host"] == f"127.0.0.1:{upstream.port}"
    assert not {"Authorization", "Cookie"} & set(headers), headers
    assert all(jp_auth_header["Authorization"].split()[-1] not in v for v in headers.values())


async def test_dashboard_proxy_returns_only_safe_response_headers(jp_fetch, upstream) -> None:
    response = await jp_fetch("nbcluster", "dashboard", "echo", "status")
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["Content-Type"].startswith("application/json")
    assert "Set-Cookie" not in response.headers or "upstream" not in response.headers["Set-Cookie"]
    assert "X-Internal" not in response.headers


async def test_dashboard_proxy_keeps_redirects_inside_the_proxy(jp_fetch, upstream) -> None:
    with pytest.raises(HTTPClientError) as moved:
        await jp_fetch("nbcluster", "dashboard", "echo", "old", follow_redirects=False)
    assert moved.value.code == 302
    assert moved.value.response.headers["Location"] == f"{BASE_URL}nbcluster/dashboard/echo/status"


async def test_dashboard_proxy_relays_only_get(api, upstream) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _ = await api(method, "dashboard/echo/status", body=None if method == "DELETE" else "{}")
        assert status == 405, method
    assert upstream.seen == []


async def test_dashboard_proxy_refuses_a_dashboard_off_loopback(api, runtime_dir: Path) -> None:
    plant(runtime_dir, "planted", "http://192.0.2.1:8787/status")  # TEST-NET-1: never reached
    try:
        status, reply = await api("GET", "dashboard/planted/status")
    finally:
        registry.remove(runtime_dir, "planted")
    assert status == 403 and "not on loopback" in str(reply)


async def test_dashboard_websocket_is_bridged_without_credentials(jp_ws_fetch, upstream) -> None:
    # Bokeh sends its session token as a second subprotocol.
    ws = await jp_ws_fetch("nbcluster", "dashboard", "echo", "ws", subprotocols=["bokeh", "t0ken"])
    try:
        assert ws.selected_subprotocol == "bokeh"
        await ws.write_message("hello")
        assert await ws.read_message() == "echo hello"
    finally:
        ws.close()
    ((method, headers),) = upstream.seen
    assert method == "WS" and not {"Authorization", "Cookie"} & set(headers), headers
    assert [p.strip() for p in headers["Sec-Websocket-Protocol"].split(",")] == ["bokeh", "t0ken"]


async def test_dashboard_websocket_needs_a_login(jp_ws_fetch, upstream) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("nbcluster", "dashboard", "echo", "ws", headers={"Authorization": ""})
    assert refused.value.code == 403
    assert upstream.seen == []


class NoNbcluster(Authorizer):
    """An authorizer that grants nothing on nbcluster (a JupyterHub user without the scope)."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "nbcluster"


async def test_the_authorizer_decides_who_sees_the_dashboard(api, jp_ws_fetch, jp_serverapp, upstream) -> None:
    jp_serverapp.web_app.settings["authorizer"] = NoNbcluster(parent=jp_serverapp)
    status, _ = await api("GET", "dashboard/echo/status")
    assert status == 403
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("nbcluster", "dashboard", "echo", "ws")
    assert refused.value.code == 403
    assert upstream.seen == []
    # The sidebar's stream asks the same question (server/_auth.py).
    with pytest.raises(HTTPClientError) as stream:
        await jp_ws_fetch("nbcluster", "api", "stream")
    assert stream.value.code == 403


async def test_a_dashboard_that_does_not_answer_is_a_502(api, runtime_dir: Path) -> None:
    sock, port = bind_unused_port("127.0.0.1")
    sock.close()  # nothing listens there any more
    plant(runtime_dir, "gone", f"http://127.0.0.1:{port}/status")
    try:
        status, reply = await api("GET", "dashboard/gone/status")
    finally:
        registry.remove(runtime_dir, "gone")
    assert status == 502 and "does not answer" in str(reply)
