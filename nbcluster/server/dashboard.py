"""The Dask dashboard of a cluster, served under ``<base_url>nbcluster/dashboard/<name>/``.

A cluster started with ``dashboard=True`` serves Dask's Bokeh dashboard on a loopback port
(see the registry entry's ``dashboard``). Browsers behind JupyterHub or any remote setup
cannot reach that port, and the port itself has no authentication; this proxy is the one
way in, and it sits behind Jupyter's login like every other route.

The relaying is jupyter-server-proxy's `ProxyHandler`: HTTP, Bokeh's websocket (with the
subprotocols Bokeh authenticates its session in), redirects kept inside the proxy, and a
login redirect for a browser (403 for a websocket) before anything else runs. What this
module adds is which target, who may, and what passes:

- the target is only ever the ``dashboard`` address of a registered cluster, looked up by
  name; the request cannot name a host or port, so the proxy is no open relay (no SSRF);
- only loopback targets are proxied: a registry entry is trusted, but not that much;
- "read" on the "nbcluster" resource is required, as for the REST routes, so a custom
  authorizer (JupyterHub's scopes) decides who sees dashboards;
- the browser's cookies and ``Authorization`` header (Jupyter's token) are not forwarded,
  and only a few plain response headers come back (no ``Set-Cookie`` from the dashboard):
  `ProxyHandler` passes all headers both ways, so both lists are ours;
- only GET is relayed: the dashboard is for looking, and nothing a page does through it
  can change the cluster. (`ProxyHandler` skips Jupyter's XSRF check for the proxied app's
  sake; with nothing but GET relayed, that opens nothing.)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from jupyter_server.utils import ensure_async, url_path_join
from jupyter_server_proxy.handlers import ProxyHandler
from tornado import httputil, web

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


async def dashboard_target(name: str) -> tuple[str, int]:
    """(host, port) of `name`'s dashboard; a 404 if it has none, a 403 if not on loopback."""
    try:
        handle = await in_thread(nbcluster.connect, name)
    except NbclusterError as error:
        raise web.HTTPError(404, reason=str(error)[:200]) from None
    link = handle.dashboard_link
    parts = urlsplit(link) if link else None
    if parts is None or parts.port is None or parts.hostname is None:
        raise web.HTTPError(404, reason=f"cluster {name} has no dashboard; start it with dashboard=True")
    if parts.hostname not in LOOPBACK or parts.scheme != "http":
        # nbcluster only ever registers loopback dashboards: anything else was planted.
        raise web.HTTPError(
            403, reason=f"cluster {name}'s dashboard is not on loopback; the proxy refuses it"
        )
    return parts.hostname, parts.port


def keep_safe_headers(response: Any) -> None:
    """`ProxyHandler`'s response rewrite hook: only `FORWARD_RESPONSE` headers come back."""
    kept = httputil.HTTPHeaders()
    for key, value in response.headers.get_all():
        if key in FORWARD_RESPONSE:
            kept.add(key, value)
    response.headers = kept


class DashboardProxyHandler(ProxyHandler):
    """GET and websocket upgrades of ``dashboard/<name>/<path>``, relayed to that cluster."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(
            *args, host_allowlist=list(LOOPBACK), rewrite_response=(keep_safe_headers,), **kwargs
        )

    async def prepare(self, *args: Any, **kwargs: Any) -> None:
        await super().prepare(*args, **kwargs)  # authentication: a login redirect, or 403
        if self._finished:
            return
        if not await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "read", "nbcluster")
        ):
            raise web.HTTPError(403, reason="not authorized to read nbcluster dashboards")
        name = self.path_kwargs["name"]
        # Resolved here, before a websocket is accepted, so a bad name is a plain 404/403.
        self.target = await dashboard_target(name)
        # Redirects from the dashboard ("/status") are rewritten to stay under this prefix.
        self.proxy_base = url_path_join("nbcluster", "dashboard", name)

    def proxy_request_headers(self) -> httputil.HTTPHeaders:
        return httputil.HTTPHeaders({k: v for k, v in self.request.headers.items() if k in FORWARD_REQUEST})

    async def http_get(self, name: str, path: str) -> None:
        host, port = self.target
        try:
            await self.proxy(host, port, path)
        except (OSError, web.HTTPError) as error:
            # ProxyHandler lets a refused connection out as a bare OSError (a 500 and a
            # traceback in the log), and a timeout as a 599: both mean the same to a user.
            if isinstance(error, web.HTTPError) and error.status_code not in (500, 599):
                raise
            raise web.HTTPError(502, reason="the cluster's dashboard does not answer") from None

    async def open(self, name: str, path: str) -> None:
        host, port = self.target
        try:
            await self.proxy_open(host, port, path)
        except OSError:
            self.close(1011, "the cluster's dashboard does not answer")

    def _only_get(self, *args: Any, **kwargs: Any) -> None:
        raise web.HTTPError(405, reason="the dashboard proxy relays only GET")

    post = put = delete = patch = options = head = _only_get
