"""nbcluster's settings, kept in Dask's config under `nbcluster.` (defaults: `nbcluster.yaml`).

Importing this module registers the defaults, as dask-jobqueue does with `jobqueue.yaml`;
users override them in `~/.config/dask/*.yaml`, `/etc/dask/*.yaml` or `DASK_NBCLUSTER__...`
variables. Code reads a key where it needs it (`get("distribute.cancel-grace")`), so a
`dask.config.set` in a notebook takes effect for the next cell.

Site settings. Dask merges its config folders with the user's own (`~/.config/dask`,
`DASK_CONFIG`) above the site's (`/etc/dask`, or `$DASK_ROOT_CONFIG` in its place), so
through `get` a student's file outranks an instructor's. For the few settings that are an
administrator's decision (`nbcluster.limits.*`, `nbcluster.defaults.*`), `site` reads the
site files themselves, every time it is asked: `/etc/dask` and `$DASK_ROOT_CONFIG` both
(setting the variable adds a folder, it cannot hide `/etc/dask`). The caller combines what
it finds with the user's view so that the user can only go below it (`cluster/limits.py`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

from nbcluster import config_schema
from nbcluster.errors import BadArgument, SettingWarning

#: PyYAML's safe loader in C (libyaml), where PyYAML was built with it: the same documents,
#: the same constructors, an order of magnitude faster than its pure Python one.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

with config_schema.DEFAULTS.open() as _f:
    _SHIPPED: dict[str, Any] = yaml.load(_f, Loader=SAFE_LOADER)
dask.config.update_defaults(_SHIPPED)

#: The unknown-setting messages already given: each is given once a process.
_warned: set[str] = set()
_checked: dict[str, Any] | None = None  # a copy of the `nbcluster` section as `warn_unknown` last checked it
_values: dict[str, Any] = {}  # setting -> its value, checked, while the section is as `_checked` says


def get(key: str) -> Any:
    """The value of `nbcluster.<key>`; a `BadArgument` if it is not of the setting's kind.

    Falls back to the shipped default: a ``with dask.config.set({"nbcluster...": ...})``
    entered before nbcluster was imported restores, on leaving, the config it saw on
    entering, which had no ``nbcluster`` section, and so drops the defaults registered since.

    Parameters
    ----------
    key : str
        The setting's key below ``nbcluster.``, such as ``"widget.delay"``.

    Returns
    -------
    Any
        Its value from Dask config (YAML files, ``DASK_NBCLUSTER__`` variables,
        ``dask.config.set``), else the shipped default.

    Raises
    ------
    nbcluster.errors.BadArgument
        When the value is not of the setting's kind; the message says what to set it to.

    Examples
    --------
    >>> get("widget.delay")
    '750ms'
    """
    memo = _checked_values()
    if memo is not None and key in memo:
        return memo[key]
    try:
        value = dask.config.get(f"nbcluster.{key}")
    except KeyError:
        value = dask.config.get(f"nbcluster.{key}", config=_SHIPPED)
    setting = config_schema.settings().get(key)
    wanted = None if setting is None else config_schema.expected(setting, value)
    if wanted:
        raise _bad(key, value, wanted)
    if memo is not None:
        memo[key] = value
    return value


def _checked_values() -> dict[str, Any] | None:
    """`warn_unknown`, then the values `get` checked since the section last changed (None: no
    section to fingerprint, nothing is kept): a run reads a dozen settings, each checked once."""
    global _values
    if warn_unknown():
        _values = {}  # a new one: a read under the old section still running elsewhere keeps the old
    return _values if isinstance(dask.config.config.get("nbcluster"), Mapping) else None


def warn_unknown() -> bool:
    """Warn (`SettingWarning`, once a key) about each key under `nbcluster.` that is no
    setting, wherever it came from: a YAML file, a `DASK_NBCLUSTER__` variable, or a
    `dask.config.set`; nothing reads such a key, so a typo would otherwise pass unseen.
    `get` calls it, so a process warns where it reads its settings, and after a
    `dask.config.set` at the next read.

    Returns
    -------
    bool
        Whether the ``nbcluster`` section changed since the last call (True also when there
        is no such section): `get` then checks the values it reads afresh.
    """
    global _checked
    section = dask.config.config.get("nbcluster")
    if not isinstance(section, Mapping):
        return True
    # The schema walk is ~0.25 ms, and every read calls this (a dozen times a run): walk again
    # only when the section changed. dask.config.set edits it in place, so the check compares
    # its content with a copy of what was checked (~1 us; its pickle was ~6 us). A section
    # that cannot be copied or compared counts as changed each time.
    try:
        if _checked is not None and section == _checked:
            return False
        _checked = copy.deepcopy(dict(section))
    except Exception:
        _checked = None
    for message in config_schema.unknown(section, config_schema.settings()):
        if message not in _warned:
            _warned.add(message)
            warnings.warn(message, SettingWarning, stacklevel=4)
    return True


#: The site folder Dask reads unless `DASK_ROOT_CONFIG` names another; both count here.
SITE_FOLDER = "/etc/dask"


@dataclass(frozen=True)
class SiteValue:
    """One site file's value for a setting, and the file, for messages that name it."""

    value: Any
    path: Path


