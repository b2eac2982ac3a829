"""Every private Dask API nbcluster uses, in one place (and one of ipykernel's).

Dask does not promise these names across releases. Each is wrapped here, and
`tests/test_compat.py` exercises each one against the installed Dask, so an upgrade that
moves one fails that test by name instead of breaking a feature quietly (the cancellation
check, for one, swallows errors by design).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from distributed import Client


def workers(client: Client) -> dict[str, dict[str, Any]]:
    """Every worker the scheduler knows, by address, on every supported Dask.

    ``Client.scheduler_info()`` lists at most 5 workers from distributed 2025.4.0 to 2026.6.x
    (distributed#9045, reverted in 2026.7.0): a worker missing from it would be left out of
    ``--everywhere`` without a word. And it returns the client's cached identity, which the
    client's own periodic refresh may overwrite, between the fetch and the return, with one
    that lists no worker: so the scheduler is asked directly, for all of them.

    Parameters
    ----------
    client : distributed.Client
        A synchronous client.

    Returns
    -------
    dict of str to dict
        Each worker's information (``name``, ``nthreads``, ``resources``, ...) by address.
    """
    if client.scheduler is None:  # never connected: it knows no worker
        return {}
    return dict(client.sync(client.scheduler.identity, n_workers=-1).get("workers", {}))


def set_global_client(client: Client) -> None:
    """Make `client` Dask's default client.

    `Client(set_as_default=True)` is the public way, but only at construction; a kernel
    switching between clusters it already holds clients for must re-point the default.
    (There is no way to set "no default": Dask drops a client from its defaults when it
    is closed.)

    Parameters
    ----------
    client : distributed.Client
        The client to make the default.
    """
    from distributed.client import _set_global_client

    _set_global_client(client)


def prefix_duration(scheduler: Any, prefix: Any) -> float:
    """The scheduler's expected run time, in seconds, of one task of `prefix` (a TaskPrefix).

    Dask's own estimate (measured average, else twice the longest run, else the configured
    unknown-task duration), so nbcluster's adaptive targets agree with Dask's.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler (this runs on it).
    prefix : distributed.scheduler.TaskPrefix
        The task prefix, such as the one of a run's batches.

    Returns
    -------
    float
        Seconds.
    """
    return float(scheduler._get_prefix_duration(prefix))


def erred_on(key: str, dask_scheduler: Any = None) -> list[tuple[str, str]]:
    """(name, address) of the workers task `key` failed on; run on the scheduler.

    Parameters
    ----------
    key : str
        The failed task's key (still held, so the scheduler remembers it).
    dask_scheduler : distributed.Scheduler
        The scheduler, as ``Client.run_on_scheduler`` passes it.

    Returns
    -------
    list of (str, str)
        The workers' names and addresses, by address; empty when the scheduler knows none.
    """
    ts = dask_scheduler.tasks.get(key)
    where = sorted(getattr(ts, "erred_on", None) or ()) if ts is not None else []
    return [(str(getattr(dask_scheduler.workers.get(a), "name", a)), a) for a in where]


def worker_task(key: Any) -> Any | None:
    """This worker's state record of task `key` (it has `.state`), or None if it has none.

    Parameters
    ----------
    key : Any
        The task's Dask key.

    Returns
    -------
    distributed.worker_state_machine.TaskState or None
        The record; None when this worker has no task of that key (any more).

    Raises
    ------
    ValueError
        Outside a Dask worker (as `get_worker` does).
    """
    from distributed import get_worker

    return get_worker().state.tasks.get(key)


async def apply_scale(cluster: Any) -> None:
    """Wait until a `SpecCluster` has started or stopped the workers its spec now asks for.

    `SpecCluster.scale` only schedules that; a scale that returns once the batch jobs are
    submitted (or cancelled) must wait for it.

    Parameters
    ----------
    cluster : distributed.SpecCluster
        The cluster just scaled.
    """
    await cluster._correct_state()


def stop_adaptive(cluster: Any) -> None:
    """Stop a Dask cluster's `adapt()`, if one runs (an explicit scale takes control back).

    Parameters
    ----------
    cluster : distributed.deploy.Cluster
        The cluster.
    """
    if cluster._adaptive is not None:
        cluster._adaptive.stop()


def nanny_logs(client: Client, nanny: str, n: int = 12) -> list[tuple[str, str]]:
    """The last `n` log records `(level, message)` of the nanny at `nanny`, newest first.

    `Client.get_worker_logs(nanny=True)` finds nannies through their workers; a worker that
    just died has none registered, while its nanny is alive and says how it ended. This asks
    the nanny itself, over the client's connection pool (with the cluster's TLS).

    Parameters
    ----------
    client : distributed.Client
        A client of the nanny's cluster.
    nanny : str
        The nanny's address.
    n : int
        How many records to fetch.

    Returns
    -------
    list of (str, str)
        ``(level, message)`` records, newest first.

    Raises
    ------
    OSError
        When the nanny cannot be reached (it is gone too).
    """
    logs: list[tuple[str, str]] = client.sync(lambda: client.rpc(nanny).get_logs(n=n))
    return logs


# -- run/ and worker/ (lean17) ---------------------------------------------------------------------
def running_task_key() -> Any | None:
    """The key of the Dask task this thread is running, or None outside a task.

    `distributed.worker.thread_state` (the object `dask.context` defines) is private.

    Returns
    -------
    Any or None
        The task's Dask key.
    """
    from dask.context import thread_state

    if getattr(thread_state, "nbcluster_direct", False):  # a direct batch (`as_worker`): no task
        return None
    return getattr(thread_state, "key", None)


def ipython_cell_number(filename: str) -> int | None:
    """The execution count of the IPython cell whose code has `filename`, if IPython runs here.

    IPython's `compile._filename_map` (the names it gives each cell's code) is private.
    Imports nothing: a process without a running IPython shell has no such cell.

    Parameters
    ----------
    filename : str
        The file name a code object carries (``co_filename``).

    Returns
    -------
    int or None
        The cell's execution count (``In[N]``); None when no IPython shell runs in this
        process or the file is not one of its cells.
    """
    import sys

    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is None or not shell_module.InteractiveShell.initialized():
        return None
    compiler = getattr(shell_module.InteractiveShell.instance(), "compile", None)
    mapping = getattr(compiler, "_filename_map", {}) or {}
    count = mapping.get(filename)
    return count if isinstance(count, int) else None

# cluster/ (speccluster.py)
def base_update_worker_status(cluster: Any, op: str, msg: Any) -> None:
    """`distributed.deploy.cluster.Cluster`'s own bookkeeping of a worker's arrival or departure.

    Without `SpecCluster`'s lost-worker timer on top (see `NbSpecCluster`).

    Parameters
    ----------
    cluster : distributed.SpecCluster
        The cluster whose scheduler sent the message.
    op : str
        ``"add"`` or ``"remove"``.
    msg : Any
        The scheduler's message: the worker's address for ``"remove"``, its details for
        ``"add"``.
    """
    from distributed.deploy.cluster import Cluster

    Cluster._update_worker_status(cluster, op, msg)


# run/ (persist23: a persisted batch's report)
def run_on_holder(client: Client, key: str, function: Any, *args: Any) -> Any:
    """`function(*args, dask_worker=...)` in the event loop of a worker holding `key`.

    One round trip from the kernel: the scheduler knows who holds the key and asks that
    worker over its own kept connection. (`Client.who_has` then `Client.run` is two round
    trips, and `Client.run` goes through the scheduler's broadcast, which opens a new
    connection, a TLS handshake, to the worker each time.)

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    key : str
        The Dask key whose holder should run `function`.
    function : callable
        What to run; it gets the worker as ``dask_worker``.
    *args : Any
        Its positional arguments.

    Returns
    -------
    Any
        What `function` returned; None when no worker holds `key`.

    Raises
    ------
    Exception
        What `function` raised on the worker, with its traceback.
    """
    from distributed.protocol.pickle import dumps

    response = client.run_on_scheduler(_run_on_holder, key, dumps(function), dumps(args))
    if response is None:
        return None
    if response.get("status") != "OK":
        from distributed.core import clean_exception

        _, exc, tb = clean_exception(**response)
        raise (exc or RuntimeError(f"the worker holding {key} could not run {function}")).with_traceback(tb)
    return response["result"]


async def _run_on_holder(key: str, function: bytes, args: bytes, dask_scheduler: Any = None) -> Any:
    """On the scheduler: the worker `run` handler's answer, from a worker holding `key`."""
    ts = dask_scheduler.tasks.get(key)
    if ts is None or not ts.who_has:
        return None
    address = next(iter(ts.who_has)).address
    return await dask_scheduler.rpc(address).run(function=function, args=args)


