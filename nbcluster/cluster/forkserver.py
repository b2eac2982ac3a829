"""A local cluster's worker processes, forked from a process that has loaded what they run.

Dask's nannies start each worker process with multiprocessing's *spawn*: a new Python that
imports Dask, tornado and numpy again before it can register with the scheduler, about
0.4 s of CPU a worker, on the path to a cluster's first result. A supervisor instead starts
multiprocessing's *forkserver* as its first act (`start_ahead`, before its own imports, so
the two load side by side; a spare supervisor has it ready long before a start), with
`forkserver_preload` as the preload, and its nannies fork each worker from it.

What a forked process cannot change is what its parent read when it started: glibc's malloc
settings, Python's hash seed and flags, the thread settings of the libraries it loaded
(``OMP_NUM_THREADS``...), all from the environment. So the forkserver starts with exactly the
environment that a spawned worker would start with (`worker_environ`: the supervisor's, with
the pre-spawn variables a nanny adds), and the supervisor checks, right before its nannies
start (`use`), that the environment a worker would get *now* is that one: the request can
bring another (a spare was launched long before it, and the requester's settings come with
the request). Anything different, one variable or one setting, and the forkserver is
replaced by one started with the new environment. Everything else a worker process gets is
what a spawned one gets: multiprocessing prepares a forked child as a spawned one (its
``sys.path``, working folder, ``sys.argv``, authkey), the forkserver's child restores the
default signal handlers, and a nanny's own ``env`` is applied in the child, as with spawn.
Two things are added to make the child match a spawned one: `forkserver_preload` runs the
``atexit`` handlers when a forked worker exits (multiprocessing's forked children skip
Python's shutdown), and the workers' Dask config keeps ``spawn`` as their multiprocessing
method (`worker_config`), so a process a task starts is started as it would be elsewhere.

Workers are children of the forkserver, which is a child of the supervisor: in its process
group (a torn-down start kills it with the rest) and among its descendants (the lifeline's
`kill_descendants`). It exits once the supervisor and every worker forked from it are gone.

``nbcluster.worker.forkserver: false``, or a method other than ``spawn`` in
``distributed.worker.multiprocessing-method``, leaves Dask's own way; so does a backend
whose workers run elsewhere (the forkserver is then stopped).

This module is the supervisor's; the forkserver itself loads only `forkserver_preload`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing.forkserver
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbcluster._start_up import START_UP_VARIABLE

# The standard library only, here: a supervisor launched for a local cluster imports this
# module before Dask (`start_as_launched`); what needs Dask's config imports it where used.

#: What the forkserver imports before it forks anything (see forkserver_preload.py).
PRELOAD = ["nbcluster.cluster.forkserver_preload"]
#: The multiprocessing method Dask uses when nobody set one.
DASK_DEFAULT_METHOD = "spawn"
#: Dask's own: "to get consistent hashing on subprocesses", a nanny sets this seed.
NANNY_HASH_SEED = "6640"
#: Set by a starting nanny to its process id (`distributed.proctitle`): a worker whose
#: parent it names sets its process title (with setproctitle installed).
PARENT_PID_VARIABLE = "__DASK_PARENT_PID"

#: How a launcher hands a new supervisor the workers' environment it predicts for it (JSON:
#: the variables to set, and those to unset), so that its forkserver starts before it loads
#: Dask's config (`ahead_environ`, `start_as_launched`).
AHEAD_VARIABLE = "NBCLUSTER_FORKSERVER_AHEAD"

#: The environment the running forkserver started with (None: none started).
_started_with: dict[str, str] | None = None
#: Whether `use` made this process's nannies fork their workers.
_in_use = False


def worker_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a nanny's spawned worker process starts with, in a supervisor whose
    environment is `environ`.

    What the supervisor does to its own environment before the nannies start (it drops the
    variables only a Dask nanny copied there, `config.drop_copied_dask_environ`), then what a
    Dask nanny adds right before it spawns: ``distributed.nanny.pre-spawn-environ`` (which
    the supervisor sets to `config.worker_pre_spawn_environ`), a variable already set
    winning, a null one left out, its hash seed where none (or 0) is set, and its own
    process id as the workers' parent. `tests/test_compat.py` checks the pre-spawn part
    against a real `distributed.Nanny`, `tests/test_forkserver.py` the whole against a
    spawned worker's environment.

    Parameters
    ----------
    environ : Mapping of str to str
        The supervisor's environment (the requester's).

    Returns
    -------
    dict of str to str
        The worker process's environment.
    """
    from nbcluster import config

    env = dict(environ)
    config.drop_copied_dask_environ(env)
    pre_spawn = {k: env.get(k, str(v)) for k, v in config.worker_pre_spawn_environ().items() if v is not None}
    if pre_spawn.get("PYTHONHASHSEED") in (None, "0"):
        pre_spawn["PYTHONHASHSEED"] = NANNY_HASH_SEED
    # And a nanny marks its process as the workers' parent, for their process titles.
    return {**env, **pre_spawn, PARENT_PID_VARIABLE: str(os.getpid())}


