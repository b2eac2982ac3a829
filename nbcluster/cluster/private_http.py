"""The HTTP servers of a cluster answer only holders of its certificate.

Every Dask scheduler and worker runs an HTTP server, with ``--dashboard`` or without: the
scheduler's serves ``/json/identity.json`` (the workers, their memory), ``/info`` pages,
Prometheus ``/metrics`` and, with ``--dashboard``, the Bokeh dashboard (task names, memory,
the task stream); a worker's serves its ``/metrics``. None of it has authentication, and
binding it to ``127.0.0.1`` keeps out other machines, not the other users of this one: on a
shared JupyterHub any student could read any other's cluster from its loopback port.

So these servers speak TLS and require a client certificate signed by the cluster's own CA
(`credentials.write_credentials`), the same files the scheduler's comms require, written 0600
for their owner. Dask reads the server side from its config
(``distributed.scheduler.dashboard.tls.*``, which every Dask server node reads: `settings`),
but only asks for a client certificate, never requires one; `PrivateScheduler` and
`PrivateWorker` require it the moment the server is made, before it can accept anything,
and refuse to serve plain HTTP at all. The owner's Jupyter server presents the
certificate when it proxies the dashboard (`nbcluster.server.dashboard`), behind Jupyter's
(and the hub's) login.

What it leaves out: the scheduler's ``/proxy`` route to a worker's pages (the dashboard's
per-worker links) cannot present a certificate, so those pages do not open. The local
backend's scheduler has no ``/proxy`` route at all (``worker_proxy=False``): its workers
serve no pages, and Dask's route imports jupyter-server-proxy and aiohttp where they are
installed, about 0.15 s of every cluster's start.
"""

from __future__ import annotations

import ssl
from typing import Any

import dask.config
from distributed import Scheduler, Worker

from nbcluster._wire import Credentials


def settings(tls: Credentials) -> dict[str, str]:
    """Dask config that gives the HTTP servers of this process's Dask nodes (and of the
    workers it spawns, which inherit its config) the cluster's certificate.

    Parameters
    ----------
    tls : Credentials
        The cluster's credential files.

    Returns
    -------
    dict
        Flat ``distributed.scheduler.dashboard.tls.*`` keys.
    """
    return {
        "distributed.scheduler.dashboard.tls.cert": tls["cert"],
        "distributed.scheduler.dashboard.tls.key": tls["key"],
        "distributed.scheduler.dashboard.tls.ca-file": tls["ca_file"],
    }


def require_client_certificates(node: Any) -> None:
    """Make `node`'s HTTP server refuse any client without a certificate of its CA.

    Called right after Dask made the server, before the event loop runs again, so no
    connection is accepted before. A server without TLS is stopped: nothing is served in
    plain text (the `settings` were not applied).

    Parameters
    ----------
    node : distributed.Scheduler or distributed.Worker
        A node whose HTTP server was just made.

    Raises
    ------
    RuntimeError
        When the server has no TLS (it is stopped first).
    """
    server = node.http_server
    context = getattr(server, "ssl_options", None)
    if not isinstance(context, ssl.SSLContext):
        server.stop()
        raise RuntimeError("nbcluster: the Dask HTTP server has no TLS settings; refusing to serve it in plain text")
    context.verify_mode = ssl.CERT_REQUIRED


#: Dask's HTTP route that relays to any host and port (a worker's pages), from the scheduler.
PROXY_ROUTE = "distributed.http.proxy"


class CertificateRequired:
    """Dask's HTTP server (of a `Scheduler` or a `Worker`, this class first among the bases),
    refusing clients without the cluster's certificate."""

    def start_http_server(self, *args: Any, **kwargs: Any) -> None:
        """Dask's HTTP server, refusing clients without the cluster's certificate.

        Parameters
        ----------
        *args, **kwargs
            Dask's own arguments.
        """
        super().start_http_server(*args, **kwargs)  # type: ignore[misc]  # Dask's ServerNode, next in the bases
        require_client_certificates(self)


class PrivateScheduler(CertificateRequired, Scheduler):
    """A Dask `Scheduler` whose HTTP server (the dashboard) requires the cluster's certificate.

    Parameters
    ----------
    *args, **kwargs
        Dask's own arguments.
    worker_proxy : bool, default True
        Serve Dask's ``/proxy`` route (`PROXY_ROUTE`); False where no worker serves pages.
    """

    def __init__(self, *args: Any, worker_proxy: bool = True, **kwargs: Any):
        routes = list(dask.config.get("distributed.scheduler.http.routes"))
        if not worker_proxy:
            routes = [r for r in routes if r != PROXY_ROUTE]
        # Dask reads the routes from its config while it makes the scheduler, and nowhere else.
        with dask.config.set({"distributed.scheduler.http.routes": routes}):
            super().__init__(*args, **kwargs)


class PrivateWorker(CertificateRequired, Worker):
    """A Dask `Worker` whose HTTP server (``/metrics``) requires the cluster's certificate."""


def client_context(tls: Credentials) -> ssl.SSLContext:
    """A client's TLS context for a cluster's HTTP servers: its CA, its certificate.

    The certificate names no host (it is the cluster's own CA, pinned here), so the host
    name is not checked; the loopback address is checked by the caller.

    Parameters
    ----------
    tls : Credentials
        The cluster's credential files.

    Returns
    -------
    ssl.SSLContext
        For `urllib` or tornado's HTTP client.
    """
    context = ssl.create_default_context(cafile=tls["ca_file"])
    context.check_hostname = False
    context.load_cert_chain(tls["cert"], tls["key"])
    return context