def call_in_loop(client: Client, fn: Any, *args: Any) -> None:
    """``fn(*args)`` soon, in the client's event loop, from any thread; not waited for.

    One wake of the loop (`Client.loop` is a tornado loop; its asyncio loop is what runs).

    Parameters
    ----------
    client : distributed.Client
        The client whose loop runs it.
    fn : callable
        What to call there.
    *args : Any
        Its arguments.
    """
    loop: Any = client.loop  # a tornado AsyncIOLoop, whose asyncio loop runs
    loop.asyncio_loop.call_soon_threadsafe(fn, *args)


async def worker_call(client: Client, worker: str, op: str, **kwargs: Any) -> Any:
    """Call the handler `op` of `worker` over the client's own connection pool (in its loop).

    The kernel's pool keeps a connection to each worker it called (TLS, the cluster's
    credentials): a request and its answer, without the scheduler.

    Parameters
    ----------
    client : distributed.Client
        The client.
    worker : str
        The worker's address.
    op : str
        The handler's name.
    **kwargs : Any
        Its arguments.

    Returns
    -------
    Any
        The handler's answer.
    """
    return await getattr(client.rpc(worker), op)(**kwargs)


async def run_on_worker(client: Client, worker: str, function: Any) -> Any:
    """Dask's ``run`` request to one worker, over the client's pool: ``function()`` there.

    Parameters
    ----------
    client : distributed.Client
        The client.
    worker : str
        The worker's address.
    function : callable
        What to run, without arguments.

    Returns
    -------
    Any
        What it returned; None when the worker answered with an error.
    """
    from distributed.protocol.pickle import dumps

    answer = await worker_call(client, worker, "run", function=dumps(function), args=dumps(()))
    return answer.get("result") if answer.get("status") == "OK" else None


