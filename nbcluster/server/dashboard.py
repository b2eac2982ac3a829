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
- a cluster's dashboard requires a client certificate of the cluster's own CA (its HTTP
  server speaks only TLS, `nbcluster.cluster.private_http`), so that another user of the
  machine cannot read it from its loopback port: the proxy presents the cluster's
  certificate, from the files named in the registry entry, which only their owner can read.
  `ProxyHandler` only speaks plain HTTP upstream, so the scheme, the TLS context and the
  websocket's connection are ours (an ``http`` entry is relayed as before);
- "read" on the "nbcluster" resource is required (`_auth.may_read`), as for the REST routes, so a custom
  authorizer (JupyterHub's scopes) decides who sees dashboards;
- the browser's cookies and ``Authorization`` header (Jupyter's token) are not forwarded,
  and only a few plain response headers come back (no ``Set-Cookie`` from the dashboard):
  `ProxyHandler` passes all headers both ways, so both lists are ours;
- only GET is relayed: the dashboard is for looking, and nothing a page does through it
  can change the cluster. (`ProxyHandler` skips Jupyter's XSRF check for the proxied app's
  sake; with nothing but GET relayed, that opens nothing.)
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.utils import url_path_join
from jupyter_server_proxy.handlers import ProxyHandler
from jupyter_server_proxy.websocket import pingable_ws_connect
from tornado import httpclient, httputil, web

import nbcluster
from nbcluster._threads import in_thread
from nbcluster.cluster.private_http import client_context
from nbcluster.errors import NbclusterError
from nbcluster.server._auth import may_read

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


@dataclass(frozen=True)
class Target:
    """Where a cluster's dashboard is, and the TLS context that reaches it (None: plain HTTP)."""

    host: str
    port: int
    tls: ssl.SSLContext | None


async def dashboard_target(name: str) -> Target:
    """`name`'s dashboard, and the TLS context that reaches it.

    Parameters
    ----------
    name : str
        A registered cluster's name.

    Returns
    -------
    Target
        Its loopback host and port.

    Raises
    ------
    tornado.web.HTTPError
        404 for an unknown cluster or one without a dashboard; 403 for a dashboard not on
        loopback (nbcluster never registers one: it was planted).
    """
    try:
        handle = await in_thread(nbcluster.connect, name)
    except NbclusterError as error:
        raise web.HTTPError(404, reason=str(error)[:200]) from None
    link = handle.dashboard_link
    parts = urlsplit(link) if link else None
    if parts is None or parts.port is None or parts.hostname is None:
        raise web.HTTPError(404, reason=f"cluster {name} has no dashboard; start it with dashboard=True")
    if parts.hostname not in LOOPBACK or parts.scheme not in ("http", "https"):
        # nbcluster only ever registers loopback dashboards: anything else was planted.
        raise web.HTTPError(403, reason=f"cluster {name}'s dashboard is not on loopback; the proxy refuses it")
    tls = None
    if parts.scheme == "https":
        credentials = handle.entry.get("tls")
        try:
            if credentials is None:
                raise KeyError("tls")  # an entry without credentials: as one naming unreadable files
            tls = client_context(credentials)
        except (KeyError, TypeError, OSError, ssl.SSLError):
            raise web.HTTPError(502, reason=f"cluster {name}'s certificate cannot be read") from None
    return Target(parts.hostname, parts.port, tls)


