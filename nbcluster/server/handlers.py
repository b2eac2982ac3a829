"""REST and websocket routes of the nbcluster server extension.

Every route lives under ``<base_url>nbcluster/`` and requires Jupyter's own authentication
(token header, or login cookie plus XSRF token for state-changing verbs)::

    GET    api/profiles                   {"profiles": [{"name", "backend", "description"}, ...],
                                           "name_pattern": regex, "name_rule": text}
    GET    api/clusters                   {"clusters": [cluster, ...]}
    POST   api/clusters                   start one; body below -> 201 cluster
    GET    api/clusters/<name>            cluster
    DELETE api/clusters/<name>            stop it -> 204
    POST   api/clusters/<name>/scale      {"workers": n, "kind": "cpu"|"gpu", "force": false} -> cluster
    POST   api/clusters/<name>/adapt      {"minimum": n, "maximum": m, "force": false} -> cluster
    POST   api/clusters/<name>/restart    {} -> cluster
    GET    api/clusters/<name>/metrics    ?since=cursor -> metrics snapshot (nbcluster.metrics)
    WS     api/stream                     live list + metrics, see `StreamHandler`
    *      dashboard/<name>/<path>        the cluster's Dask dashboard, see `dashboard.py`

A *cluster* (`nbcluster._wire.Cluster`, ``ICluster`` in the sidebar) is the scheduler's
``nbcluster_info`` answer plus ``"state": "running"``, or, for a registered cluster whose
scheduler does not answer in time, its registry entry's public fields with
``"state": "unreachable"`` (`unreachable`). Start body (`START_FIELDS`, all optional): the start options
declared in `nbcluster.cluster.spec.START_OPTIONS`, and ``profile``. Values are checked by
the cluster layer, which every front end shares, and sizes against
`nbcluster.cluster.limits` before the supervisor is asked (which checks again); ``force``
lifts only the machine-derived limits. Errors are JSON
``{"message": ...}``: 400 for a bad body or value, 404 for an unknown cluster, 409 when the
start would reuse a running cluster, 503 when a scheduler does not answer.

Nothing here holds cluster state: each request reads the registry and asks the scheduler,
so clusters started anywhere (a kernel, the CLI, this server) look the same. Blocking calls
of the Python API (starting, stopping, reading the registry) run in a thread so the server
keeps serving while a cluster starts.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

import nbcluster
from nbcluster import config
from nbcluster._wire import Cluster
from nbcluster.cluster import profiles as declared
from nbcluster.cluster.handle import start as start_cluster
from nbcluster.cluster.info import cluster_totals, runs_on
from nbcluster.cluster.spec import NAME_PATTERN, NAME_RULE, START_OPTIONS, parse_bounds
from nbcluster.errors import BadArgument, ClusterNotFound, ClusterUnreachable, NbclusterError
from nbcluster.server._threads import in_thread
from nbcluster.server.dashboard import DashboardProxyHandler

if TYPE_CHECKING:
    from nbcluster.cluster.handle import ClusterHandle

#: Seconds one scheduler gets to answer a list/info call before it is shown unreachable.
INFO_TIMEOUT_S = 3.0
#: The start body: the declared start options, and the backend profile.
START_FIELDS = tuple(dict.fromkeys([*(o.field for o in START_OPTIONS), "profile"]))

#: Workers the sidebar's metrics describe one by one (the busiest; the plugin summarises
#: all of them): the task stream's lane count (theme.json ``stream.maxLanes``).
DETAIL_WORKERS = 16

_STATUS = {BadArgument: 400, ClusterNotFound: 404, ClusterUnreachable: 503}


def profiles() -> list[dict[str, Any]]:
    """The backend profiles the start form offers: those in this server's Dask config."""
    return [p.to_dict() for p in declared.all()]


async def describe(handle: ClusterHandle) -> Cluster:
    """One cluster for the browser; never raises for a scheduler that does not answer."""
    try:
        info = await asyncio.wait_for(handle.ainfo(), INFO_TIMEOUT_S)
    except (NbclusterError, asyncio.TimeoutError, OSError):
        # Registered (its supervisor lives) but silent: show it as such, never hang on it.
        return unreachable(handle)
    except Exception:
        # A bug talking to one cluster must not turn every sidebar's listing into a 500.
        logging.getLogger("nbcluster").exception("nbcluster: asking %s for its state failed", handle.name)
        return unreachable(handle)
    cluster: Cluster = {
        **info, "state": "running", "server_owned": info["owner_pid"] == os.getpid(),
        "runs_on": runs_on(info), "totals": cluster_totals(info),
    }  # fmt: skip
    return cluster


