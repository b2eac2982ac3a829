"""Cell-level parallel execution: `%%distribute` and `nbcluster.distribute()`.

One engine, two front ends: the magic parses its line (`args.py`) and calls `distribute`
with the cell and the user's namespace; Python code calls `distribute` directly.
Modules, in the order a run uses them: `options` (the flags, declared and checked once),
`args` (the magic's line), `run` (the API: checks, then the run's steps; `Run`, the
controls of a run), `cell` (source -> code, free names), `plan` (the items), `capture`
(what travels and how), `target` (the cluster link: where items may run), `job` (what
runs, made once), `engine` (submit, stream, retry, cancel), `everywhere` (the engine's
strategy for `--everywhere`: one task pinned to each worker), `batching` (batch sizes),
`worker/` (what runs on the workers, and nothing else: the tasks, `context`, `objects`,
`items`, `output`, `records`, `stopping`), `state` (each item's state, written by the engine
alone), `results` (the read-only view the user gets), `tracebacks` (failed items),
`follow` (waiting in the kernel: output, summary, Ctrl-C), `journal` (every finished item on
disk as it arrives), `identity` (what makes two runs the same run), `resume` (`--resume`:
which journal a run writes and what it takes from an earlier one), `runs` (listing and
forgetting journals).

The names below load on first use (PEP 562): a worker unpickling a batch imports this
package on its way to `worker`, and must not import the kernel side with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbcluster import _lazy

if TYPE_CHECKING:
    from nbcluster.distribute.args import parse_distribute_line, parse_wait_line
    from nbcluster.distribute.results import Results
    from nbcluster.distribute.run import distribute, wait
    from nbcluster.distribute.tracebacks import ItemError
    from nbcluster.errors import Interrupted, NotReady

__all__ = [
    "Interrupted",
    "ItemError",
    "NotReady",
    "Results",
    "distribute",
    "parse_distribute_line",
    "parse_wait_line",
    "wait",
]

# public name -> the module that defines it
_LAZY = {
    "Interrupted": "nbcluster.errors",
    "ItemError": "nbcluster.distribute.tracebacks",
    "NotReady": "nbcluster.errors",
    "Results": "nbcluster.distribute.results",
    "distribute": "nbcluster.distribute.run",
    "parse_distribute_line": "nbcluster.distribute.args",
    "parse_wait_line": "nbcluster.distribute.args",
    "wait": "nbcluster.distribute.run",
}


__getattr__, __dir__ = _lazy.attributes(__name__, _LAZY, globals(), __all__)
