"""The OpenAPI 3.1 document of the REST routes (`handlers.py`), made from the declarations.

Nothing here is written by hand that is declared elsewhere: a cluster, a metrics snapshot
and their parts are the TypedDicts of `nbcluster._wire` (turned into JSON Schema by
`schema`), the start body's fields are `START_OPTIONS` (and ``profile``), and the name rule is
`NAME_PATTERN`. The docs render this document (``docs/reference/rest-api.md``), and the
server tests validate every answer they get against it (``tests/test_server.py``), so the
reference cannot describe a shape the server does not send.

``python -m nbcluster.server.openapi`` prints it as JSON.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, Union

import nbcluster
from nbcluster import _wire
from nbcluster.cluster.kinds import KINDS
from nbcluster.cluster.spec import NAME_PATTERN, NAME_RULE, START_OPTIONS

#: The `_wire` classes that get a named schema (``#/components/schemas/NAME``); others are inline.
COMPONENTS = (
    "Cluster", "WorkerRow", "GpuDevice", "SpecFields", "Requested", "Bounds", "TaskCounts", "Totals",
    "Snapshot", "SnapshotWorker", "SnapshotGpu", "TaskRecord", "ResourceSample", "Band", "Summary",
    "HostTotals", "RunProgress", "GroupProgress",
)  # fmt: skip
_REF = "#/components/schemas/"
_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    None: {"type": "null"},
}


def schema(shape: Any) -> dict[str, Any]:
    """The JSON Schema (2020-12, as OpenAPI 3.1 uses it) of a `_wire` annotation.

    Parameters
    ----------
    shape : type or typing annotation
        A TypedDict of `nbcluster._wire`, or any annotation those use (``int | None``,
        ``list[WorkerRow]``, ``Literal["cpu", "gpu"]``, ``dict[str, int]``, a fixed tuple).

    Returns
    -------
    dict
        The schema; a class named in `COMPONENTS` is a ``$ref`` to its component. A
        TypedDict allows no undeclared key, as `nbcluster._wire.problems` does not.

    Raises
    ------
    TypeError
        For an annotation JSON cannot carry.

    Examples
    --------
    >>> schema(int | None)
    {'anyOf': [{'type': 'integer'}, {'type': 'null'}]}
    """
    if shape is Any or shape is object:
        return {}
    if shape in _SCALARS:
        return dict(_SCALARS[shape])
    if typing.is_typeddict(shape):
        if shape.__name__ in COMPONENTS:
            return {"$ref": _REF + shape.__name__}
        return _object(shape)
    origin, args = typing.get_origin(shape), typing.get_args(shape)
    if origin is Union or origin is types.UnionType:
        return {"anyOf": [schema(arm) for arm in args]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list or (origin is tuple and args[-1:] == (Ellipsis,)):
        return {"type": "array", "items": schema(args[0])}
    if origin is tuple:
        return {
            "type": "array",
            "prefixItems": [schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin is dict:
        return {"type": "object", "additionalProperties": schema(args[1])}
    raise TypeError(f"no JSON Schema for {shape!r}")


def _object(shape: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(shape)
    out: dict[str, Any] = {
        "type": "object",
        "properties": {key: schema(hint) for key, hint in hints.items()},
        "required": sorted(shape.__required_keys__),
        "additionalProperties": False,
    }
    doc = (shape.__doc__ or "").strip()
    if doc and doc != (typing.TypedDict.__doc__ or "").strip() and not doc.startswith(shape.__name__ + "("):
        out["description"] = " ".join(doc.split())
    return out


def _json(shape: Any, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema(shape)}}}


_ERROR = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "what went wrong and what to do"}},
    "required": ["message"],
}


def _errors(*codes: int) -> dict[str, Any]:
    meaning = {
        400: "a bad body or value (a size above the limits too)",
        403: "not logged in to Jupyter, or the authorizer refuses (resource `nbcluster`)",
        404: "no cluster of that name",
        409: "a cluster of that name is already running",
        503: "the cluster's scheduler does not answer",
    }
    return {
        str(code): {
            "description": meaning[code],
            "content": {"application/json": {"schema": {"$ref": _REF + "Error"}}},
        }
        for code in (*codes, 403)
    }


def _body(properties: dict[str, Any], example: dict[str, Any]) -> dict[str, Any]:
    body = {"type": "object", "properties": properties, "additionalProperties": False}
    return {"required": False, "content": {"application/json": {"schema": body, "example": example}}}


def _start_field(option: Any) -> dict[str, Any]:
    if option.switch:
        kind: dict[str, Any] = {"type": "boolean"}
    elif option.field in ("workers", "threads", "gpus_per_worker", "gpu_threads"):
        kind = {"type": ["integer", "string"]}
    elif option.field in ("memory", "gpu_workers"):
        kind = {"type": ["integer", "string", "null"]}
    else:
        kind = {"type": ["string", "null"]}
    return {**kind, "description": option.help}


_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": NAME_PATTERN},
}
_FORCE = {"type": "boolean", "description": "go past the limits derived from the server's machine"}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of nbcluster's REST routes.

    Returns
    -------
    dict
        JSON-ready: paths relative to ``<base_url>nbcluster/``, every answer's schema, and
        the components of `COMPONENTS` plus ``Error``.

    Examples
    --------
    >>> doc = document()
    >>> sorted(doc["paths"])[:2]
    ['/api/clusters', '/api/clusters/{name}']
    """
    cluster = _json(_wire.Cluster, "the cluster")
    start_fields = {o.field: _start_field(o) for o in START_OPTIONS}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "nbcluster server extension",
            "version": nbcluster.__version__,
            "description": (
                "Every route lives under `<base_url>nbcluster/` and requires Jupyter's own authentication "
                "(an `Authorization: token ...` header, or the login cookie plus the XSRF token for "
                "state-changing verbs). Each route is also checked with the server's authorizer as resource "
                "`nbcluster`: action `read` for GET, `write` for the rest."
            ),
        },
        "servers": [{"url": "/nbcluster", "description": "below the Jupyter server's base_url"}],
        "paths": {
            "/api/profiles": {"get": {
                "summary": "Where clusters can run: the backend profiles in the server's Dask config",
                "responses": {"200": {"description": "the profiles and the cluster-name rule", "content": {
                    "application/json": {"schema": {
                        "type": "object", "additionalProperties": False,
                        "required": ["profiles", "name_pattern", "name_rule"],
                        "properties": {
                            "profiles": {"type": "array", "items": {
                                "type": "object", "additionalProperties": False,
                                "required": ["name", "backend", "description"],
                                "properties": {k: {"type": "string"} for k in ("name", "backend", "description")},
                            }},
                            "name_pattern": {"type": "string", "const": NAME_PATTERN},
                            "name_rule": {"type": "string", "const": NAME_RULE},
                        },
                    }}}}, **_errors()},
            }},
            "/api/clusters": {
                "get": {
                    "summary": "Every running cluster, whoever started it",
                    "responses": {"200": {"description": "the clusters", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["clusters"], "additionalProperties": False,
                        "properties": {"clusters": schema(list[_wire.Cluster])},
                    }}}}, **_errors()},
                },
                "post": {
                    "summary": "Start a cluster, owned by the Jupyter server (all fields optional)",
                    "requestBody": _body(start_fields, {"workers": 2, "name": "demo"}),
                    "responses": {"201": cluster, **_errors(400, 409)},
                },
            },
            "/api/clusters/{name}": {
                "parameters": [_NAME],
                "get": {"summary": "One cluster", "responses": {"200": cluster, **_errors(404, 503)}},
                "delete": {
                    "summary": "Stop the cluster and its workers",
                    "responses": {"204": {"description": "stopped"}, **_errors(400, 404, 503)},
                },
            },
            "/api/clusters/{name}/scale": {"parameters": [_NAME], "post": {
                "summary": "Set the number of workers of a kind (turns adaptive scaling off)",
                "requestBody": _body({
                    "workers": {"type": ["integer", "string"], "description": "number of workers (required)"},
                    "kind": {"enum": list(KINDS), "description": "worker kind (default: cpu)"},
                    "force": _FORCE,
                }, {"workers": 3, "kind": "cpu", "force": False}),
                "responses": {"200": cluster, **_errors(400, 404, 503)},
            }},
            "/api/clusters/{name}/adapt": {"parameters": [_NAME], "post": {
                "summary": "Scale CPU workers automatically between minimum and maximum",
                "requestBody": _body({
                    "minimum": {"type": ["integer", "string"], "description": "fewest workers (default: 0)"},
                    "maximum": {"type": ["integer", "string"], "description": "most workers (default: 4)"},
                    "force": _FORCE,
                }, {"minimum": 1, "maximum": 8, "force": False}),
                "responses": {"200": cluster, **_errors(400, 404, 503)},
            }},
            "/api/clusters/{name}/restart": {"parameters": [_NAME], "post": {
                "summary": "Restart the workers (the cluster stays)",
                "requestBody": _body({}, {}),
                "responses": {"200": cluster, **_errors(400, 404, 503)},
            }},
            "/api/clusters/{name}/metrics": {"parameters": [_NAME], "get": {
                "summary": "What is new in the cluster's metrics since a cursor",
                "parameters": [{
                    "name": "since", "in": "query", "required": False, "schema": {"type": "integer"},
                    "description": "the `cursor` of the previous snapshot; absent: everything kept",
                }],
                "responses": {"200": _json(_wire.Snapshot, "the metrics snapshot"), **_errors(400, 404, 503)},
            }},
        },
        "components": {"schemas": {
            "Error": _ERROR,
            **{name: _object(getattr(_wire, name)) for name in COMPONENTS},
        }},
    }  # fmt: skip