def unreachable(handle: ClusterHandle) -> Cluster:
    """A cluster whose scheduler did not answer: the registry fields safe to show in a
    browser (the entry also holds credential paths)."""
    e = handle.entry
    cluster: Cluster = {
        "name": e["name"], "address": e["address"], "dashboard": None, "owner_pid": None, "created": None,
        "state": "unreachable", "server_owned": False, "runs_on": runs_on(e),
    }  # fmt: skip
    if not e["external"]:
        cluster.update({
            "dashboard": e.get("dashboard"), "owner_pid": e.get("owner_pid"), "created": e.get("created"),
            "spec": e.get("spec"), "profile": e.get("profile"), "backend": e.get("backend"),
            "server_owned": e.get("owner_pid") == os.getpid(),
        })  # fmt: skip
    return cluster


def compact(cluster: Cluster) -> Cluster:
    """A cluster for the live stream: its ``totals`` in place of one row per worker, so a
    push costs the same at 2 workers or 2,000 (the card shows only totals)."""
    out = cluster.copy()
    out.pop("workers", None)
    out.pop("host_memory", None)
    return out


async def describe_all() -> list[Cluster]:
    handles = await in_thread(nbcluster.clusters)
    return list(await asyncio.gather(*(describe(h) for h in handles)))


def flag(data: dict[str, Any], key: str) -> bool:
    """A true/false field of a request body (absent: false)."""
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BadArgument(f"{key} must be true or false")
    return value


