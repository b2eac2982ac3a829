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

from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

import nbcluster
from nbcluster import config
from nbcluster._threads import in_thread
from nbcluster._wire import Cluster
from nbcluster.cluster import profiles as declared
from nbcluster.cluster.handle import start as start_cluster
from nbcluster.cluster.info import cluster_totals, runs_on
from nbcluster.cluster.spec import NAME_PATTERN, NAME_RULE, START_OPTIONS, parse_bounds
from nbcluster.errors import BadArgument, ClusterNotFound, ClusterUnreachable, NbclusterError
from nbcluster.server._auth import RESOURCE, may_read
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
    """The backend profiles the start form offers: those in this server's Dask config.

    Returns
    -------
    list of dict
        ``name``, ``backend``, ``description`` of each (`Profile.to_dict`).
    """
    return [p.to_dict() for p in declared.all()]


async def describe(handle: ClusterHandle) -> Cluster:
    """One cluster for the browser; never raises for a scheduler that does not answer.

    Parameters
    ----------
    handle : ClusterHandle
        The cluster.

    Returns
    -------
    Cluster
        Its state, with ``runs_on`` and ``totals`` (`nbcluster._wire.Cluster`); the
        `unreachable` form when its scheduler does not answer in time.
    """
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
    browser (the entry also holds credential paths).

    Parameters
    ----------
    handle : ClusterHandle
        The cluster.

    Returns
    -------
    Cluster
        State ``unreachable``.
    """
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
    push costs the same at 2 workers or 2,000 (the card shows only totals).

    Parameters
    ----------
    cluster : Cluster
        As `describe` makes it.

    Returns
    -------
    Cluster
        A copy without ``workers`` and ``host_memory``.
    """
    out = cluster.copy()
    out.pop("workers", None)
    out.pop("host_memory", None)
    return out


async def describe_all() -> list[Cluster]:
    """Every registered cluster, described at once (`describe`).

    Returns
    -------
    list of Cluster
        In the registry's order.
    """
    handles = await in_thread(nbcluster.clusters)
    return list(await asyncio.gather(*(describe(h) for h in handles)))


def flag(data: dict[str, Any], key: str) -> bool:
    """A true/false field of a request body (absent: false).

    Parameters
    ----------
    data : dict
        The request body.
    key : str
        The field.

    Returns
    -------
    bool
        Its value.

    Raises
    ------
    BadArgument
        When it is not a JSON boolean.
    """
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise BadArgument(f"{key} must be true or false")
    return value