def site_folders(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The folders of the site config: `/etc/dask`, and `$DASK_ROOT_CONFIG` if set.

    Parameters
    ----------
    environ : Mapping of str to str, optional
        The environment to read ``DASK_ROOT_CONFIG`` from; `os.environ` when None.

    Returns
    -------
    list of pathlib.Path
        The folders, `/etc/dask` first.
    """
    environ = os.environ if environ is None else environ
    folders = [Path(SITE_FOLDER)]
    root = environ.get("DASK_ROOT_CONFIG")
    if root and Path(root) != folders[0]:
        folders.append(Path(root))
    return folders


def site(key: str, environ: Mapping[str, str] | None = None) -> list[SiteValue]:
    """Every site file's value of `nbcluster.<key>`, in Dask's file order (empty: unset).

    Read from the files on each call, never from the merged config that a user's own
    files, `DASK_CONFIG` or a `dask.config.set` can change.

    Parameters
    ----------
    key : str
        The setting's key below ``nbcluster.``.
    environ : Mapping of str to str, optional
        The environment that names the site folders (`site_folders`).

    Returns
    -------
    list of SiteValue
        Each site file's value with its path; [] when no site file sets it.

    Raises
    ------
    nbcluster.errors.BadArgument
        When a site file cannot be read or is not a mapping: the limits it may set cannot be
        known, so the message asks the administrator to fix the file.
    """
    found = []
    for folder in site_folders(environ):
        try:
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".yaml", ".yml", ".json"))
        except OSError:  # no such folder: nothing set there
            continue
        for path in files:
            try:
                data = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as e:
                raise _bad_site(path, f"cannot be read ({type(e).__name__})") from None
            if not isinstance(data, dict):
                raise _bad_site(path, "is not a mapping of settings")
            value = dask.config.get(f"nbcluster.{key}", default=None, config=data)
            if value is not None:
                found.append(SiteValue(value, path))
    return found


def _bad_site(path: Path, what: str) -> Exception:
    return BadArgument(f"the site config {path} {what}: nbcluster's limits cannot be known; ask the administrator to fix it")


def seconds(key: str) -> float:
    """A duration setting (`50ms`, `2s` or a number of seconds) in seconds.

    Parameters
    ----------
    key : str
        The setting's key below ``nbcluster.``.

    Returns
    -------
    float
        The duration in seconds.

    Raises
    ------
    nbcluster.errors.BadArgument
        When the value is not a duration.
    """
    value = get(key)
    try:
        return float(parse_timedelta(value, default="seconds"))
    except (KeyError, ValueError, TypeError):  # dask's own errors list every unit: not one line
        raise _bad(key, value, "a duration such as 2s or 500ms") from None


def count(key: str, minimum: int = 0) -> int | None:
    """A whole-number setting, or None where it is unset (`null`).

    Parameters
    ----------
    key : str
        The setting's key below ``nbcluster.``.
    minimum : int
        The smallest value allowed.

    Returns
    -------
    int or None
        The number; None where the setting is ``null``.

    Raises
    ------
    nbcluster.errors.BadArgument
        When the value is not a whole number of at least `minimum`.
    """
    return as_count(key, get(key), minimum)


def as_count(key: str, value: Any, minimum: int = 0, where: str = "Dask config") -> int | None:
    """`value` of setting `key` as a whole number (None stays None).

    Parameters
    ----------
    key : str
        The setting's key below ``nbcluster.``, for the message.
    value : Any
        The value as set: an int or a string of digits (a bool is refused).
    minimum : int
        The smallest value allowed.
    where : str
        Where it was set (a site file's path), for the message.

    Returns
    -------
    int or None
        The number, or None when `value` is None.

    Raises
    ------
    nbcluster.errors.BadArgument
        When it is not a whole number of at least `minimum`; the message names the setting
        and where it was set.
    """
    if value is None:
        return None
    try:
        number = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise _bad(key, value, f"a whole number (at least {minimum})", where)
    return number


def _bad(key: str, value: Any, what: str, where: str = "Dask config") -> Exception:
    return BadArgument(f"nbcluster.{key} is {value!r} in {where}: set it to {what}, or remove it for the default")


def worker_pre_spawn_environ() -> dict[str, Any]:
    """Dask's pre-spawn environment for worker processes with nbcluster's additions.

    Returns
    -------
    dict of str to Any
        ``distributed.nanny.pre-spawn-environ``, updated with
        ``nbcluster.worker.pre-spawn-environ``.
    """
    merged = dict(dask.config.get("distributed.nanny.pre-spawn-environ") or {})
    merged.update(get("worker.pre-spawn-environ") or {})
    return merged


def worker_dask_config() -> dict[str, Any]:
    """The Dask config a local cluster's nanny hands its worker: this process's, with
    ``nbcluster.worker.dask-config`` over it.

    A nanny lays its ``config`` over the worker process's own section by section, so each
    section named here is whole. A null in ``dask-config`` leaves the value as it is here.

    Returns
    -------
    dict of str to Any
        The ``distributed`` section, and any other that ``dask-config`` names.
    """
    ours = _without_nulls(get("worker.dask-config") or {})
    return {
        section: dask.config.merge(dask.config.config.get(section) or {}, ours.get(section) or {})
        for section in {"distributed", *ours}
    }


def _without_nulls(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _without_nulls(v) if isinstance(v, Mapping) else v for k, v in settings.items() if v is not None
    }


def drop_copied_dask_environ(environ: MutableMapping[str, str]) -> list[str]:
    """Remove from `environ` the worker variables that only a Dask nanny copied there.

    A nanny copies Dask's pre-spawn variables into the environment of the process that runs
    it (Dask's docs call this poisoning it), and for a worker an environment variable
    outranks every config. A kernel that had run a plain `LocalCluster` before `%cluster
    start` therefore handed Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` on to nbcluster's
    workers, and numpy items ran 1.5x slower there than in a forked `Pool`
    (bench/real_work.py, issue 21). A value equal to Dask's own is taken for such a copy,
    not for a choice: a user who wants Dask's value sets nbcluster's to null.

    Parameters
    ----------
    environ
        The environment the workers will inherit (the supervisor's ``os.environ``).

    Returns
    -------
    list of str
        The names removed.
    """
    dask_own = dask.config.get("distributed.nanny.pre-spawn-environ") or {}
    ours = get("worker.pre-spawn-environ") or {}
    copied = [
        k for k, v in ours.items()
        if k in dask_own and v != dask_own[k] and environ.get(k) == str(dask_own[k])
    ]  # fmt: skip
    for k in copied:
        del environ[k]
    return copied


def view_limits() -> dict[str, int]:
    """The bounds of a live view of the metrics, as graphs.js's ``createView`` takes them.

    The widget, the sidebar and `MetricsWindow` keep the same history.

    Returns
    -------
    dict of str to int
        ``maxTasks`` and ``maxSamples``, from ``widget.max-tasks`` and ``widget.max-samples``.
    """
    return {"maxTasks": int(get("widget.max-tasks")), "maxSamples": int(get("widget.max-samples"))}


def sidebar_settings() -> dict[str, Any]:
    """What the sidebar reads from the server's page config.

    Returns
    -------
    dict of str to Any
        ``limits`` (its view bounds, `view_limits`), ``window`` (its charts' window, in
        seconds) and the reconnect backoff of its stream, ``reconnectMs`` and
        ``reconnectMaxMs``, in milliseconds.
    """
    return {
        "limits": view_limits(),
        "window": seconds("sidebar.window"),
        "reconnectMs": round(1000 * seconds("sidebar.reconnect")),
        "reconnectMaxMs": round(1000 * seconds("sidebar.reconnect-max")),
    }


@contextlib.contextmanager
def libyaml() -> Iterator[None]:
    """Meanwhile, `yaml.safe_load` parses with `SAFE_LOADER` (libyaml's, where PyYAML has it).

    Dask reads its defaults and every config file with `yaml.safe_load`, whose pure Python
    parser is an order of magnitude slower than libyaml's, and each ``dask.config.refresh``
    reads the config folders' files again: a cold start parses distributed.yaml on its one
    busy core before the scheduler listens (bench/RESULTS.md, "yaml loader in a cold
    start"). For nbcluster's own processes, which run no user code: a supervisor (for its
    whole life) and the forkserver while it loads (its workers get PyYAML as it is). `tests/test_config.py` checks that
    both loaders read Dask's files and this machine's config files alike.

    Yields
    ------
    None
    """
    original = yaml.safe_load
    if SAFE_LOADER is not yaml.SafeLoader:
        yaml.safe_load = lambda stream: yaml.load(stream, Loader=SAFE_LOADER)
    try:
        yield
    finally:
        yaml.safe_load = original
