"""How the widget writes bytes, durations and task colours: the same as ``static/graphs.js``
does live, so the frozen picture (`_static`) and the live view agree to the character."""

from __future__ import annotations

import math

from dask.utils import format_bytes as dask_format_bytes

from nbcluster.widgets._theme import THEME


def prefix_color(prefix: str) -> str:
    """The colour graphs.js gives `prefix` (FNV-1a over UTF-16 code units).

    Parameters
    ----------
    prefix : str
        A task prefix (the function's name).

    Returns
    -------
    str
        A CSS ``hsl(...)`` colour.
    """
    h = 2166136261
    data = str(prefix).encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 16777619) & 0xFFFFFFFF
    p = THEME["prefix"]
    return f"hsl({p['hueStart'] + h % p['hueSpan']}, {p['saturation']}%, {p['lightness']}%)"


def format_bytes(n: float | None) -> str:
    """Dask's own `dask.utils.format_bytes` ("1.50 GiB"), as graphs.js's formatBytes.

    Parameters
    ----------
    n : float or None
        Bytes.

    Returns
    -------
    str
        e.g. ``1.50 GiB``, ``512 B``; ``?`` for None or a non-finite number.
    """
    if n is None or not math.isfinite(n):
        return "?"
    return dask_format_bytes(round(n)) if n >= 2**10 * 0.9 else f"{round(n)} B"


def format_duration(seconds: float | None) -> str:
    """A duration as the widget writes it (graphs.js's formatDuration).

    Parameters
    ----------
    seconds : float or None
        The duration.

    Returns
    -------
    str
        e.g. ``2.5 s``, ``42 s``, ``3 min 5 s``, ``1 h 2 min``; ``?`` for None.
    """
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{round(s)} s"
    if s < 3600:
        return f"{int(s // 60)} min {round(s % 60)} s"
    return f"{int(s // 3600)} h {round((s % 3600) / 60)} min"
