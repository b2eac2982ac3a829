"""The wire formats (`nbcluster._wire`): TypeScript kept equal to them, and real payloads.

- The TypeScript interfaces of the same shapes (graphs.d.ts, tokens.ts) are parsed and
  compared with the TypedDicts field by field: name, optionality and type, nested shapes
  included. A field added, dropped or retyped on one side only fails here.
- A real supervisor's registry entry (the file and the line it reported), its scheduler's
  ``nbcluster_info`` answer and the metrics plugin's snapshots (with tasks, samples, bands,
  runs and groups in them) are checked against the types at run time (`_wire.problems`):
  every required key present with its declared type, and no key the types do not declare.
  The REST answers of a real Jupyter server are checked in test_server.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest

from nbcluster import _wire
from nbcluster._wire import ClusterState, RegistryEntry, Snapshot, problems
from nbcluster.cluster.gpu import GPU
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.cluster.spec import ClusterSpec
from nbcluster.metrics.basic import basic_snapshot
from tests.waiting import waited_for

ROOT = Path(__file__).resolve().parent.parent

# -- TypeScript: a reader for the interfaces we write ---------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<str>'[^']*'|\"[^\"]*\")|(?P<name>[A-Za-z_$][\w$.]*)|(?P<punct>[{}\[\]()<>|;:?,.]))")


def _tokens(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        assert m, f"cannot read TypeScript at: {text[pos:pos + 40]!r}"
        tok = m.group("str") or m.group("name") or m.group("punct")
        out.append("'" + tok[1:-1] + "'" if m.group("str") else tok)
        pos = m.end()
    return out


class _Reader:
    """Interface bodies and the type expressions in them, as canonical strings."""

    def __init__(self, tokens: list[str]):
        self.t, self.i = tokens, 0

    def peek(self) -> str:
        return self.t[self.i]

    def take(self, expected: str | None = None) -> str:
        tok = self.t[self.i]
        assert expected is None or tok == expected, f"expected {expected!r}, found {tok!r} at token {self.i}"
        self.i += 1
        return tok

    def members(self) -> dict[str, tuple[bool, str]]:
        self.take("{")
        fields: dict[str, tuple[bool, str]] = {}
        while self.peek() != "}":
            name = self.take()
            optional = self.peek() == "?"
            if optional:
                self.take("?")
            self.take(":")
            fields[name] = (optional, self.type())
            if self.peek() in (";", ","):
                self.take()
        self.take("}")
        return fields

    def type(self) -> str:
        arms = [self.array()]
        while self.peek() == "|":
            self.take("|")
            arms.append(self.array())
        return "|".join(sorted(set(arms)))

    def array(self) -> str:
        t = self.primary()
        while self.peek() == "[" and self.t[self.i + 1] == "]":
            self.take("[")
            self.take("]")
            t = f"({t})[]" if "|" in t else f"{t}[]"
        return t

    def primary(self) -> str:
        tok = self.peek()
        if tok == "{":
            return _object(self.members())
        if tok == "[":
            self.take("[")
            items = [self.type()]
            while self.peek() == ",":
                self.take(",")
                items.append(self.type())
            self.take("]")
            return "[" + ",".join(items) + "]"
        if tok == "(":
            self.take("(")
            t = self.type()
            self.take(")")
            return t
        if tok == "import":  # import('./graphs').Snapshot: the name is what counts
            self.take("import")
            self.take("(")
            self.take()
            self.take(")")
            self.take(".")
            return self.take()
        name = self.take()
        if self.peek() == "<":
            self.take("<")
            args = [self.type()]
            while self.peek() == ",":
                self.take(",")
                args.append(self.type())
            self.take(">")
            return f"{name}<{','.join(args)}>"
        return name


def _object(fields: dict[str, tuple[bool, str]]) -> str:
    return "{" + ";".join(f"{k}{'?' if opt else ''}:{t}" for k, (opt, t) in sorted(fields.items())) + "}"


def ts_interfaces(path: Path) -> dict[str, dict[str, tuple[bool, str]]]:
    """Every ``export interface`` of a TypeScript file: field -> (optional, canonical type)."""
    text = path.read_text()
    found = {}
    for m in re.finditer(r"export interface (\w+) \{", text):
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(text)):  # the body: up to the matching brace
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        found[m.group(1)] = _Reader(_tokens(text[m.end() - 1 : end + 1])).members()
    return found


# -- Python: the same canonical strings from the TypedDicts --------------------------------

_TS_NAME = {cls: ts for cls, (_, ts) in _wire.TS_NAMES.items()}
_PRIMITIVE = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def py_fields(td: Any) -> dict[str, tuple[bool, str]]:
    hints = typing.get_type_hints(td)
    return {k: (k not in td.__required_keys__, py_type(hint)) for k, hint in hints.items()}


def py_type(hint: Any) -> str:
    if hint in _PRIMITIVE:
        return _PRIMITIVE[hint]
    if hint is Any:
        return "unknown"
    if typing.is_typeddict(hint):
        return _TS_NAME.get(hint.__name__) or _object(py_fields(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        return "|".join(sorted({py_type(a) for a in args}))
    if origin is Literal:
        return "|".join(sorted({("true" if a else "false") if isinstance(a, bool) else f"'{a}'" for a in args}))
    if origin is list:
        t = py_type(args[0])
        return f"({t})[]" if "|" in t else f"{t}[]"
    if origin is tuple:
        return "[" + ",".join(py_type(a) for a in args) + "]"
    if origin is dict:
        return f"Record<{py_type(args[0])},{py_type(args[1])}>"
    raise AssertionError(f"no TypeScript for {hint!r}")


def drift(cls: str) -> list[str]:
    """How the TypeScript interface of `_wire.<cls>` differs from it, one line per field."""
    file, ts_name = _wire.TS_NAMES[cls]
    interfaces = ts_interfaces(ROOT / file)
    if ts_name not in interfaces:
        return [f"{file}: no interface {ts_name} (nbcluster._wire.{cls})"]
    ts, py = interfaces[ts_name], py_fields(getattr(_wire, cls))
    out = []
    for key in sorted(ts.keys() | py.keys()):
        where = f"{file}: {ts_name}.{key} (nbcluster._wire.{cls})"
        if key not in ts:
            out.append(f"{where}: missing in TypeScript")
        elif key not in py:
            out.append(f"{where}: not in Python")
        elif ts[key][0] != py[key][0]:
            out.append(f"{where}: {'optional' if ts[key][0] else 'required'} in TypeScript, "
                       f"{'optional' if py[key][0] else 'required'} in Python")  # fmt: skip
        elif ts[key][1] != py[key][1]:
            out.append(f"{where}: {ts[key][1]} in TypeScript, {py[key][1]} in Python")
    return out


@pytest.mark.parametrize("cls", sorted(_wire.TS_NAMES))
def test_the_typescript_interface_is_the_typeddict_field_by_field(cls: str) -> None:
    assert drift(cls) == []


def test_the_reader_sees_nested_shapes_and_optional_fields() -> None:
    # The comparison is only as good as the reader: a shape it flattened or skipped would
    # compare equal to anything.
    fields = ts_interfaces(ROOT / "labextension/src/tokens.ts")["ICluster"]
    assert fields["adaptive"] == (True, "null|{gpu_maximum?:number;maximum:number;minimum:number}")
    assert fields["workers"] == (True, "IWorker[]") and fields["state"] == (False, "'running'|'unreachable'")
    assert ts_interfaces(ROOT / "nbcluster/widgets/static/graphs.d.ts")["Band"]["cpu"] == (
        False, "[number,number,number]|null",
    )  # fmt: skip


def test_the_dataclasses_sent_as_dicts_have_the_typeddicts_keys() -> None:
    # ClusterSpec.to_dict and GPU.to_dict are typed as SpecFields and GpuDevice by a cast.
    assert [f.name for f in dataclasses.fields(ClusterSpec)] == list(typing.get_type_hints(_wire.SpecFields))
    assert [f.name for f in dataclasses.fields(GPU)] == list(typing.get_type_hints(_wire.GpuDevice))


def test_problems_names_each_missing_undeclared_and_mistyped_key() -> None:
    sample = {"worker": "tls://a:1", "time": 1.0, "cpu": 5, "memory": 10, "memory_limit": 0,
              "net_read": 0.0, "net_write": 0.0}  # fmt: skip
    assert problems(sample, _wire.ResourceSample) == []
    broken = {**sample, "memory": "10", "gpu": 1}
    del broken["time"]
    assert problems(broken, _wire.ResourceSample) == [
        "$: missing key 'time' (ResourceSample)",
        "$: undeclared key 'gpu' (ResourceSample)",
        "$.memory: str '10', expected int",
    ]
    # msgpack's tuples pass for lists; a bool is no number.
    assert problems((1.0, 2.0, 3.0), _wire.Spread) == [] and problems([True], list[int]) == ["$[0]: bool True, expected int"]


# -- real payloads ----------------------------------------------------------------------------


def test_a_real_supervisors_registry_entry_is_a_registry_entry(cluster: ClusterHandle) -> None:
    assert cluster.directory is not None
    on_disk = json.loads((cluster.directory / f"{cluster.name}.json").read_text())
    for entry in (on_disk, cluster.entry):  # the file, and the line the supervisor reported
        assert problems(entry, RegistryEntry) == []
        assert entry["state"] == "running" and entry["external"] is False
        assert {"tls", "address", "dashboard", "gpus"} <= entry.keys()


def test_a_real_info_answer_is_a_cluster_state(cluster: ClusterHandle) -> None:
    info = cluster.info().to_dict()
    assert problems(info, ClusterState) == []
    assert len(info["workers"]) == 2 and info["requested"] == {"cpu": 2, "gpu": 0}


def test_real_plugin_and_basic_snapshots_are_snapshots(cluster: ClusterHandle) -> None:
    since = cluster.metrics()["cursor"]
    held = cluster.client.submit(sum, [1, 2], key="wire-check-1")  # held: its group stays listed
    assert held.result() == 3
    cluster.client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.log_event(
            _wire.PROGRESS_TOPIC, {"run": "wire", "done": 1, "failed": 0, "total": 2, "state": "running", "label": None}
        )
    )

    def full() -> Snapshot | None:
        snap = cluster.metrics(since)
        return snap if snap["tasks"] and snap["resources"] and snap.get("bands") else None

    snap = waited_for(full, "snapshot with a task, samples and bands")
    assert problems(snap, Snapshot) == []
    assert [t["key"] for t in snap["tasks"]] == ["wire-check-1"]
    assert {r["run"] for r in snap.get("runs", [])} >= {"wire"} and snap.get("groups")
    # With `detail`, as the sidebar and the widget ask; and the view where the plugin is not.
    assert problems(cluster.metrics(detail=1), Snapshot) == []
    basic = waited_for(lambda: (b := basic_snapshot(cluster.rpc("identity"))) and b["resources"] and b, "basic samples")
    assert problems(basic, Snapshot) == [] and basic["basic"] is True
    del held