def wanted() -> bool:
    """Whether workers are to be forked: the setting says so, and Dask's method is its default.

    Returns
    -------
    bool
        ``nbcluster.worker.forkserver`` and ``distributed.worker.multiprocessing-method``
        is ``spawn``.
    """
    import dask.config

    from nbcluster import config

    method = dask.config.get("distributed.worker.multiprocessing-method", DASK_DEFAULT_METHOD)
    return bool(config.get("worker.forkserver")) and method == DASK_DEFAULT_METHOD


def ahead_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """What a launcher adds to the environment of a supervisor it launches for a request.

    The workers' environment as `worker_environ` predicts it from here (the request's own
    environment and settings), as the change to make to the supervisor's environment, in
    `AHEAD_VARIABLE`: the supervisor starts its forkserver with it as its very first act
    (`start_as_launched`), a tenth of a second before it could compute it itself, once
    Dask's config has loaded. `use` checks it all the same.

    Parameters
    ----------
    environ : Mapping of str to str
        The environment the supervisor is launched with (the request's).

    Returns
    -------
    dict of str to str
        ``{AHEAD_VARIABLE: ...}``; empty where workers are not to be forked.
    """
    _load_distributed_defaults()
    if not wanted():
        return {}
    predicted = worker_environ(environ)
    del predicted[PARENT_PID_VARIABLE]  # the supervisor's own process id, there
    change = {
        "set": {k: v for k, v in predicted.items() if environ.get(k) != v},
        "unset": sorted(set(environ) - set(predicted)),
    }
    return {AHEAD_VARIABLE: json.dumps(change)}


def start_as_launched() -> None:
    """Start the forkserver with the environment the launcher predicted (`ahead_environ`).

    Run first by a supervisor (``cluster/__main__.py``) whose environment has `AHEAD_VARIABLE`,
    before Dask's config loads; the variable goes from the environment at once. Whatever
    goes wrong only costs the head start.
    """
    given = os.environ.pop(AHEAD_VARIABLE, None)
    if given is None:
        return
    try:
        change = json.loads(given)
        environ = {k: v for k, v in os.environ.items() if k not in set(change["unset"])}
        environ.update(change["set"])
        environ[PARENT_PID_VARIABLE] = str(os.getpid())
        _ensure(environ)
    except Exception:
        traceback.print_exc()  # the supervisor's log


def start_ahead() -> None:
    """Start the forkserver with the environment the workers will most likely get, unless
    the launcher's prediction started it already (`start_as_launched`).

    A supervisor's first act (``cluster/__main__.py``), before it imports Dask's scheduler:
    the forkserver loads the worker's modules meanwhile, on another core. Dask's defaults
    are read from its ``distributed.yaml`` as importing `distributed` would (it is not
    imported yet). Whatever goes wrong here only costs the head start: `use` decides.
    """
    if _started_with is not None:
        return
    try:
        _load_distributed_defaults()
        if wanted():
            _ensure(worker_environ(os.environ))
    except Exception:
        traceback.print_exc()  # the supervisor's log; its workers will be spawned


