"""The private Dask APIs in `nbcluster._compat` still do what nbcluster relies on.

Each test drives the wrapper against the installed Dask, on a real in-process scheduler and
worker, so a Dask upgrade that renames or changes one fails here, by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Client, LocalCluster, default_client
from distributed.worker import thread_state

from nbcluster import _compat


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[LocalCluster, Client]]:
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster:
        client = Client(cluster, set_as_default=False)
        try:
            yield cluster, client
        finally:
            client.close()


def test_set_global_client_repoints_the_default(local: tuple[LocalCluster, Client]) -> None:
    # A kernel switching back to a cluster whose client it already holds (`%cluster use`).
    cluster, first = local
    # Not `with Client(...)`: entering a client makes it current for the block, above any default.
    second = Client(cluster, set_as_default=True)
    try:
        assert default_client() is second
        _compat.set_global_client(first)
        assert default_client() is first
        _compat.set_global_client(second)
        assert default_client() is second
    finally:
        second.close()
    # Closing a client is what takes it off the defaults (`_current.forget` relies on it).
    assert default_client() is first


def test_workers_lists_every_worker_past_five() -> None:
    # `scheduler_info()` lists 5 of them from distributed 2025.4.0 to 2026.6.x; placement and
    # --everywhere read `workers`, which must list all 6.
    with (
        LocalCluster(n_workers=6, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.wait_for_workers(6)
        workers = _compat.workers(client)
        assert sorted(workers) == sorted(cluster.scheduler.workers)
        assert all(w["nthreads"] == 1 for w in workers.values())


def _nap(seconds: float) -> float:
    time.sleep(seconds)  # the work whose duration the scheduler measures
    return seconds


def test_prefix_duration_reads_the_schedulers_measurement(local: tuple[LocalCluster, Client]) -> None:
    cluster, client = local
    assert client.submit(_nap, 0.2, key="nap-1").result() == 0.2
    prefix = cluster.scheduler.task_prefixes["nap"]
    assert 0.2 <= _compat.prefix_duration(cluster.scheduler, prefix) < 5


def _fail() -> None:
    raise ValueError("on purpose")


def test_erred_on_names_the_worker_a_task_failed_on(local: tuple[LocalCluster, Client]) -> None:
    cluster, client = local
    future = client.submit(_fail, key="fails-once")
    assert future.exception() is not None
    (worker,) = cluster.scheduler.workers.values()
    assert _compat.erred_on("fails-once", cluster.scheduler) == [(str(worker.name), worker.address)]
    assert _compat.erred_on("no-such-key", cluster.scheduler) == []


def _own_state() -> tuple[str | None, object]:
    record = _compat.worker_task(thread_state.key)
    return (record.state if record is not None else None), _compat.worker_task("no-such-key")


def test_worker_task_sees_the_running_task(local: tuple[LocalCluster, Client]) -> None:
    _, client = local
    # nbcluster's cancellation check reads this record and treats errors as "not
    # cancelled", so only this test notices if Dask moves it.
    assert client.submit(_own_state, pure=False).result() == ("executing", None)


def test_worker_task_outside_a_worker_says_so() -> None:
    with pytest.raises(ValueError):
        _compat.worker_task("anything")


def test_apply_scale_and_stop_adaptive_on_a_spec_cluster() -> None:
    # How the supervisor scales dask-jobqueue and SSH clusters (nbcluster/cluster/deploy.py).
    async def check() -> None:
        async with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0", asynchronous=True) as cluster:
            cluster.scale(2)
            await _compat.apply_scale(cluster)
            assert len(cluster.workers) == 2 and len(cluster.scheduler.workers) == 2
            adaptive = cluster.adapt(minimum=1, maximum=3)
            # adapt() starts its periodic callback from the event loop: let it.
            async def started() -> None:
                while adaptive.state != "running":
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(started(), 10)
            callback = adaptive.periodic_callback
            assert callback is not None and callback.is_running()
            _compat.stop_adaptive(cluster)
            assert adaptive.state == "stopped" and not callback.is_running()
            _compat.stop_adaptive(cluster)  # nothing running: no error

    asyncio.run(check())


def test_start_spec_scheduler_starts_the_scheduler_and_no_worker_yet() -> None:
    # How the supervisor tells a kernel where the scheduler is before the workers are up.
    from distributed import Scheduler, SpecCluster, Worker

    async def check() -> None:
        cluster = SpecCluster(
            workers={"w": {"cls": Worker, "options": {"nthreads": 1, "host": "127.0.0.1"}}},
            scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}},
            asynchronous=True,
        )
        try:
            await _compat.start_spec_scheduler(cluster)
            assert cluster.scheduler.address.startswith("tcp://127.0.0.1:")
            assert cluster.workers == {} and not cluster.scheduler.workers
            await cluster  # then the workers, the scheduler as it is
            assert list(cluster.workers) == ["w"] and len(cluster.scheduler.workers) == 1
        finally:
            await cluster.close()

    asyncio.run(check())


def test_an_accepted_tls_stream_keeps_the_servers_context_and_its_checks(tmp_path: Any) -> None:
    # A real TLS server, as Dask's listener makes it: its accepted stream takes the server's
    # context, tornado's default client context (the CA store) is not made, and the server
    # still refuses a client without a certificate it signed.
    import socket
    import ssl

    import tornado.netutil
    import tornado.tcpserver
    from tornado.iostream import SSLIOStream, StreamClosedError
    from tornado.netutil import _client_ssl_defaults

    from nbcluster.cluster.credentials import write_credentials

    security, tls = write_credentials(tmp_path, "c")
    server_context = security.get_listen_args("scheduler")["ssl_context"]
    client_context = security.get_connection_args("client")["ssl_context"]
    streams: list[SSLIOStream] = []
    greetings: list[bytes] = []
    original = tornado.tcpserver.SSLIOStream

    class Server(tornado.tcpserver.TCPServer):
        async def handle_stream(self, stream: Any, address: Any) -> None:
            streams.append(stream)
            with contextlib.suppress(StreamClosedError):
                greetings.append(await stream.read_bytes(5))
            stream.close()

    async def talk(context: ssl.SSLContext) -> None:
        server = Server(ssl_options=server_context)
        [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server.add_sockets([sock])
        port = sock.getsockname()[1]

        def client() -> None:
            with (
                socket.create_connection(("127.0.0.1", port)) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
            ):
                conn.sendall(b"hello")
                conn.recv(1)  # until the server closes

        try:
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await asyncio.wait_for(asyncio.to_thread(client), 10)
        finally:
            server.stop()

    try:
        _compat.accepted_tls_streams_keep_their_context()
        _compat.accepted_tls_streams_keep_their_context()  # idempotent: one subclass deep
        assert tornado.tcpserver.SSLIOStream.__bases__ == (SSLIOStream,)
        _client_ssl_defaults.cache_clear()
        asyncio.run(talk(client_context))
        assert greetings == [b"hello"]
        assert streams[0]._ssl_options is server_context
        assert _client_ssl_defaults.cache_info().currsize == 0
        # Without a certificate: the handshake fails on the server's checks, as before.
        anonymous = ssl.create_default_context(cafile=tls["ca_file"])
        anonymous.check_hostname = False
        streams.clear()
        greetings.clear()
        asyncio.run(talk(anonymous))
        assert greetings == []
    finally:
        tornado.tcpserver.SSLIOStream = original  # type: ignore[attr-defined]


def test_nanny_logs_reads_a_nannys_own_log() -> None:
    # A real nanny process: its log says it started, newest record first.
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            worker_dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        [nanny] = [w["nanny"] for w in client.scheduler_info()["workers"].values()]
        records = _compat.nanny_logs(client, nanny)
    assert records and all(isinstance(level, str) and isinstance(msg, str) for level, msg in records)
    assert any("Start Nanny at" in msg for _, msg in records), records


def test_quick_worker_handshake_shortens_the_nannys_poll() -> None:
    from distributed.nanny import WorkerProcess

    before = WorkerProcess._init_msg_interval  # Dask's 50 ms: the attribute must exist
    try:
        _compat.quick_worker_handshake(0.002)
        assert WorkerProcess._init_msg_interval == 0.002
        # A nanny made now starts its worker with the short poll, and the worker runs.
        with (
            LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster,
            Client(cluster, set_as_default=False) as client,
        ):
            assert client.submit(lambda: 1).result() == 1
    finally:
        WorkerProcess._init_msg_interval = before


def _stored_length(key: str, dask_worker: object = None) -> int:
    return len(dask_worker.data[key])  # type: ignore[attr-defined]  # a distributed Worker


def test_run_on_holder_runs_in_the_event_loop_of_the_worker_holding_a_key() -> None:
    # Two real worker processes: the function must run on the one that holds the key.
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        workers = sorted(client.scheduler_info()["workers"])
        value = client.submit(lambda: "x" * 1000, workers=[workers[1]], pure=False)
        value.result()
        assert _compat.run_on_holder(client, value.key, _stored_length, value.key) == 1000
        assert _compat.run_on_holder(client, "no-such-key", _stored_length, "no-such-key") is None
        with pytest.raises(KeyError):
            _compat.run_on_holder(client, value.key, _stored_length, "another-key")


def test_quick_sends_shortens_the_clients_batching_interval(local: tuple[LocalCluster, Client]) -> None:
    _, client = local
    assert client.scheduler_comm.interval == pytest.approx(0.01)  # Dask's own: what the call changes
    try:
        _compat.quick_sends(client, 0.002)
        assert client.scheduler_comm.interval == pytest.approx(0.002)
        assert client.submit(int, "3").result(timeout=10) == 3  # and the client still works
    finally:
        _compat.quick_sends(client, 0.01)


def test_nested_task_runs_first_inside_the_task_that_takes_it(local: tuple[LocalCluster, Client]) -> None:
    _, client = local
    dep = client.submit(int, "4")
    assert client.submit(pow, _compat.nested_task(int, "2"), dep, pure=False).result(timeout=10) == 16


def test_the_streams_of_a_scheduler_and_a_worker_can_send_at_once(local: tuple[LocalCluster, Client]) -> None:
    # cluster/streams.py sets these on the schedulers and local workers nbcluster starts.
    cluster, client = local
    [worker] = cluster.workers.values()
    streams = _compat.scheduler_streams(cluster.scheduler)
    assert len(streams) == 2  # one worker, one client
    assert [s.interval for s in streams] == [pytest.approx(0.005), pytest.approx(0.002)]  # Dask's own
    address = next(iter(cluster.scheduler.workers))
    assert _compat.scheduler_streams(cluster.scheduler, worker=address) == streams[:1]
    stream = _compat.worker_stream(worker)
    assert stream is not None and stream.interval == pytest.approx(0.002)
    for s in [*streams, stream]:
        _compat.send_at_once(s)
    assert [s.interval for s in [*streams, stream]] == [0.0, 0.0, 0.0]
    assert client.submit(int, "5").result(timeout=10) == 5  # and the streams still carry messages


def test_a_started_cluster_sends_at_once_on_every_stream(cluster: Any) -> None:
    # What cluster/streams.py installs: Dask's 2-10 ms of holding back, on every hop, is gone.
    from nbcluster._compat import scheduler_streams, worker_stream

    def on_scheduler(dask_scheduler: Any) -> list[float]:
        return [s.interval for s in scheduler_streams(dask_scheduler)]

    assert set(cluster.client.run_on_scheduler(on_scheduler)) == {0.0}
    assert set(cluster.client.run(lambda dask_worker: worker_stream(dask_worker).interval).values()) == {0.0}
    assert cluster.client.scheduler_comm.interval == 0.0


def _as_worker_sees(worker: Any) -> tuple[Any, ...]:
    from distributed import get_worker

    with _compat.as_worker(worker, "direct-key"):
        inside = (get_worker() is worker, thread_state.key, worker.get_current_task(), _compat.running_task_key())
    return (*inside, hasattr(thread_state, "key"), dict(worker.active_threads))  # and after it, nothing is left set


def test_as_worker_makes_a_pool_thread_the_workers_and_no_task(local: tuple[LocalCluster, Client]) -> None:
    # A direct batch runs in the worker's thread pool outside any task (`worker.serve`):
    # an item's `get_worker()` must answer that worker, and nbcluster's cancellation check
    # must not look for a task of that key (it would find none, and stop the batch).
    cluster, _ = local
    [worker] = cluster.workers.values()
    pool = worker.executors["default"]
    # Dask's call stacks and `get_current_task()` see the batch as a task's, while it runs.
    assert pool.submit(_as_worker_sees, worker).result() == (True, "direct-key", "direct-key", None, False, {})


def test_worker_accepts_work_names_a_paused_worker(local: tuple[LocalCluster, Client]) -> None:
    from distributed.core import Status

    cluster, _ = local
    [worker] = cluster.workers.values()
    assert _compat.worker_accepts_work(worker) is None
    worker.status = Status.paused
    try:
        assert _compat.worker_accepts_work(worker) == "paused"
    finally:
        worker.status = Status.running


def test_keep_forkserver_preload_stops_dask_from_replacing_it() -> None:
    # In a fresh process, as a supervisor is: Dask's first forkserver context would import
    # its list of packages and make that the preload.
    probe = (
        "import multiprocessing.forkserver as fs, sys, dask\n"
        "from nbcluster import _compat\n"
        "from distributed.utils import get_mp_context\n"
        "fs.set_forkserver_preload(['ours'])\n"
        "_compat.keep_forkserver_preload()\n"
        "with dask.config.set({'distributed.worker.multiprocessing-method': 'forkserver'}):\n"
        "    get_mp_context()\n"
        "print(fs._forkserver._preload_modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['ours']"


def test_worker_environ_is_what_a_nanny_spawns_its_worker_with(monkeypatch: pytest.MonkeyPatch) -> None:
    # forkserver.worker_environ follows Dask's rule for the nanny's pre-spawn variables: a
    # variable already set wins, a null one is left out, the hash seed where none (or 0) is set.
    import dask.config
    from distributed import Nanny

    from nbcluster import config
    from nbcluster.cluster.forkserver import worker_environ

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    ours = {**config.worker_pre_spawn_environ(), "NBCLUSTER_LEFT_OUT": None, "NBCLUSTER_ADDED": 7}

    async def pre_spawn_env() -> dict[str, str]:
        nanny = Nanny("tls://127.0.0.1:1")  # made, not started
        return dict(nanny.pre_spawn_env)

    with dask.config.set({"distributed.nanny.pre-spawn-environ": ours}):
        nanny_env = asyncio.run(pre_spawn_env())
        predicted = worker_environ(os.environ)
    assert nanny_env["MALLOC_TRIM_THRESHOLD_"] == "12345" and "NBCLUSTER_LEFT_OUT" not in nanny_env
    assert predicted == {**os.environ, **nanny_env, "__DASK_PARENT_PID": str(os.getpid())}


def test_call_in_loop_runs_in_the_clients_event_loop(local: tuple[LocalCluster, Client]) -> None:
    import threading

    _, client = local
    ran: list[str] = []
    done = threading.Event()

    def where() -> None:
        ran.append(threading.current_thread().name)
        done.set()

    _compat.call_in_loop(client, where)
    assert done.wait(10)
    assert ran != [threading.current_thread().name]  # not here: in the loop's own thread


def _pid() -> int:
    return os.getpid()


def test_worker_call_and_run_on_worker_reach_a_worker_without_the_scheduler(local: tuple[LocalCluster, Client]) -> None:
    _, client = local
    (worker,) = client.scheduler_info()["workers"]
    assert client.sync(_compat.run_on_worker, client, worker, _pid) == os.getpid()  # in-process worker
    assert client.sync(_compat.worker_call, client, worker, "keys") == []


def test_worker_exchange_reads_a_message_sent_before_the_answer(local: tuple[LocalCluster, Client]) -> None:
    cluster, client = local
    (worker,) = cluster.workers.values()

    async def two_messages(comm: Any, word: str) -> dict[str, str]:
        await comm.write({"first": word.encode()})  # on the request's connection, as worker.serve does
        return {"status": "OK", "word": word}  # the answer Dask sends

    worker.handlers["nbcluster_test_two"] = two_messages
    try:
        before: list[bytes] = []
        message = {"op": "nbcluster_test_two", "reply": True, "word": "hi"}
        answer = client.sync(_compat.worker_exchange, client, worker.address, message, before.append)
        assert before == [b"hi"] and answer == {"status": "OK", "word": "hi"}
        # The connection went back to the pool clean: the next request reads its own answer.
        assert client.sync(_compat.worker_call, client, worker.address, "keys") == []
    finally:
        del worker.handlers["nbcluster_test_two"]


def test_a_comms_front_end_messages_stay_on_the_subshell_they_came_on() -> None:
    # ipykernel's shell channel thread asks the comm where a message goes
    # (`_reply_subshell_for`); a comm last used from the main shell sends it there.
    import inspect
    import threading

    from ipykernel import kernelbase
    from ipykernel.comm import Comm

    if not hasattr(kernelbase.Kernel, "shell_channel_thread_main"):
        # ipykernel before 7 (the minimum-versions lane): no subshells, so nothing to keep a
        # message on; the call leaves a comm without the hook as it was.
        comm = Comm.__new__(Comm)
        _compat.comm_replies_on_senders_subshell(comm)
        assert "_reply_subshell_for" not in vars(comm)
        return
    assert "_reply_subshell_for" in inspect.getsource(kernelbase.Kernel.shell_channel_thread_main)
    comm = Comm.__new__(Comm)
    comm._reply_subshell_lock = threading.Lock()
    comm._reply_subshell_ids = {}
    comm._reply_subshell_id = None  # what publishing from a cell leaves behind
    assert comm._reply_subshell_for({"method": "custom"}, "sub-1") is None  # to the main shell
    _compat.comm_replies_on_senders_subshell(comm)
    assert comm._reply_subshell_for({"method": "custom"}, "sub-1") == "sub-1"