async def worker_exchange(client: Client, worker: str, message: dict[str, Any], before: Any) -> Any:
    """Dask's request and answer (`distributed.core.send_recv`), reading one message before it.

    The answer may be preceded, on the same connection, by ``{"first": blob}``: `before` is
    called with that blob. A connection whose exchange did not end cleanly is closed, not
    given back to the pool: a later request would read this one's answer.

    Parameters
    ----------
    client : distributed.Client
        The client.
    worker : str
        The worker's address.
    message : dict
        The request: ``op``, ``reply`` and the handler's arguments.
    before : callable
        Called with the blob of a ``{"first": blob}`` message that comes before the answer.

    Returns
    -------
    Any
        The answer.

    Raises
    ------
    RuntimeError
        When the handler raised (Dask's ``uncaught-error`` answer).
    """
    pool = client.rpc
    comm = await pool.connect(worker)
    clean = False
    try:
        await comm.write(message, on_error="raise")
        answer = await comm.read()
        if isinstance(answer, dict) and "first" in answer:
            before(answer["first"])
            answer = await comm.read()
        clean = True
    finally:
        if clean:
            pool.reuse(worker, comm)
        else:
            comm.abort()
    if isinstance(answer, dict) and answer.get("status") == "uncaught-error":
        raise RuntimeError(f"the worker failed to answer: {answer.get('exception_text', answer)}")
    return answer


#: How long a Dask stream nbcluster set up holds messages back after a write (see
#: `cluster/streams.py`): Dask's are 2 to 10 ms, tuned for big graphs and many workers; an
#: interactive cell waited them out on every hop.
SEND_INTERVAL_S = 0.0


def send_at_once(stream: Any, interval: float = SEND_INTERVAL_S) -> None:
    """Let a Dask `BatchedSend` hold messages back for `interval` seconds at most after a write.

    What arrives while a write is under way still goes out together in the next one.

    Parameters
    ----------
    stream : distributed.batched.BatchedSend or None
        The stream (a scheduler's ``stream_comms`` or ``client_comms`` value, a worker's
        ``batched_stream``, a client's ``scheduler_comm``); None is left alone.
    interval : float
        Seconds.
    """
    if stream is not None and hasattr(stream, "interval"):
        stream.interval = interval


