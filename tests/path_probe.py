"""Which of nbcluster's modules a plain `%%distribute` cell runs code in, kernel and worker.

Run as a script (`python -m tests.path_probe`); prints a JSON object {"kernel": [...],
"worker": [...]} of module names, sorted. `tests/test_cell_path.py` runs it in a fresh
process, because a profile hook reaches only the threads started after it is set: this
script sets it before anything of nbcluster is imported, so the kernel's helper threads
(the run's driver, the client's event loop) are seen too.

The worker side: the first cell's item sets a profile hook on the worker thread it runs
in (the cluster has one thread a worker), so the second cell's batches, run by that same
thread, are recorded there; the recorded names are then read back with `client.run`.
Only the second cell counts, on both sides: what the first cell of a session loads once
(imports, the cluster's start) is not the path of a cell.
"""

from __future__ import annotations

import json
import sys
import threading
from types import FrameType
from typing import Any

SEEN: set[str] = set()
RECORD = False


def _module_of(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) and name.split(".")[0] == "nbcluster" else None


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    if RECORD and event == "call" and (name := _module_of(frame)):
        SEEN.add(name)


def _worker_record() -> None:
    """Run in an item: from now on, record what this worker thread runs of nbcluster."""
    import builtins

    seen: set[str] = set()
    builtins._nbcluster_path_seen = seen  # type: ignore[attr-defined]

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_globals.get("__name__", "")
        if event == "call" and isinstance(name, str) and name.split(".")[0] == "nbcluster":
            seen.add(name)

    sys.setprofile(hook)


def _worker_seen() -> list[str]:
    import builtins

    return sorted(getattr(builtins, "_nbcluster_path_seen", set()))


def main() -> None:
    global RECORD
    threading.setprofile(_hook)
    sys.setprofile(_hook)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbcluster")
    shell.run_line_magic("cluster", "start --workers 1 --threads 1")
    try:
        shell.user_ns["record"] = _worker_record
        first = shell.run_cell("%%distribute --over 'x in range(8)' --into first\nrecord()")
        first.raise_error()
        RECORD = True
        second = shell.run_cell("%%distribute --over 'x in range(8)' --into second\nx + 1")
        RECORD = False
        second.raise_error()
        assert list(shell.user_ns["second"]) == list(range(1, 9)), shell.user_ns["second"]
        import nbcluster._current as current

        client = current.client_for()
        worker = sorted({name for names in client.run(_worker_seen).values() for name in names})
    finally:
        shell.run_line_magic("cluster", "stop")
    print(json.dumps({"kernel": sorted(SEEN), "worker": worker}))


if __name__ == "__main__":
    main()