def api_errors(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Answer an `NbclusterError` with its status and its one-line message as JSON.

    The message is written directly instead of raising `web.HTTPError`, whose log message is
    %-formatted by Tornado: a user's value containing '%' must not break the reply.
    """

    @functools.wraps(method)
    async def wrapper(self: ApiBase, *args: Any, **kwargs: Any) -> None:
        try:
            await method(self, *args, **kwargs)
        except NbclusterError as error:
            status = next((code for cls, code in _STATUS.items() if isinstance(error, cls)), 500)
            self.fail(status, str(error))

    return wrapper


def api_verb(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None] | None]:
    """A REST verb: `web.authenticated` (who are you: a login redirect or 403 otherwise),
    `authorized` ("read" for GET, "write" for the rest, on the "nbcluster" resource), then
    `api_errors`. Every verb of `ApiBase` goes through it, so none can miss a check."""
    return web.authenticated(authorized(api_errors(method)))


class ApiBase(APIHandler):
    """JSON in and out.

    Every verb is an `api_verb`: `authenticated` (who are you) and `authorized` (may you):
    a server with a custom authorizer (e.g. JupyterHub's scopes) can grant "read" or
    "write" on the "nbcluster" resource, as for Jupyter's own "kernels" or "contents".
    """

    auth_resource = "nbcluster"

    def fail(self, status: int, message: str) -> None:
        self.log.info("nbcluster: %s %s -> %d %s", self.request.method, self.request.path, status, message)
        self.set_status(status)
        self.finish({"message": message})

    def body(self, allowed: tuple[str, ...]) -> dict[str, Any]:
        """The request's JSON object, restricted to `allowed` keys, or a BadArgument."""
        raw = self.request.body or b"{}"
        try:
            data = json.loads(raw)
        except ValueError:
            raise BadArgument("the request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise BadArgument("the request body must be a JSON object")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise BadArgument(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        return data

    async def handle(self, name: str) -> ClusterHandle:
        return await in_thread(nbcluster.connect, name)


class ProfilesHandler(ApiBase):
    @api_verb
    async def get(self) -> None:
        # The name rule travels with the profiles, so the start form's hint is the server's rule.
        self.finish({"profiles": profiles(), "name_pattern": NAME_PATTERN, "name_rule": NAME_RULE})


class ClustersHandler(ApiBase):
    @api_verb
    async def get(self) -> None:
        self.finish({"clusters": await describe_all()})

    @api_verb
    async def post(self) -> None:
        data = self.body(START_FIELDS)
        data["profile"] = data.get("profile") or "local"  # checked by `start`, with the known ones named
        for option in START_OPTIONS:
            if option.switch:
                flag(data, option.field)
            elif data.get(option.field) in ("", None):
                # An empty form field means "the default", exactly like leaving the flag out.
                data.pop(option.field, None)
        # The server owns what it starts, so a server shutdown takes these clusters with it.
        # The plain start, not `nbcluster.start`: that one also makes the cluster this
        # process's current one, with a Dask client the server has no use for.
        handle = await in_thread(start_cluster, owner_pid=os.getpid(), **data)
        if handle.reused:
            self.fail(
                409,
                f"cluster {handle.name!r} is already running and would be reused; "
                "give the new cluster another name",
            )
            return
        self.set_status(201)
        self.finish(await describe(handle))


class ClusterHandler(ApiBase):
    @api_verb
    async def get(self, name: str) -> None:
        self.finish(await describe(await self.handle(name)))

    @api_verb
    async def delete(self, name: str) -> None:
        handle = await self.handle(name)
        await in_thread(handle.stop)
        self.set_status(204)
        self.finish()


class ActionHandler(ApiBase):
    """scale / adapt / restart: the `ClusterHandle` methods, which check the values."""

    @api_verb
    async def post(self, name: str, action: str) -> None:
        handle = await self.handle(name)  # its methods check the values, and that nbcluster started it
        if action == "scale":
            data = self.body(("workers", "kind", "force"))
            if "workers" not in data:
                raise BadArgument('scale needs a number of workers, e.g. {"workers": 3}')
            await in_thread(handle.scale, data["workers"], data.get("kind", "cpu"), force=flag(data, "force"))
        elif action == "adapt":
            data = self.body(("minimum", "maximum", "force"))
            # Checked here too only to name the body's fields in the message.
            lo, hi = parse_bounds(data.get("minimum", 0), data.get("maximum", 4), ("minimum", "maximum"))
            await in_thread(handle.adapt, lo, hi, force=flag(data, "force"))
        else:
            self.body(())
            await in_thread(handle.restart)
        self.finish(await describe(handle))


class MetricsHandler(ApiBase):
    @api_verb
    async def get(self, name: str) -> None:
        since_arg = self.get_query_argument("since", None)
        since = None
        if since_arg not in (None, ""):
            try:
                since = int(since_arg)
            except ValueError:
                raise BadArgument(f"since must be a cursor (a whole number), not {since_arg!r}") from None
        handle = await self.handle(name)
        self.finish(await handle.ametrics(since))


class StreamHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """Live updates for one sidebar: the cluster list, and metrics for the watched cluster.

    The browser sends ``{"watch": name}`` (or ``{"watch": null}``); every
    ``nbcluster.sidebar.interval`` (Dask config) the server sends ``{"type": "clusters", "clusters": [...]}`` and,
    while a cluster is watched, ``{"type": "metrics", "name": ..., "snapshot": {...}}`` with
    only the records after the previous push (at most `DETAIL_WORKERS` workers one by one,
    all of them in ``summary`` and ``bands``). A pushed cluster carries ``totals`` instead
    of its worker rows (`compact`). ``{"type": "gone", "name": ...}`` says the
    watched cluster no longer exists. The server polls; the browser only listens.
    """

    auth_resource = "nbcluster"

    def set_default_headers(self) -> None:
        """JupyterHandler's HTTP headers make no sense on a websocket upgrade."""

    def initialize(self) -> None:
        self.watch: str | None = None
        self.cursor: int | None = None
        self.task: asyncio.Task[None] | None = None

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        # Cookie-authenticated websockets carry no XSRF token; WebSocketMixin.check_origin
        # is what stops another site's page from opening this stream with our cookie.
        if not await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "read", "nbcluster")
        ):
            raise web.HTTPError(403)
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)
        self.task = asyncio.ensure_future(self.pump())

    def on_message(self, message: str | bytes) -> None:
        try:
            data = json.loads(message)
        except ValueError:
            return
        if isinstance(data, dict) and "watch" in data:
            watch = data["watch"]
            self.watch = watch if isinstance(watch, str) and watch else None
            self.cursor = None

    def on_close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def pump(self) -> None:
        while True:
            try:
                clusters = await describe_all()
                await self.write_message({"type": "clusters", "clusters": [compact(c) for c in clusters]})
                name = self.watch
                if name is not None:
                    await self.push_metrics(name, {c["name"]: c for c in clusters})
            except WebSocketClosedError:
                return
            except Exception:
                # One failed poll must not end the stream; the next tick tries again.
                self.log.exception("nbcluster stream: poll failed")
            await asyncio.sleep(config.seconds("sidebar.interval"))

    async def push_metrics(self, name: str, clusters: dict[str, Cluster]) -> None:
        cluster = clusters.get(name)
        if cluster is None:
            await self.write_message({"type": "gone", "name": name})
            self.watch = None
            return
        if cluster["state"] != "running":
            return
        handle = await in_thread(nbcluster.connect, name)
        try:
            snapshot = await asyncio.wait_for(handle.ametrics(self.cursor, DETAIL_WORKERS), INFO_TIMEOUT_S)
        except (NbclusterError, asyncio.TimeoutError):
            return
        if self.watch != name:
            return  # the browser switched clusters while we waited: this cursor is stale
        self.cursor = snapshot["cursor"]
        await self.write_message({"type": "metrics", "name": name, "snapshot": snapshot})


def setup_handlers(web_app: web.Application) -> None:
    base = url_path_join(web_app.settings["base_url"], "nbcluster")
    name = f"(?P<name>{NAME_PATTERN})"
    routes: list[tuple[str, type[web.RequestHandler]]] = [
        ("api/profiles", ProfilesHandler),
        ("api/clusters", ClustersHandler),
        (f"api/clusters/{name}", ClusterHandler),
        (f"api/clusters/{name}/(?P<action>scale|adapt|restart)", ActionHandler),
        (f"api/clusters/{name}/metrics", MetricsHandler),
        ("api/stream", StreamHandler),
        (f"dashboard/{name}/(?P<path>.*)", DashboardProxyHandler),
    ]
    web_app.add_handlers(".*$", [(url_path_join(base, path), cls) for path, cls in routes])