def api_errors(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Answer an `NbclusterError` with its status and its one-line message as JSON.

    The message is written directly instead of raising `web.HTTPError`, whose log message is
    %-formatted by Tornado: a user's value containing '%' must not break the reply.

    Parameters
    ----------
    method : coroutine function
        A handler's verb.

    Returns
    -------
    coroutine function
        The same verb, answering nbcluster's errors as ``{"message": ...}`` with their status.
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
    `api_errors`. Every verb of `ApiBase` goes through it, so none can miss a check.

    Parameters
    ----------
    method : coroutine function
        A handler's verb.

    Returns
    -------
    coroutine function
        The checked verb.
    """
    return web.authenticated(authorized(api_errors(method)))


class ApiBase(APIHandler):
    """JSON in and out.

    Every verb is an `api_verb`: `authenticated` (who are you) and `authorized` (may you):
    a server with a custom authorizer (e.g. JupyterHub's scopes) can grant "read" or
    "write" on the "nbcluster" resource, as for Jupyter's own "kernels" or "contents".
    """

    auth_resource = RESOURCE

    def fail(self, status: int, message: str) -> None:
        """Answer with `status` and ``{"message": message}``, and log it.

        Parameters
        ----------
        status : int
            The HTTP status.
        message : str
            One line that says what to do.
        """
        self.log.info("nbcluster: %s %s -> %d %s", self.request.method, self.request.path, status, message)
        self.set_status(status)
        self.finish({"message": message})

    def body(self, allowed: tuple[str, ...]) -> dict[str, Any]:
        """The request's JSON object, restricted to `allowed` keys.

        Parameters
        ----------
        allowed : tuple of str
            The fields the route takes.

        Returns
        -------
        dict
            The body (``{}`` when empty).

        Raises
        ------
        BadArgument
            For a body that is not a JSON object, or with unknown fields (naming the allowed ones).
        """
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
        """The handle of the cluster the URL names.

        Parameters
        ----------
        name : str
            The cluster's name.

        Returns
        -------
        ClusterHandle
            Connected.

        Raises
        ------
        ClusterNotFound
            When no running cluster has that name (answered 404).
        """
        return await in_thread(nbcluster.connect, name)


class ProfilesHandler(ApiBase):
    @api_verb
    async def get(self) -> None:
        """``GET api/profiles``: the profiles and the name rule the start form uses."""
        # The name rule travels with the profiles, so the start form's hint is the server's rule.
        self.finish({"profiles": profiles(), "name_pattern": NAME_PATTERN, "name_rule": NAME_RULE})


class ClustersHandler(ApiBase):
    @api_verb
    async def get(self) -> None:
        """``GET api/clusters``: every cluster, whoever started it."""
        self.finish({"clusters": await describe_all()})

    @api_verb
    async def post(self) -> None:
        """``POST api/clusters``: start a cluster owned by this server (the start options as JSON)."""
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
        """``GET api/clusters/NAME``: one cluster, with a row per worker.

        Parameters
        ----------
        name : str
            The cluster's name (from the URL).
        """
        self.finish(await describe(await self.handle(name)))

    @api_verb
    async def delete(self, name: str) -> None:
        """``DELETE api/clusters/NAME``: stop it (204).

        Parameters
        ----------
        name : str
            The cluster's name (from the URL).
        """
        handle = await self.handle(name)
        await in_thread(handle.stop)
        self.set_status(204)
        self.finish()


class ActionHandler(ApiBase):
    """scale / adapt / restart: the `ClusterHandle` methods, which check the values."""

    @api_verb
    async def post(self, name: str, action: str) -> None:
        """``POST api/clusters/NAME/scale|adapt|restart``: change a running cluster.

        Parameters
        ----------
        name : str
            The cluster's name (from the URL).
        action : str
            ``scale`` (``workers``, ``kind``, ``force``), ``adapt`` (``minimum``,
            ``maximum``, ``force``) or ``restart``.
        """
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
        """``GET api/clusters/NAME/metrics?since=CURSOR``: a metrics snapshot.

        Parameters
        ----------
        name : str
            The cluster's name (from the URL).
        """
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

    auth_resource = RESOURCE

    def set_default_headers(self) -> None:
        """JupyterHandler's HTTP headers make no sense on a websocket upgrade."""

    def initialize(self) -> None:
        """Tornado's hook: nothing watched yet."""
        self.watch: str | None = None
        self.cursor: int | None = None
        self.task: asyncio.Task[None] | None = None

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """The websocket upgrade, for a user authorized to read nbcluster.

        Parameters
        ----------
        *args, **kwargs
            Tornado's.

        Raises
        ------
        tornado.web.HTTPError
            403 when not authorized.
        """
        # Cookie-authenticated websockets carry no XSRF token; WebSocketMixin.check_origin
        # is what stops another site's page from opening this stream with our cookie.
        if not await may_read(self):
            raise web.HTTPError(403)
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        """Start pushing the cluster list (and the watched cluster's metrics).

        Parameters
        ----------
        *args, **kwargs
            Tornado's.
        """
        super().open(*args, **kwargs)
        self.task = asyncio.ensure_future(self.pump())

    def on_message(self, message: str | bytes) -> None:
        """``{"watch": NAME}`` picks the cluster whose metrics are pushed (null: none).

        Parameters
        ----------
        message : str or bytes
            JSON from the sidebar; anything else is ignored.
        """
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
        """Push the clusters every ``nbcluster.sidebar.interval``, until the socket closes."""
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
        """Push what is new of the watched cluster's metrics, or that it is gone.

        Parameters
        ----------
        name : str
            The watched cluster.
        clusters : dict
            This poll's clusters by name.
        """
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
    """Add nbcluster's routes (REST, stream, dashboard proxy) under ``BASE_URL/nbcluster/``.

    Parameters
    ----------
    web_app : tornado.web.Application
        The Jupyter server's application.
    """
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
