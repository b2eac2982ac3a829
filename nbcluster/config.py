"""nbcluster's settings, kept in Dask's config under `nbcluster.` (defaults: `nbcluster.yaml`).

Importing this module registers the defaults, as dask-jobqueue does with `jobqueue.yaml`;
users override them in `~/.config/dask/*.yaml`, `/etc/dask/*.yaml` or `DASK_NBCLUSTER__...`
variables. Code reads a key where it needs it (`get("distribute.cancel-grace")`), so a
`dask.config.set` in a notebook takes effect for the next cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import yaml

_DEFAULTS = Path(__file__).with_name("nbcluster.yaml")

with _DEFAULTS.open() as _f:
    _SHIPPED: dict[str, Any] = yaml.safe_load(_f)
dask.config.update_defaults(_SHIPPED)


def get(key: str) -> Any:
    """The value of `nbcluster.<key>`.

    Falls back to the shipped default: a ``with dask.config.set({"nbcluster...": ...})``
    entered before nbcluster was imported restores, on leaving, the config it saw on
    entering, which had no ``nbcluster`` section, and so drops the defaults registered since.
    """
    try:
        return dask.config.get(f"nbcluster.{key}")
    except KeyError:
        return dask.config.get(f"nbcluster.{key}", config=_SHIPPED)


def seconds(key: str) -> float:
    """A duration setting (`50ms`, `2s` or a number of seconds) in seconds."""
    from dask.utils import parse_timedelta

    value = get(key)
    try:
        return float(parse_timedelta(value, default="seconds"))
    except (KeyError, ValueError, TypeError):  # dask's own errors list every unit: not one line
        raise _bad(key, value, "a duration such as 2s or 500ms") from None


def count(key: str, minimum: int = 0) -> int | None:
    """A whole-number setting, or None where it is unset (`null`)."""
    value = get(key)
    if value is None:
        return None
    try:
        number = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise _bad(key, value, f"a whole number (at least {minimum})")
    return number


def _bad(key: str, value: Any, what: str) -> Exception:
    from nbcluster.errors import BadArgument

    return BadArgument(
        f"nbcluster.{key} is {value!r} in Dask config: set it to {what}, or remove it for the default"
    )


def worker_pre_spawn_environ() -> dict[str, Any]:
    """Dask's pre-spawn environment for worker processes with nbcluster's additions."""
    merged = dict(dask.config.get("distributed.nanny.pre-spawn-environ") or {})
    merged.update(get("worker.pre-spawn-environ") or {})
    return merged


def view_limits() -> dict[str, int]:
    """The bounds of a live view of the metrics, as graphs.js's ``createView`` takes them
    (the widget, the sidebar and `MetricsWindow` keep the same history)."""
    return {"maxTasks": int(get("widget.max-tasks")), "maxSamples": int(get("widget.max-samples"))}


def sidebar_settings() -> dict[str, Any]:
    """What the sidebar reads from the server's page config: its view bounds, chart
    windows and the reconnect backoff of its stream, in milliseconds."""
    return {
        "limits": view_limits(),
        "window": seconds("sidebar.window"),
        "reconnectMs": round(1000 * seconds("sidebar.reconnect")),
        "reconnectMaxMs": round(1000 * seconds("sidebar.reconnect-max")),
    }