def keep_safe_headers(response: Any) -> None:
    """`ProxyHandler`'s response rewrite hook: only `FORWARD_RESPONSE` headers come back.

    Parameters
    ----------
    response : RewritableResponse
        jupyter-server-proxy's response; its headers are replaced.
    """
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
        """Authenticate, authorize (``read`` on ``nbcluster``) and resolve the target.

        Parameters
        ----------
        *args, **kwargs
            Tornado's.

        Raises
        ------
        tornado.web.HTTPError
            403 when not authorized; 404 or 403 from `dashboard_target`.
        """
        await super().prepare(*args, **kwargs)  # authentication: a login redirect, or 403
        if not self.current_user:
            return  # ProxyHandler has sent an anonymous browser to the login page
        if not await may_read(self):
            raise web.HTTPError(403, reason="not authorized to read nbcluster dashboards")
        name = self.path_kwargs["name"]
        # Resolved here, before a websocket is accepted, so a bad name is a plain 404/403.
        self.target = await dashboard_target(name)
        # Redirects from the dashboard ("/status") are rewritten to stay under this prefix.
        self.proxy_base = url_path_join("nbcluster", "dashboard", name)

    def proxy_request_headers(self) -> httputil.HTTPHeaders:
        """The request headers relayed: only `FORWARD_REQUEST` ones (no cookies, no token).

        Returns
        -------
        tornado.httputil.HTTPHeaders
            The headers.
        """
        return httputil.HTTPHeaders({k: v for k, v in self.request.headers.items() if k in FORWARD_REQUEST})

    def get_client_uri(self, protocol: str, host: str, port: int, proxied_path: str) -> str:
        """The upstream URL, over TLS where the dashboard requires the cluster's certificate.

        Parameters
        ----------
        protocol : str
            ``http`` or ``ws``.
        host : str
            The dashboard's host.
        port : int
            Its port.
        proxied_path : str
            The path under the dashboard.

        Returns
        -------
        str
            The URL.
        """
        if self.target.tls is not None:
            protocol = {"http": "https", "ws": "wss"}[protocol]
        return str(super().get_client_uri(protocol, host, port, proxied_path))

    def proxy_request_options(self) -> dict[str, Any]:
        """The upstream request's options, with the cluster's TLS context where it has one.

        Returns
        -------
        dict
            For tornado's HTTP client.
        """
        options = dict(super().proxy_request_options())
        if self.target.tls is not None:
            options["ssl_options"] = self.target.tls
        return options

    async def http_get(self, name: str, path: str) -> None:
        """Relay a GET to the dashboard.

        Parameters
        ----------
        name : str
            The cluster's name (from the URL).
        path : str
            The path under the dashboard.

        Raises
        ------
        tornado.web.HTTPError
            502 when the dashboard does not answer.
        """
        host, port = self.target.host, self.target.port
        try:
            await self.proxy(host, port, path)
        except (OSError, web.HTTPError) as error:
            # ProxyHandler lets a refused connection out as a bare OSError (a 500 and a
            # traceback in the log), and a timeout as a 599: both mean the same to a user.
            if isinstance(error, web.HTTPError) and error.status_code not in (500, 599):
                raise
            raise web.HTTPError(502, reason="the cluster's dashboard does not answer") from None

    async def open(self, name: str, path: str) -> None:
        """Relay a websocket (Bokeh's) to the dashboard; close it with 1011 if it does not answer.

        Parameters
        ----------
        name : str
            The cluster's name (from the URL).
        path : str
            The path under the dashboard.
        """
        try:
            await self._open_upstream(path)
        except OSError:
            self.close(1011, "the cluster's dashboard does not answer")

    async def _open_upstream(self, path: str) -> None:
        """`ProxyHandler.proxy_open`, with the cluster's TLS context on the upstream socket
        (its own builds the request without one): messages and pings are relayed both ways."""
        if not path.startswith("/"):
            path = "/" + path
        request = httpclient.HTTPRequest(
            url=self.get_client_uri("ws", self.target.host, self.target.port, path),
            headers=self.proxy_request_headers(),
            ssl_options=self.target.tls,
        )

        def on_message(message: str | bytes | None) -> None:
            self._record_activity()
            if message is None:
                self.close()
            else:
                self.write_message(message, binary=isinstance(message, bytes))

        def on_ping(data: bytes) -> None:
            self._record_activity()
            self.ping(data)

        # `self.ws` is where ProxyHandler's on_message/on_ping/on_close relay the browser's side.
        self.ws = await pingable_ws_connect(
            request=request, on_message_callback=on_message, on_ping_callback=on_ping,
            subprotocols=self._requested_subprotocols,
        )  # fmt: skip

    def _only_get(self, *args: Any, **kwargs: Any) -> None:
        """Refuse every method but GET: a dashboard is read, never written through the proxy.

        Parameters
        ----------
        *args, **kwargs
            Tornado's.

        Raises
        ------
        tornado.web.HTTPError
            405.
        """
        raise web.HTTPError(405, reason="the dashboard proxy relays only GET")

    post = put = delete = patch = options = head = _only_get
