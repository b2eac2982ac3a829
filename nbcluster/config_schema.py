"""The schema of nbcluster's settings, read from `nbcluster.yaml` itself.

The shipped defaults are the one source of truth: each setting is a key of that file, its
default is the value there, and its description is the comment block just above it (or
on its line). Its kind comes from the default (``2s``: a duration, ``5000``: a whole
number, ``true``: a switch); where the default cannot say (``null``, or a mapping whose
keys are the user's own, such as ``profiles``), the description ends with the kind in
brackets: ``[count]``, ``[size]``, ``[mapping]``, ``[path]``.

`unknown` finds the keys of a config (the merged `nbcluster` section of Dask's config) that
are no setting, naming the nearest one; `expected` says what a value of the wrong kind
should be.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from dask.utils import parse_bytes, parse_timedelta

DEFAULTS = Path(__file__).with_name("nbcluster.yaml")

#: What each kind accepts, for the message of a value that is not one.
KINDS = {
    "duration": "a duration such as 2s or 500ms",
    "count": "a whole number",
    "size": "a size such as 64GiB",
    "switch": "true or false",
    "mapping": "a mapping of names to values",
    "path": "a folder path",
}
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_-]+):(?P<rest>.*)$")
_TAG = re.compile(r"\s*\[(?P<kind>[a-z]+)\]$")


@dataclass(frozen=True)
class Setting:
    """One setting: its dotted key below ``nbcluster.``, shipped default, kind and meaning."""

    key: str
    default: Any
    kind: str
    description: str


def canonical(key: str) -> str:
    """`key` as Dask matches it: ``max_tasks`` (an environment variable's spelling) is ``max-tasks``.

    Parameters
    ----------
    key : str
        A dotted key below ``nbcluster.``.

    Returns
    -------
    str
        The key with ``-`` for every ``_``.

    Examples
    --------
    >>> canonical("widget.max_tasks")
    'widget.max-tasks'
    """
    return key.replace("_", "-")


def _comments(text: str) -> Iterator[tuple[tuple[str, ...], str]]:
    """Each key path of the YAML `text` with the comment block above it and on its line."""
    path: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped[2:] if stripped.startswith("# ") else stripped[1:])
            continue
        match = _KEY.match(line)
        if match is None:  # a blank line, or a value continued: the block above is no key's
            block = []
            continue
        depth = len(match["indent"]) // 2
        path[depth:] = [match["key"]]
        _, _, inline = match["rest"].partition(" #")
        yield tuple(path), "\n".join([*block, inline.strip()] if inline else block).strip()
        block = []


def _kind(default: Any, tag: str | None) -> str:
    if tag:
        return tag
    if isinstance(default, bool):
        return "switch"
    if isinstance(default, int):
        return "count"
    if isinstance(default, str):
        try:
            parse_timedelta(default)
            return "duration"
        except (ValueError, KeyError):
            parse_bytes(default)  # nbcluster.yaml holds no other strings: fail loudly here
            return "size"
    if isinstance(default, Mapping):
        return "section"
    raise ValueError(f"nbcluster.yaml: the kind of {default!r} needs a [kind] tag")


def load(path: Path = DEFAULTS) -> dict[str, Setting]:
    """Every setting of the YAML at `path` (nbcluster's own defaults), by dotted key.

    Sections (``widget``) are settings of kind ``section``. A key's meaning is the comment
    block above it (and on its line); a ``[kind]`` tag there names a kind the default cannot
    show.

    Parameters
    ----------
    path : pathlib.Path
        The YAML file; the shipped ``nbcluster.yaml`` by default.

    Returns
    -------
    dict of str to Setting
        Dotted key below ``nbcluster.`` -> the setting: its key, default, kind and
        description.

    Raises
    ------
    ValueError
        When a default's kind cannot be told and has no ``[kind]`` tag (a mistake in the
        shipped file).
    """
    text = path.read_text()
    defaults = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["nbcluster"]
    settings: dict[str, Setting] = {}
    for keys, comment in _comments(text):
        key = ".".join(keys[1:])
        if keys[0] != "nbcluster" or not key or _inside_mapping(key, settings):
            continue
        default: Any = defaults
        for part in keys[1:]:
            default = default[part]
        tag = _TAG.search(comment)
        description = comment[: tag.start()] if tag else comment
        settings[key] = Setting(key, default, _kind(default, tag["kind"] if tag else None), description)
    return settings


def _inside_mapping(key: str, settings: Mapping[str, Setting]) -> bool:
    """Whether `key` lies in a mapping of the user's own names (``profiles.local``)."""
    parts = key.split(".")
    return any(
        (s := settings.get(".".join(parts[:depth]))) is not None and s.kind == "mapping"
        for depth in range(1, len(parts))
    )


def expected(setting: Setting, value: Any) -> str | None:
    """What `value` of `setting` should be instead ("a duration such as 2s"), or None if it is one.

    Parameters
    ----------
    setting : Setting
        The setting.
    value : Any
        Its value as set (None, unset, is always accepted).

    Returns
    -------
    str or None
        What its kind asks for, for the message; None when `value` is acceptable.
    """
    return None if _accepts(setting.kind, value) else KINDS.get(setting.kind, "a mapping of settings")


def _accepts(kind: str, value: Any) -> bool:
    if value is None:
        return True  # unset: the code falls back to the default's meaning
    if kind == "switch":  # an environment variable's `false` stays a string in Dask's config
        return isinstance(value, bool) or (
            isinstance(value, str) and value.strip().lower() in ("true", "false")
        )
    if isinstance(value, bool):
        return False
    if kind in ("section", "mapping"):
        return isinstance(value, Mapping)
    if kind == "path":
        return isinstance(value, str | os.PathLike)
    if kind == "count":  # the bounds are the reader's (`config.as_count`)
        return isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())
    if isinstance(value, (int, float)):
        return True
    try:
        (parse_timedelta if kind == "duration" else parse_bytes)(value)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def unknown(section: Mapping[str, Any], settings: Mapping[str, Setting]) -> Iterator[str]:
    """A one-line message for each key of `section` that is no setting, naming the nearest one.

    Parameters
    ----------
    section : Mapping of str to Any
        The ``nbcluster`` mapping of a Dask config.
    settings : Mapping of str to Setting
        The known settings (`settings()`).

    Returns
    -------
    Iterator of str
        ``nbcluster: unknown setting 'nbcluster.widget.dealy' (did you mean
        'nbcluster.widget.delay'?); it is ignored``, one per unknown key.
    """
    return _unknown(section, {canonical(key): s for key, s in settings.items()}, "")


def _unknown(section: Mapping[str, Any], known: Mapping[str, Setting], below: str) -> Iterator[str]:
    for name, value in section.items():
        key = f"{below}{name}"
        setting = known.get(canonical(key))
        if setting is None and isinstance(value, Mapping) and value:
            yield from _unknown(value, known, f"{key}.")  # name the settings under an unknown section
        elif setting is None:
            near = difflib.get_close_matches(canonical(key), list(known), n=1, cutoff=0.7)
            hint = f" (did you mean 'nbcluster.{known[near[0]].key}'?)" if near else ""
            yield f"nbcluster: unknown setting 'nbcluster.{key}'{hint}; it is ignored"
        elif setting.kind == "section" and isinstance(value, Mapping):
            yield from _unknown(value, known, f"{setting.key}.")


@functools.cache
def settings() -> dict[str, Setting]:
    """nbcluster's settings (`load` of the shipped `nbcluster.yaml`), read once a process, at
    the first setting it reads: a process that reads none (a plain worker) never parses them."""
    return load()
