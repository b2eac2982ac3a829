"""What the forkserver of a supervisor (`forkserver.py`) loads once, for every worker it forks.

Imported in the forkserver process only, never in the supervisor: what a nanny's worker
process loads as it starts (Dask's nanny and worker, tornado, numpy; nbcluster's worker
class and plugins; its HTTP server's routes; the package versions it reports as it
registers, which Dask caches) and what its first ``%%distribute`` batch loads
(`nbcluster.worker`); Dask's distributed.yaml is read with libyaml meanwhile
(`config.libyaml`).

Not numpy's random generators (``numpy.random``), though an item of Monte Carlo work loads
them (6 ms, once a worker): loaded here, they made every forked worker's items slower, for
reasons not known (`bench/RESULTS.md`, "simulation"). numpy before 2.0 loads them with numpy
all the same. Then:

- a worker's accepted TLS connections keep the worker's own TLS context
  (`_compat.accepted_tls_streams_keep_their_context`), instead of loading the system's CA
  store for nothing at the first one;
- the garbage collector's objects so far are frozen (`gc.freeze`, as Python's docs advise
  before forking): a collection in a worker neither scans them nor writes to their pages,
  which therefore stay shared with the forkserver; the collector, off while the forkserver
  imported (`nbcluster._start_up`), is then on again;
- each forked child seeds numpy's global random state afresh as the forkserver serves it,
  where numpy loaded it here (before 2.0), as Python's `random` does by itself after a
  fork: a fork shares the state seeded here, and two children would draw the same
  ``np.random.random()``;
- a forked worker runs the ``atexit`` handlers when it exits, as a spawned one does:
  multiprocessing ends a forked child with ``os._exit``, after flushing its streams but
  without Python's shutdown (a task's ``atexit.register`` would never run);
- the signals the supervisor catches (`lifeline.SIGNALS`) are at their default (SIGINT at
  Python's own handler), as in a worker the supervisor spawns (a caught signal is reset by
  ``exec``). The forkserver can
  start before the supervisor catches them, and then kept what it was started with: under
  ``nohup``, SIGHUP ignored, in every worker it forked.

Nothing here may start a thread: a process with threads cannot be forked safely.
"""

from __future__ import annotations

from nbcluster import _start_up

_start_up.begin()  # first: the collector off while the rest imports

# ruff: noqa: E402

import atexit
import contextlib
import gc
import importlib
import multiprocessing.forkserver
import signal
import sys
from typing import Any

import dask.config

from nbcluster import config

with config.libyaml():  # distributed.yaml; restored before any worker is forked
    import distributed.nanny  # the worker process's entry point (Nanny._run)
    import distributed.versions
    import distributed.worker

import nbcluster.worker  # noqa: F401  (what a %%distribute batch runs)
from nbcluster import _compat
from nbcluster.cluster import private_http, streams, worker_memory  # noqa: F401  (worker class, plugins)
from nbcluster.cluster.lifeline import SIGNALS


def _serve_one_then_exit_cleanly(serve_one: Any) -> Any:
    def serve_one_and_run_atexit(*args: Any) -> int:
        random = sys.modules.get("numpy.random")
        if random is not None:
            random.seed()  # from the OS's entropy, in this worker alone
        code: int = serve_one(*args)
        atexit._run_exitfuncs()
        return code

    return serve_one_and_run_atexit


def _load_what_a_worker_loads_as_it_starts() -> None:
    # Its HTTP server's routes (the Prometheus one imports prometheus_client), by Dask's
    # config as read here; a route that cannot be imported fails in the worker, as it would.
    for module in dask.config.get("distributed.worker.http.routes"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    # The versions it sends the scheduler as it registers: Dask caches them per process,
    # read from the packages' metadata files, and `uname -p` in a subprocess for the host's.
    distributed.versions.get_versions()


_load_what_a_worker_loads_as_it_starts()
for _signal in SIGNALS:  # before the forkserver's own: it sets SIGINT for itself, and its children restore this
    # SIGINT as Python starts with it where it is not ignored (asyncio's runner then takes it).
    signal.signal(_signal, signal.default_int_handler if _signal == signal.SIGINT else signal.SIG_DFL)
_compat.accepted_tls_streams_keep_their_context()
# The forkserver's loop calls `_serve_one` in each forked child, then `os._exit`.
multiprocessing.forkserver._serve_one = _serve_one_then_exit_cleanly(multiprocessing.forkserver._serve_one)  # type: ignore[attr-defined]
gc.freeze()
gc.enable()
