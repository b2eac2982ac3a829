"""What the workers keep through `nbcluster.worker_local`, as `%cluster status` lists it.

The values themselves live in each worker process (`nbcluster.worker.local`); the kernel only
asks each worker what it holds.
"""

from __future__ import annotations

from typing import Any

from nbcluster import _compat
from nbcluster.worker import local


def status_lines(client: Any) -> list[str]:
    """`%cluster status`'s lines on what each worker holds through `worker_local` (none: []).

    Parameters
    ----------
    client : distributed.Client
        The cluster's client; each worker is asked with ``client.run``.

    Returns
    -------
    list of str
        One line per worker holding values: ``  worker-0 keeps worker_local env (gymnasium...,
        built in 0.41 s)``. [] when no worker holds any or the workers cannot be asked.
    """
    try:
        answers = client.run(local.held, on_error="return")
        names = {a: str(w.get("name", a)) for a, w in _compat.workers(client).items()}
    except Exception:  # workers busy or gone: the status shows without these lines
        return []
    lines = []
    for address in sorted(answers, key=lambda a: names.get(a, a)):
        values = answers[address]
        if not isinstance(values, dict) or not values:
            continue
        parts = [f"{n} ({v['type']}, built in {v['seconds']:.2f} s)" for n, v in sorted(values.items())]
        lines.append(f"  {names.get(address, address):<8} keeps worker_local {', '.join(parts)}")
    return lines
