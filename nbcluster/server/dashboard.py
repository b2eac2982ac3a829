"""The Dask dashboard of a cluster, served under ``<base_url>nbcluster/dashboard/<name>/``.

A cluster started with ``dashboard=True`` serves Dask's Bokeh dashboard on a loopback port
(see the registry entry's ``dashboard``). Browsers behind JupyterHub or any remote setup
cannot reach that port, and the port itself has no authentication; this proxy is the one
way in, and it sits behind Jupyter's login like every other route.

Safety rules, each deliberate:
- the target is only ever the ``dashboard`` address of a registered cluster, looked up by
  name; the request cannot name a host or port, so the proxy is no open relay (no SSRF);
- only loopback targets are proxied: a registry entry is trusted, but not that much;
- the browser's cookies and ``Authorization`` header (Jupyter's token) are not forwarded:
  the dashboard has no use for them and must not see them.
- only GET is relayed: the dashboard is for looking, and nothing a page does through it
  can change the cluster.
Bokeh's live plots use a websocket on the same path space, so a request with
``Upgrade: websocket`` is bridged to the dashboard's websocket.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import httpclient, web
from tornado.websocket import (
    WebSocketClientConnection,
    WebSocketClosedError,
    WebSocketHandler,
    websocket_connect,
)

import nbcluster
from nbcluster.errors import NbclusterError
from nbcluster.server.handlers import in_thread

LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Request headers the proxy passes on; everything else (cookies, tokens) stays here.
FORWARD_REQUEST = (
    "Accept",
    "Accept-Encoding",
    "Accept-Language",
    "Content-Type",
    "If-None-Match",
    "User-Agent",
)
#: Response headers the proxy passes back.
FORWARD_RESPONSE = ("Content-Type", "Cache-Control", "ETag", "Last-Modified", "Content-Encoding", "Location")


async def dashboard_origin(name: str) -> str:
    """``http://127.0.0.1:PORT`` of `name`'s dashboard, or a 404."""
    try:
        handle = await in_thread(nbcluster.connect, name)
    except NbclusterError as error:
        raise web.HTTPError(404, reason=str(error)[:200]) from None
    link = handle.dashboard_link
    parts = urlsplit(link) if link else None
    if parts is None or parts.port is None:
        raise web.HTTPError(404, reason=f"cluster {name} has no dashboard; start it with dashboard=True")
    if parts.hostname not in LOOPBACK or parts.scheme != "http":
        # nbcluster only ever registers loopback dashboards: anything else was planted.
        raise web.HTTPError(403, reason=f"cluster {name}'s dashboard is not on loopback; the proxy refuses it")
    return f"{parts.scheme}://{parts.netloc}"


class DashboardProxyHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """Plain HTTP requests are fetched and relayed; websocket upgrades are bridged."""

    auth_resource = "nbcluster"

    def initialize(self) -> None:
        self.upstream: WebSocketClientConnection | None = None
        self.pump: asyncio.Task[None] | None = None

    def proxy_root(self, name: str) -> str:
        return url_path_join(self.base_url, "nbcluster", "dashboard", name)

    def _is_upgrade(self) -> bool:
        return self.request.headers.get("Upgrade", "").lower() == "websocket"

    def target(self, origin: str, path: str, scheme: str = "http") -> str:
        query = f"?{self.request.query}" if self.request.query else ""
        return f"{origin.replace('http', scheme, 1)}/{path}{query}"

    async def get(self, name: str, path: str) -> None:
        if self._is_upgrade():
            await self._websocket(name, path)
        else:
            await self._http(name, path)

    @web.authenticated
    @authorized("read")
    async def _http(self, name: str, path: str) -> None:
        origin = await dashboard_origin(name)
        headers = {k: v for k, v in self.request.headers.items() if k in FORWARD_REQUEST}
        request = httpclient.HTTPRequest(
            self.target(origin, path),
            method="GET",
            headers=headers,
            follow_redirects=False,
            decompress_response=False,
            request_timeout=30,
        )
        response = await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        if response.code == 599:
            raise web.HTTPError(502, reason="the cluster's dashboard does not answer")
        self.set_status(response.code, response.reason)
        for key in FORWARD_RESPONSE:
            value = response.headers.get(key)
            if value is not None:
                self.set_header(key, value)
        location = response.headers.get("Location", "")
        if location.startswith("/"):
            # The dashboard thinks it is at the root ("/status"); keep the browser inside
            # the proxy instead of sending it to the Jupyter server's own /status.
            self.set_header("Location", url_path_join(self.proxy_root(name), location))
        if response.body:
            self.write(response.body)
        self.finish()

    @ws_authenticated
    async def _websocket(self, name: str, path: str) -> None:
        if not await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "read", "nbcluster")
        ):
            raise web.HTTPError(403)
        origin = await dashboard_origin(name)
        # Bokeh authenticates its session in the subprotocol header ("bokeh", token):
        # offer the browser's subprotocols upstream and answer with the one chosen there.
        offered = self.request.headers.get("Sec-WebSocket-Protocol", "")
        subprotocols = [p.strip() for p in offered.split(",") if p.strip()] or None
        try:
            self.upstream = await websocket_connect(
                self.target(origin, path, scheme="ws"), subprotocols=subprotocols
            )
        except (OSError, httpclient.HTTPClientError):
            raise web.HTTPError(502, reason="the cluster's dashboard does not answer") from None
        await WebSocketHandler.get(self, name, path)

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return self.upstream.selected_subprotocol if self.upstream is not None else None

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)
        self.pump = asyncio.ensure_future(self._pump_upstream())

    async def _pump_upstream(self) -> None:
        assert self.upstream is not None
        while True:
            message = await self.upstream.read_message()
            if message is None:
                self.close()
                return
            try:
                await self.write_message(message, binary=isinstance(message, bytes))
            except WebSocketClosedError:
                return

    async def on_message(self, message: str | bytes) -> None:
        if self.upstream is not None:
            await self.upstream.write_message(message, binary=isinstance(message, bytes))

    def on_close(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
        if self.upstream is not None:
            self.upstream.close()