def response_schema(method: str, path: str, status: int) -> dict[str, Any] | None:
    """The schema `document` declares for the JSON answer of ``METHOD path`` with `status`.

    Parameters
    ----------
    method : str
        ``GET``, ``POST``, ...
    path : str
        Below ``<base_url>nbcluster/``, e.g. ``api/clusters/demo/scale`` (a query is ignored).
    status : int
        The answer's HTTP status.

    Returns
    -------
    dict or None
        A schema whose ``$ref`` point into ``document()["components"]``; None for an
        answer with no body (204).

    Raises
    ------
    KeyError
        If the document declares no such route, method or status: an undocumented answer.

    Examples
    --------
    >>> response_schema("GET", "api/clusters/demo", 200)
    {'$ref': '#/components/schemas/Cluster'}
    """
    doc = document()
    parts = path.split("?")[0].strip("/").split("/")
    for template, item in doc["paths"].items():
        pattern = template.strip("/").split("/")
        if len(pattern) == len(parts) and all(
            p == q or p.startswith("{") for p, q in zip(pattern, parts, strict=True)
        ):
            answer = item[method.lower()]["responses"][str(status)]
            content = answer.get("content")
            return None if content is None else dict(content["application/json"]["schema"])
    raise KeyError(f"{method} {path}: not a route of the OpenAPI document")


if __name__ == "__main__":
    print(json.dumps(document(), indent=1))