def use() -> bool:
    """Make this supervisor's nannies fork their workers, if `wanted`, from a forkserver
    started with the environment a worker would start with now; else stop any forkserver.

    Called once the request's environment and settings are in place, right before the
    local deployment is made. It sets ``distributed.worker.multiprocessing-method`` to
    ``forkserver`` in this process (for every nanny it will make: this process exists for
    one cluster), keeping multiprocessing's preload ours.

    Returns
    -------
    bool
        Whether the workers will be forked.
    """
    import dask.config

    from nbcluster import _compat  # imports distributed: the supervisor has it by now

    if not wanted():
        stop()
        return False
    try:
        _ensure(worker_environ(os.environ))
    except Exception:
        traceback.print_exc()
        stop()
        return False
    _compat.keep_forkserver_preload()
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    global _in_use
    _in_use = True
    return True


def in_use() -> bool:
    """Whether this process's nannies fork their workers (`use` said so).

    Returns
    -------
    bool
        True in a supervisor whose local workers are forked.
    """
    return _in_use


def worker_config(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings`, the Dask config a forked worker gets on top of its nanny's, with spawn as
    its method, as it would have had (`use` sets forkserver in the supervisor only).

    Parameters
    ----------
    settings : dict
        Whole sections of Dask's config (a nanny lays its ``config`` over the worker's own
        section by section), ``distributed`` among them.

    Returns
    -------
    dict
        `settings`, with ``distributed.worker.multiprocessing-method`` set to spawn.
    """
    import dask.config

    spawn = {"distributed": {"worker": {"multiprocessing-method": DASK_DEFAULT_METHOD}}}
    return dask.config.merge(settings, spawn)


def stop() -> None:
    """Stop the forkserver, if this process started one (at once, even while it loads)."""
    global _started_with, _in_use
    server = _server()
    running = server._forkserver_pid
    if running is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(running, signal.SIGKILL)  # it reads its stop pipe only once it has loaded
        server._stop()  # closes the pipe, reaps it, removes its socket
    _started_with = None
    _in_use = False


def pid() -> int | None:
    """The running forkserver's process id.

    Returns
    -------
    int or None
        None where none was started.
    """
    running: int | None = _server()._forkserver_pid
    return running


def _server() -> Any:
    """multiprocessing's forkserver of this process (the one its forkserver context uses).
    Its ``_forkserver_pid`` and ``_stop`` are the standard library's own, not public."""
    return multiprocessing.forkserver._forkserver


def _ensure(environ: dict[str, str]) -> None:
    """A forkserver started with exactly `environ` (a new one if the running one has another)."""
    global _started_with
    if _started_with is not None and _started_with != environ:
        changed = sorted(k for k in {*environ, *_started_with} if environ.get(k) != _started_with.get(k))
        _note(f"a new forkserver: the workers' environment differs in {', '.join(changed)}")
        stop()
    server = _server()
    server.set_forkserver_preload(PRELOAD)
    # It starts with this process's environment: set `environ` for the moment of its start
    # (also a dead one's restart). Nothing else in this process reads the environment meanwhile.
    saved = dict(os.environ)
    try:
        os.environ.clear()
        # Its imports without the cyclic GC; `import nbcluster` takes the variable out of its
        # environment before anything is forked (nbcluster/__init__.py, forkserver_preload).
        os.environ.update({**environ, START_UP_VARIABLE: "1"})
        server.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _started_with = dict(environ)


def _load_distributed_defaults() -> None:
    """Register Dask's ``distributed.yaml`` defaults, as ``import distributed`` does, without
    the import (which is most of a supervisor's start-up)."""
    import dask.config
    import yaml

    from nbcluster import config

    if "distributed.config" in sys.modules:  # registered them already
        return
    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        return
    path = Path(next(iter(spec.submodule_search_locations))) / "distributed.yaml"
    with path.open() as f:
        dask.config.update_defaults(yaml.load(f, Loader=config.SAFE_LOADER))


def _note(text: str) -> None:
    # Stderr is the supervisor's log.
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} - nbcluster.forkserver - {text}", file=sys.stderr, flush=True
    )