def quick_sends(client: Client, interval: float = SEND_INTERVAL_S) -> None:
    """Let `client` send its batched messages to the scheduler within `interval` seconds.

    A client that reconnects makes its stream afresh, with Dask's 10 ms again: slower, not
    wrong.

    Parameters
    ----------
    client : distributed.Client
        A connected client.
    interval : float
        Seconds between two sends at most.
    """
    send_at_once(getattr(client, "scheduler_comm", None), interval)


def scheduler_streams(scheduler: Any, worker: str | None = None, client: str | None = None) -> list[Any]:
    """A scheduler's batched streams: to `worker`, to `client`, or (neither given) all of them.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler (in this process).
    worker : str, optional
        A worker's address.
    client : str, optional
        A client's id.

    Returns
    -------
    list of distributed.batched.BatchedSend
        Those that exist now.
    """
    workers, clients = getattr(scheduler, "stream_comms", {}), getattr(scheduler, "client_comms", {})
    if worker is None and client is None:
        return [*workers.values(), *clients.values()]
    found = [workers.get(worker), clients.get(client)]
    return [s for s in found if s is not None]


def worker_stream(worker: Any) -> Any | None:
    """A worker's batched stream to its scheduler (None if it has none).

    Parameters
    ----------
    worker : distributed.Worker
        The worker (in this process).

    Returns
    -------
    distributed.batched.BatchedSend or None
        Its stream.
    """
    return getattr(worker, "batched_stream", None)


def nested_task(fn: Any, *args: Any) -> Any:
    """A Dask task to pass as an argument of another: the worker runs it first, in that task.

    Parameters
    ----------
    fn : callable
        The function, importable where the task runs.
    *args : Any
        Its arguments, plain data.

    Returns
    -------
    dask._task_spec.Task
        The task, with no key of its own.
    """
    from dask._task_spec import Task

    return Task(None, fn, *args)


@contextlib.contextmanager
def as_worker(worker: Any, key: str) -> Iterator[None]:
    """Within this block, this thread runs `key` for `worker`, as Dask's tasks do.

    Dask sets a private context variable (`distributed.get_worker()`),
    ``thread_state.key`` and the worker's ``active_threads`` entry for the tasks it runs; a
    batch nbcluster runs in the worker's thread pool outside a task (`worker.serve`) sets
    them the same way, so an item's own ``get_worker()``, ``get_client()``,
    ``get_current_task()`` and ``thread_state.key`` work there too, and Dask's call stacks
    (``Client.call_stack``) show the batch.
    `running_task_key` still answers None there: the worker has no task of that key.

    Parameters
    ----------
    worker : distributed.Worker
        The worker this thread works for.
    key : str
        The name of what it runs.

    Yields
    ------
    None
    """
    from dask.context import thread_state
    from distributed.worker import _worker_cvar

    token, ident = _worker_cvar.set(worker), threading.get_ident()
    thread_state.key, thread_state.nbcluster_direct = key, True
    with worker.active_threads_lock:  # Dask's call stacks and `get_current_task()` see the batch
        worker.active_threads[ident] = key
    try:
        yield
    finally:
        with worker.active_threads_lock:
            worker.active_threads.pop(ident, None)
        del thread_state.key, thread_state.nbcluster_direct
        _worker_cvar.reset(token)


def worker_accepts_work(worker: Any) -> str | None:
    """Why `worker` takes no work now (paused past its memory limit, closing), or None.

    Parameters
    ----------
    worker : distributed.Worker
        The worker (in this process).

    Returns
    -------
    str or None
        Its status's name when that is not ``running``; None when it is.
    """
    from distributed.core import Status

    status = getattr(worker, "status", None)
    return None if status == Status.running else str(getattr(status, "name", status))


# cluster/ (supervisor.py: the start of the local backend's workers)
#: How often a nanny this process starts looks for its new worker's "ready" message.
NANNY_READY_POLL_S = 0.005


