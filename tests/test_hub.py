"""nbcluster on a shared JupyterHub: two real Unix users behind a real hub and its proxy.

One hub for the module (`tests/hub_service.py`: JupyterHub + configurable-http-proxy +
`LocalProcessSpawner`, users ``nbct-<pid>-a`` and ``-b``, all removed afterwards), with a
site config (``DASK_ROOT_CONFIG``, root's, read-only to the users) capping clusters at 2
workers, and in user A's own ``~/.config/dask`` a file raising it to 100.

Through the hub, for each user: their server runs nbcluster's server extension, the
sidebar works at /user/NAME/lab in headless Chromium, a kernel runs ``%cluster start`` and
a ``%%distribute`` cell, and ``--dashboard`` opens on the user's own route. Then user B
tries everything against A's clusters, and the hub stops A's server: A's clusters stop,
except the kept one, which A finds again at the next login. The tests run in file order;
the lifecycle test comes last because it stops A's server.

Needs root (it creates users and the spawner switches to their uids); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.hub_service import PASSWORD, Hub, User, two_users

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the course-hub tests need root: they create Unix users, and JupyterHub's "
        "LocalProcessSpawner switches to their uids",
    ),
    pytest.mark.timeout(600),
]

SITE = {"limits": {"max-workers": 2}}
CLUSTER_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    with two_users() as (a, b):
        # The student's own config, which Dask ranks above the site's.
        config = a.home / ".config" / "dask"
        a.run(["mkdir", "-p", str(config)], env={})
        a.run(["sh", "-c", f"echo 'nbcluster: {{limits: {{max-workers: 100}}}}' > {config}/nbcluster.yaml"], env={})
        with Hub((a, b), SITE) as running:
            for user in (a, b):
                running.start_server(user)
                running.user_token(user)
            yield running


@pytest.fixture(scope="module")
def alice(hub: Hub) -> User:
    return hub.users[0]


@pytest.fixture(scope="module")
def bob(hub: Hub) -> User:
    return hub.users[1]


def rest(hub: Hub, user: User, method: str, path: str, body: Any = None, *, as_user: User | None = None) -> tuple[int, Any]:
    """`method` on `user`'s nbcluster REST API through the hub's proxy, with the token of
    `as_user` (default: `user`)."""
    token = hub.tokens[(as_user or user).name]
    return hub.request(method, f"/user/{user.name}/nbcluster/{path}", body, token=token)


def names(hub: Hub, user: User) -> list[str]:
    status, reply = rest(hub, user, "GET", "api/clusters")
    assert status == 200, reply
    return sorted(c["name"] for c in reply["clusters"])


def as_user(user: User, hub: Hub, code: str, timeout: float = 60) -> Any:
    """Run Python `code` as `user` in the users' venv with the hub's environment (their
    server's: site config, nbcluster); it prints one JSON line, returned decoded."""
    env = hub.user_env
    result = user.run([f"{env['NBCLUSTER_HUB_VENV']}/bin/python", "-c", code], env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- a kernel through the proxy ------------------------------------------------------------


async def _run_cells(hub: Hub, user: User, cells: list[str], *, keep_kernel: bool = False) -> list[list[dict[str, Any]]]:
    """Run `cells` in a new kernel of `user`'s server, through the hub's proxy (REST, then
    the kernel's websocket); each cell's iopub messages, in order. The kernel is shut
    down afterwards unless `keep_kernel`."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    token = hub.tokens[user.name]
    status, kernel = hub.request("POST", f"/user/{user.name}/api/kernels", {"name": "python3"}, token=token)
    assert status == 201, kernel
    url = f"ws://127.0.0.1:{hub.port}/user/{user.name}/api/kernels/{kernel['id']}/channels"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    session, outputs = uuid.uuid4().hex, []
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            header = {"msg_id": msg_id, "msg_type": "execute_request", "session": session, "username": user.name,
                      "version": "5.3", "date": ""}  # fmt: skip
            content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
            await ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {},
                                               "content": content, "channel": "shell", "buffers": []}))  # fmt: skip
            seen: list[dict[str, Any]] = []
            while True:
                raw = await asyncio.wait_for(ws.read_message(), 120)
                assert raw is not None, "the kernel's websocket closed"
                if isinstance(raw, bytes):
                    continue  # binary frames (widget buffers): not looked at here
                message = json.loads(raw)
                if message.get("parent_header", {}).get("msg_id") != msg_id or message.get("channel") != "iopub":
                    continue
                seen.append(message)
                if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                    break
            outputs.append(seen)
    finally:
        ws.close()
        if not keep_kernel:
            hub.request("DELETE", f"/user/{user.name}/api/kernels/{kernel['id']}", token=token)
    return outputs


def text_of(messages: list[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m["content"]
        if m["msg_type"] == "stream":
            parts.append(content["text"])
        elif m["msg_type"] in ("execute_result", "display_data"):
            parts.append(content["data"].get("text/plain", ""))
        elif m["msg_type"] == "error":
            parts.append(f"{content['ename']}: {content['evalue']}")
    return "".join(parts)


# -- each user, through the hub ------------------------------------------------------------


@pytest.mark.parametrize("who", [0, 1])
def test_each_server_runs_nbcluster_and_the_site_cap_holds(hub: Hub, who: int) -> None:
    user = hub.users[who]
    assert names(hub, user) == []  # the server extension answers, on the user's own route
    for body in ({"workers": 3}, {"workers": 3, "force": True}):
        status, reply = rest(hub, user, "POST", "api/clusters", body)
        # For A, whose own ~/.config/dask says 100, as for B: the site file's 2 holds.
        assert status == 400 and f"set in {hub.site_file} (nbcluster.limits.max-workers)" in reply["message"]
    assert names(hub, user) == []


@pytest.mark.parametrize("who", [0, 1])
def test_the_sidebar_works_through_the_proxy(hub: Hub, who: int, request: pytest.FixtureRequest) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser_helpers import Screenshots, launch_chromium

    user = hub.users[who]
    name = f"side-{'ab'[who]}"
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            shot = Screenshots(page, request.node.name)
            # Log in at the hub, as a student does; the hub sends them to their own lab.
            log_in(page, hub, user, f"/user/{user.name}/lab")
            page.locator('.jp-SideBar [data-id="nbcluster-sidebar"]').click()
            panel = page.locator(".nbc-panel")
            expect(panel).to_have_attribute("data-connected", "true")  # the websocket, proxied
            shot("sidebar")
            panel.get_by_role("button", name="New cluster").click()
            form = panel.locator(".nbc-form")
            expect(form.locator('select[name="profile"] option').first).to_be_attached()
            form.locator('input[name="workers"]').fill("1")
            form.locator('input[name="name"]').fill(name)
            form.get_by_role("button", name="Start cluster").click()
            card = page.locator(f'.nbc-card[data-name="{name}"]')
            expect(card).to_have_attribute("data-workers", "1", timeout=CLUSTER_TIMEOUT_MS)
            shot("running-card")
            # A change made elsewhere reaches the page over the live stream.
            status, _ = rest(hub, user, "POST", f"api/clusters/{name}/scale", {"workers": 2})
            assert status == 200
            expect(card).to_have_attribute("data-workers", "2", timeout=CLUSTER_TIMEOUT_MS)
            shot("scaled-by-the-stream")
            card.get_by_role("button", name="Stop").click()
            expect(card).to_have_count(0, timeout=CLUSTER_TIMEOUT_MS)
        finally:
            browser.close()
    assert names(hub, user) == []


@pytest.mark.parametrize("who", [0, 1])
def test_a_kernel_runs_cluster_start_and_distribute(hub: Hub, who: int) -> None:
    user = hub.users[who]
    start, run, listing, stop = asyncio.run(_run_cells(hub, user, [
        "%load_ext nbcluster\n%cluster start --workers 2 --name nb",
        '%%distribute --over "i in range(40)"\nimport time\ntime.sleep(0.1)\ni * i',
        "%cluster list",
        "%cluster stop nb",
    ]))  # fmt: skip
    assert "error" not in {m["msg_type"] for m in start}, text_of(start)
    # The live view is a widget the cell displays; the results are the cell's value.
    views = [m for m in run if m["msg_type"] == "display_data" and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]]
    assert views, [m["msg_type"] for m in run]
    [result] = [m["content"]["data"]["text/plain"] for m in run if m["msg_type"] == "execute_result"]
    assert "40 items · 40 ok" in result and "[3] i=3 -> 9" in result, result
    assert "nb" in text_of(listing), text_of(listing)
    assert "error" not in {m["msg_type"] for m in stop}, text_of(stop)
    assert names(hub, user) == []


def log_in(page: Any, hub: Hub, user: User, next_path: str = "") -> None:
    """The hub's login form, as a student fills it in."""
    page.goto(f"{hub.url}/hub/login" + (f"?next={next_path}" if next_path else ""))
    page.locator("#username_input").fill(user.name)
    page.locator("#password_input").fill(PASSWORD)
    page.locator("#login_submit").click()
    page.wait_for_url(f"{hub.url}/user/{user.name}/**")


def test_the_dashboard_opens_on_the_users_own_route(hub: Hub, alice: User, request: pytest.FixtureRequest) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser_helpers import Screenshots, launch_chromium

    status, cluster = rest(hub, alice, "POST", "api/clusters", {"workers": 1, "name": "dash", "dashboard": True})
    assert status == 201, cluster
    try:
        status, page = rest(hub, alice, "GET", "dashboard/dash/status")
        assert status == 200 and "bokeh" in page.lower()
        # In the browser: Bokeh's document comes over its websocket, through the hub's
        # proxy and the user's server (no socket, no canvas).
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                tab = browser.new_page(viewport={"width": 1400, "height": 900})
                log_in(tab, hub, alice, f"/user/{alice.name}/nbcluster/dashboard/dash/status")
                assert tab.url.startswith(f"{hub.url}/user/{alice.name}/nbcluster/dashboard/dash/")
                expect(tab.locator("canvas").first).to_be_visible(timeout=60_000)
                Screenshots(tab, request.node.name)("dashboard-through-the-hub")
            finally:
                browser.close()
    finally:
        rest(hub, alice, "DELETE", "api/clusters/dash")


# -- nothing crosses between users ------------------------------------------------------------


@pytest.fixture(scope="module")
def alices(hub: Hub, alice: User) -> dict[str, Any]:
    """A's clusters for B to try: one with a dashboard, one kept."""
    made = {}
    for body in ({"workers": 1, "name": "alice", "dashboard": True}, {"workers": 1, "name": "alice-kept", "keep": True}):
        status, cluster = rest(hub, alice, "POST", "api/clusters", body)
        assert status == 201, cluster
        made[body["name"]] = cluster
    return made


def test_b_does_not_see_a_s_clusters(hub: Hub, alice: User, bob: User, alices: dict[str, Any]) -> None:
    assert names(hub, alice) == ["alice", "alice-kept"]
    assert names(hub, bob) == []
    code = """
import json, subprocess, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "nbcluster")
import io, contextlib
out = io.StringIO()
with contextlib.redirect_stdout(out):
    listed = shell.run_line_magic("cluster", "list")  # the magic's value is what the cell shows
out.write(repr(listed))
cli = subprocess.run([sys.executable, "-m", "nbcluster.cli", "list"], capture_output=True, text=True)
print(json.dumps({"magic": out.getvalue(), "cli": cli.stdout + cli.stderr}))
"""
    status, _ = rest(hub, bob, "POST", "api/clusters", {"workers": 0, "name": "bobs-list"})
    assert status == 201
    try:
        seen = as_user(bob, hub, code)
    finally:
        rest(hub, bob, "DELETE", "api/clusters/bobs-list")
    for what in ("magic", "cli"):
        # B's own cluster is listed (the listing works), A's are not.
        assert "bobs-list" in seen[what] and "alice" not in seen[what], (what, seen[what])


def test_b_cannot_stop_scale_or_use_a_s_cluster(hub: Hub, alice: User, bob: User, alices: dict[str, Any]) -> None:
    address = alices["alice"]["address"]
    # Through B's own server: A's names do not exist there.
    for method, path, body in (("DELETE", "api/clusters/alice", None), ("POST", "api/clusters/alice/scale", {"workers": 2})):
        status, _ = rest(hub, bob, method, path, body)
        assert status == 404
    # Through A's server with B's token: the hub refuses B.
    for method, path in (("GET", "api/clusters"), ("DELETE", "api/clusters/alice")):
        status, _ = rest(hub, alice, method, path, as_user=bob)
        assert status == 403
    # From B's own Python, knowing the address: no connection, so no control.
    code = f"""
import json, nbcluster
tries = {{}}
for what, call in (("stop", lambda: nbcluster.connect("alice").stop()),
                   ("use", lambda: nbcluster.connect({address!r})),
                   ("use-plain", lambda: nbcluster.connect({address.replace("tls://", "tcp://")!r}))):
    try:
        call()
        tries[what] = "done"
    except Exception as e:
        tries[what] = type(e).__name__ + ": " + str(e)[:200]
print(json.dumps(tries))
"""
    tries = as_user(bob, hub, code, timeout=120)
    assert all(result != "done" for result in tries.values()), tries
    status, cluster = rest(hub, alice, "GET", "api/clusters/alice")
    assert status == 200 and len(cluster["workers"]) == 1


def test_b_cannot_join_a_s_scheduler(hub: Hub, alice: User, bob: User, alices: dict[str, Any]) -> None:
    address = alices["alice"]["address"]
    # B's own certificate: that of a cluster B started.
    status, bobs = rest(hub, bob, "POST", "api/clusters", {"workers": 0, "name": "bobs"})
    assert status == 201
    mine = bobs["address"]
    try:
        code = f"""
import asyncio, json, glob, os
from distributed import Security
from distributed.comm import connect
folder = os.path.expanduser("~/.local/share/jupyter/runtime/nbcluster")
cert, key = folder + "/bobs.cert.pem", folder + "/bobs.key.pem"
own = Security(tls_ca_file=cert, tls_worker_cert=cert, tls_worker_key=key, require_encryption=True)
async def join(address={address!r}, **kwargs):
    try:
        comm = await connect(address, timeout=5, **kwargs)
        await comm.write({{"op": "identity"}})
        return "answered: " + str(await comm.read())[:100]
    except Exception as e:
        return type(e).__name__
print(json.dumps({{"own certificate": asyncio.run(join(**own.get_connection_args("worker"))),
                  "no certificate": asyncio.run(join()),
                  "own cluster": asyncio.run(join(**own.get_connection_args("worker"), address={mine!r}))}}))
"""
        tries = as_user(bob, hub, code, timeout=120)
        # B's certificate does open B's own scheduler: it is a working one, just not A's.
        assert tries.pop("own cluster").startswith("answered"), tries
        assert not any(r.startswith("answered") for r in tries.values()), tries
    finally:
        rest(hub, bob, "DELETE", "api/clusters/bobs")
    status, cluster = rest(hub, alice, "GET", "api/clusters/alice")
    assert [w["name"] for w in cluster["workers"]] == ["cpu-0"]


def test_b_cannot_read_a_s_registry_credentials_or_logs(hub: Hub, alice: User, bob: User, alices: dict[str, Any]) -> None:
    files = sorted(str(p) for p in alice.registry.iterdir())  # listed as root
    assert {Path(f).name for f in files} >= {"alice.json", "alice.cert.pem", "alice.key.pem", "alice.log"}
    code = f"""
import json
tries = {{}}
for path in {files!r} + [{str(alice.registry)!r}]:
    try:
        open(path).read() if not path.endswith("nbcluster") else __import__("os").listdir(path)
        tries[path] = "read"
    except OSError as e:
        tries[path] = type(e).__name__
print(json.dumps(tries))
"""
    tries = as_user(bob, hub, code)
    assert set(tries.values()) == {"PermissionError"}, tries


def test_b_cannot_reach_a_s_dashboard(hub: Hub, alice: User, bob: User, alices: dict[str, Any]) -> None:
    link = alices["alice"]["dashboard"]
    assert link.startswith("https://127.0.0.1:")
    # A's own route: yes; B's route, and B's token on A's route: no.
    assert rest(hub, alice, "GET", "dashboard/alice/status")[0] == 200
    assert rest(hub, bob, "GET", "dashboard/alice/status")[0] == 404
    assert rest(hub, alice, "GET", "dashboard/alice/status", as_user=bob)[0] == 403
    # B straight at the port: plain HTTP, TLS without a certificate, TLS with B's own.
    status, bobs = rest(hub, bob, "POST", "api/clusters", {"workers": 0, "name": "bobs-dash", "dashboard": True})
    assert status == 201
    try:
        code = f"""
import json, os, ssl, urllib.request
folder = os.path.expanduser("~/.local/share/jupyter/runtime/nbcluster")
own = ssl.create_default_context(cafile=folder + "/bobs-dash.cert.pem")
own.check_hostname = False
own.load_cert_chain(folder + "/bobs-dash.cert.pem", folder + "/bobs-dash.key.pem")
none = ssl.create_default_context()
none.check_hostname, none.verify_mode = False, ssl.CERT_NONE
link = {link!r}
tries = {{}}
for what, url, context in (("plain", link.replace("https:", "http:"), None), ("no certificate", link, none),
                           ("own certificate", link, own),
                           ("identity", link.replace("/status", "/json/identity.json"), none),
                           ("own dashboard", {bobs["dashboard"]!r}, own)):
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            tries[what] = r.status
    except Exception as e:
        tries[what] = type(getattr(e, "reason", e)).__name__
print(json.dumps(tries))
"""
        tries = as_user(bob, hub, code)
        # B's certificate opens B's own dashboard: it works, it is just not A's.
        assert tries.pop("own dashboard") == 200, tries
        assert not any(isinstance(v, int) for v in tries.values()), tries
    finally:
        rest(hub, bob, "DELETE", "api/clusters/bobs-dash")


def test_b_s_browser_session_cannot_open_a_s_server(hub: Hub, alice: User, bob: User) -> None:
    from playwright.sync_api import sync_playwright

    from tests.browser_helpers import launch_chromium

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page()
            log_in(page, hub, bob)
            for path in ("lab", "nbcluster/api/clusters", "nbcluster/dashboard/alice/status"):
                # The navigation's last answer, after A's server sent the browser to the hub.
                response = page.goto(f"{hub.url}/user/{alice.name}/{path}")
                assert response is not None and response.status == 403, (path, response and response.url)
        finally:
            browser.close()


# -- the hub's lifecycle (last: it stops A's server) -----------------------------------------


def test_stopping_a_server_stops_its_clusters_but_not_the_kept_one(hub: Hub, alice: User, alices: dict[str, Any]) -> None:
    # A cluster of a kernel still running, besides the server's own ("alice") and the kept one.
    [start] = asyncio.run(_run_cells(hub, alice, ["%load_ext nbcluster\n%cluster start --workers 1 --name kern"], keep_kernel=True))
    assert "error" not in {m["msg_type"] for m in start}, text_of(start)
    status, listed = rest(hub, alice, "GET", "api/clusters")
    supervisors = {c["name"]: c["supervisor_pid"] for c in listed["clusters"]}
    assert sorted(supervisors) == ["alice", "alice-kept", "kern"]
    doomed = [supervisors["alice"], supervisors["kern"]]
    began = time.monotonic()
    status, reply = hub.api("DELETE", f"/users/{alice.name}/server")  # as the idle culler or an admin does
    assert status in (202, 204), reply
    # Polled: the supervisors are another user's processes, with nothing to wait on from here.
    while any(psutil.pid_exists(pid) for pid in doomed) and time.monotonic() - began < 15:
        time.sleep(0.1)
    took = time.monotonic() - began
    print(f"the server's and its kernel's clusters stopped {took:.1f} s after DELETE /hub/api/users/NAME/server")
    assert not any(psutil.pid_exists(pid) for pid in doomed), "a cluster of the server or its kernel outlived it"
    assert took <= 10, f"the clusters stopped {took:.1f} s after the hub was asked to stop the server"
    assert psutil.pid_exists(supervisors["alice-kept"])
    assert not (alice.registry / "alice.json").exists() and not (alice.registry / "kern.json").exists()
    hub.wait_server(alice, ready=False)
    # Next login: the kept cluster is there, running, in the list.
    hub.start_server(alice)
    assert names(hub, alice) == ["alice-kept"]
    status, cluster = rest(hub, alice, "GET", "api/clusters/alice-kept")
    assert status == 200 and cluster["state"] == "running" and len(cluster["workers"]) == 1
    assert rest(hub, alice, "DELETE", "api/clusters/alice-kept")[0] == 204