def quick_worker_handshake(interval: float = NANNY_READY_POLL_S) -> None:
    """Let the nannies of this process see their worker process ready within `interval` s.

    A nanny learns that the worker process it spawned has registered from a multiprocessing
    queue, which Dask polls every 50 ms (a queue has nothing an event loop can await): each
    worker's start ended up to 50 ms after the worker was ready, and a cluster's start waits
    for its last worker. A poll of an empty queue costs microseconds, and polling happens
    only while a worker process starts.

    Parameters
    ----------
    interval : float
        Seconds between two looks at the queue.
    """
    from distributed.nanny import WorkerProcess

    WorkerProcess._init_msg_interval = interval


def start_spec_scheduler(cluster: Any) -> Any:
    """Start a `SpecCluster`'s scheduler, and none of its workers yet (a coroutine).

    Awaiting the cluster afterwards starts the workers (it skips what already runs). The
    public ``await cluster`` does both in one, and the scheduler's address is not known
    until the workers are up.

    Parameters
    ----------
    cluster : distributed.SpecCluster
        An asynchronous cluster, not started.

    Returns
    -------
    Coroutine
        Done once the scheduler listens and the cluster object is subscribed to it.
    """
    return cluster._start()


def accepted_tls_streams_keep_their_context() -> None:
    """Give a TLS stream that tornado's `TCPServer` accepts the server's own context.

    Tornado makes its default *client* context (the system's CA store, 20-50 ms) for every
    `SSLIOStream` made without options, and its server makes the stream of each accepted
    connection that way, around a socket it has already wrapped with the server's context:
    the first connection a Dask scheduler, nanny or worker accepted loaded the CA store, and
    threw it away. Such a stream uses its options for two things only, wrapping a socket
    that connects later (an accepted one never does) and the verify mode it checks a peer's
    host name with (a server has none to check), so the socket's own context is the right
    value, and the certificate checks stay what the server's context makes them. Tornado's
    default context stays what it is for every stream that asks for it (a task's HTTPS
    request). Idempotent; for nbcluster's own processes (the supervisor, the forkserver its
    workers are forked from).
    """
    import ssl

    import tornado.tcpserver
    from tornado.iostream import SSLIOStream

    if getattr(tornado.tcpserver.SSLIOStream, "_nbcluster_keeps_context", False):  # type: ignore[attr-defined]
        return

    class AcceptedSSLIOStream(SSLIOStream):
        _nbcluster_keeps_context = True

        def __init__(self, socket: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("ssl_options") is None and isinstance(socket, ssl.SSLSocket):
                kwargs["ssl_options"] = socket.context
            super().__init__(socket, *args, **kwargs)

    tornado.tcpserver.SSLIOStream = AcceptedSSLIOStream  # type: ignore[attr-defined]


def keep_forkserver_preload() -> None:
    """Keep multiprocessing's forkserver preload as nbcluster set it, in this process.

    Dask's `get_mp_context`, the first time it is asked for a forkserver context, imports
    every package Dask knows of (numpy, pandas, lz4, ...) here and makes them the
    forkserver's preload instead: in a supervisor, whose forkserver already runs with
    nbcluster's preload (`cluster/forkserver.py`), that would be a second of imports for
    nothing, and a forkserver restarted later would preload Dask's list.
    """
    import distributed.utils

    distributed.utils._forkserver_preload_set = True


def comm_replies_on_senders_subshell(comm: Any) -> None:
    """Have the front end's messages on `comm` handled on the kernel subshell it sent them on.

    ipykernel 7.4 sends a comm message to the subshell that was handling the parent of the
    kernel's last message on that comm (``BaseComm._reply_subshell_for``, consulted by the
    shell channel thread), so that a cell awaiting a widget's reply gets it. A live view
    publishes from its cell's context, the main shell: every click would wait behind the
    cell. No cell awaits a reply on such a comm, so its messages go where the front end sent
    them. Without the hook (ipykernel < 7.4) that is already so, and this does nothing.

    Parameters
    ----------
    comm : ipykernel.comm.Comm
        A widget's comm (``widget.comm``).
    """
    if callable(getattr(comm, "_reply_subshell_for", None)):
        comm._reply_subshell_for = lambda data, default: default
