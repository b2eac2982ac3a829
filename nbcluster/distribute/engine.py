"""The engine of a run: what it sends (`Job`), where items may run (`placement`), and the
driver thread that submits batches and streams them back (`Engine`).

`Engine._drive` owns everything between the first submit and the last result. It keeps
`in-flight` batches per usable worker thread submitted (one running, the next already
waiting on the worker, so no thread waits for the kernel between batches), sizes each new
batch with `batching.Batcher` (one item until an item time is measured, then growing), and
turns each finished batch into `Results` deliveries. Per batch it decides:

- a worker-side failure of the whole batch (the worker died too often: `KilledWorker`)
  fails its items, which `--retries` may resubmit like any failed item;
- a batch whose context cannot load on the worker (a module missing there) is *fatal*:
  every other batch would fail the same way, so the rest is failed at once, with that
  one message, and nothing more is submitted;
- a batch that found a scattered value *lost* (every worker holding it died) makes the
  engine scatter it again from the kernel and resubmit the batch, up to 10 times a run.

Stopping (`cancel()`: Ctrl-C in the waiting cell, or `Results.cancel()`) keeps finished
work. Nothing more is submitted; every worker is told the run's stop token
(`worker.stop_run`), so each running batch returns after its current item with the items
it finished, and batches still queued return at once. The kernel waits for those
(`distribute.cancel-grace`, 2 s, at most) and delivers them; whatever is still out after
that (an item that runs for minutes) is cancelled on the scheduler, and its items count as
cancelled. Because only `in-flight` batches per thread are ever out, a stop drains in about
one item's time. Each start (the first run, each `retry()`) has its own token, so a
retry is not stopped by an earlier cancel.

A cluster that goes away mid-run (its supervisor killed, its scheduler gone) is noticed
by a watch thread within half a second (`_watch`): the items not yet finished are given up
as *lost* (not failed: nothing is wrong with them), the run ends, and the client is closed
at once, so that its reconnect attempts log nothing into the cell. `retry()` then
connects afresh, to whatever cluster is current by then.

`--everywhere` uses `_drive_everywhere`: one task pinned to each worker, and a task whose
worker leaves the cluster is failed rather than left waiting forever.
"""

from __future__ import annotations

import contextlib
import itertools
import marshal
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import cloudpickle

from nbcluster import config
from nbcluster.distribute import worker
from nbcluster.distribute.batching import Batcher
from nbcluster.distribute.capture import Capture, pin_soon, shipments
from nbcluster.distribute.cell import Cell
from nbcluster.distribute.plan import Plan
from nbcluster.distribute.results import Results
from nbcluster.errors import BadArgument, ClusterUnreachable, NoCluster

WATCH_S = 0.5  # how often a running run checks that its cluster is still there


class Job:
    """What a run sends: the code, the captured names, and how items are placed."""

    def __init__(self, *, cell: Cell | None, fn: Any, seed: int | None, gpus: Any, cpus: Any, cpu_only: bool,
                 retries: int, batch: int | str):  # fmt: skip
        self.cell, self.fn, self.seed = cell, fn, seed
        self.gpus, self.cpus, self.cpu_only = gpus, cpus, cpu_only
        self.retries, self.batch = retries, batch
        self.capture = Capture()

    def spec(
        self, the_plan: Plan, *, for_workers: bool, large: list[tuple[str, str, int]] | None = None
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "kind": "cell" if self.cell is not None else "function",
            "mode": the_plan.mode,
            "names": the_plan.names,
            "target": the_plan.target,
            "unpacks": the_plan.unpacks,
            "positional": the_plan.positional,
            "seed": self.seed,
            "large": large or [],
            "modules": self.capture.modules,
            "values": self.capture.values,
        }
        if self.cell is not None:
            body, last = self.cell.body, self.cell.last
            if for_workers:
                body = marshal.dumps(body)
                last = None if last is None else marshal.dumps(last)
            spec.update(filename=self.cell.filename, source=self.cell.source, body=body, last=last)
        else:
            spec["fn"] = self.fn
            if for_workers:
                try:
                    spec["fn"] = cloudpickle.dumps(self.fn)
                except Exception as e:
                    name = getattr(self.fn, "__name__", repr(self.fn))
                    raise BadArgument(
                        f"the function {name} cannot be sent to the workers: {type(e).__name__}: {e}"
                    ) from None
        return spec

    def check_items(self, the_plan: Plan, first: int) -> None:
        """Fail early, naming the item, when item values cannot travel."""
        if the_plan.mode == "everywhere":
            return
        try:
            cloudpickle.dumps(the_plan.items[first])
        except Exception as e:
            raise BadArgument(
                f"item {first} ({the_plan.describe(first)}) cannot be sent to the workers: "
                f"{type(e).__name__}: {e}"
            ) from None


class Engine:
    """Submits and follows one Results' batches; see the module docstring."""

    def __init__(self, job: Job, run_id: str, *, client: Any, cluster: str | None):
        self.job = job
        self.run_id = run_id
        self.client = client
        self.cluster = cluster
        self.connected = False
        self.handle: Any = None  # the cluster's handle, when this engine found the client itself
        self.local_only = False
        self.eligible: list[str] = []
        self.threads = 1
        self.submit_kwargs: dict[str, Any] = {}
        self.results: Results | None = None
        self.plan: Plan | None = None
        self.context_key = f"nbcluster-context-{run_id}"
        self.context: tuple[str, bytes | None] | None = None  # (key, inline blob or None)
        self._context_blob = b""
        self._context_future: Any = None
        self._reships = 0
        self._lock = threading.Lock()
        self._pending: dict[Any, Any] = {}  # future -> the item indices of its batch
        self._stopping = False  # cancel() was called: submit nothing more
        self._idle = threading.Event()  # set while no batch is out (and delivered)
        self._idle.set()
        self._starts = 0
        self.token = ""  # this start's stop token (see worker.stop_run)
        self.stop_sent = threading.Event()  # every worker has been told the token
        self._seq = itertools.count()
        self._completed: Any = None

    # -- set-up (kernel main thread) -------------------------------------------------------
    def connect(self) -> None:
        if self.connected:
            return
        if self.client is None:
            from nbcluster._current import handle_for

            try:
                self.handle = handle_for(self.cluster)
            except NoCluster as e:
                raise NoCluster(f"{e}; or run the items in this kernel with --local") from None
            self.client = self.handle.client
        try:
            workers = self.client.scheduler_info()["workers"]
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(f"the cluster's scheduler does not answer: {e}") from None
        self.submit_kwargs, self.threads, self.eligible = placement(self.job, workers)
        self.connected = True

    def bind(self, results: Results, the_plan: Plan) -> None:
        self.results, self.plan = results, the_plan
        results._engine = self

    def ship(self) -> list[str]:
        """Scatter large values (cached) and this run's context blob; report lines."""
        assert self.plan is not None
        self.connect()
        if self.context is not None:
            return []
        try:
            large, notes = shipments(self.client).ship(self.client, self.job.capture.large)
            blob = cloudpickle.dumps(self.job.spec(self.plan, for_workers=True, large=large))
            self._context_blob = blob
            if len(blob) > worker.INLINE_CONTEXT:
                self._context_future = self._scatter_context()
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(
                f"could not send the cell's data to the workers ({e}); if a worker just died, "
                "run the cell again in a moment"
            ) from None
        self.context = (self.context_key, blob if len(blob) <= worker.INLINE_CONTEXT else None)
        return notes

    def _scatter_context(self, workers: list[str] | None = None) -> Any:
        key = self.context_key
        future = self.client.scatter(
            {key: self._context_blob}, workers=workers, broadcast=workers is None, hash=False
        )[key]
        pin_soon(self.client, future, len(self._context_blob))
        return future

    def _reship(self, key: str, to: str | None) -> bool:
        """Send again a scattered value every holder of which died; False to give up.

        It goes to the worker that asked (`to`), which is alive; the others fetch it from
        there. Broadcasting could pick a dead worker the scheduler still lists, and wait
        out its connect timeout. Batches that were already running report the loss too:
        once the value is back on the cluster they are simply submitted again.
        """
        try:
            current = self._context_future if key == self.context_key else shipments(self.client).future(key)
            # A value lost with all its holders shows as a cancelled future here.
            if (
                current is not None
                and current.status == "finished"
                and self.client.who_has([current]).get(key)
            ):
                return True
            self._reships += 1
            if self._reships > 10:
                return False
            workers = [to] if to else None
            if key == self.context_key:
                self._context_future = self._scatter_context(workers)
                return True
            return shipments(self.client).reship(self.client, key, self.job.capture.large, workers)
        except (OSError, TimeoutError):
            return False

    def run_local(self, indices: range | list[int]) -> bool:
        """Run items in the kernel; False if one failed (then nothing is sent)."""
        assert self.results is not None and self.plan is not None
        namespace = {"__name__": "__main__", **self.job.capture.direct}
        context = worker.Context(self.job.spec(self.plan, for_workers=False), namespace)
        for i in indices:
            out = worker.run_items(context, [i], [self.plan.items[i]], capture=False)
            self.results._deliver([i], out["values"], out["errors"], {}, where="the kernel")
            if out["errors"]:
                return False
        return True

    # -- driving (a background thread) -------------------------------------------------------
    def start(self, indices: list[int]) -> None:
        self._starts += 1
        self.token = f"{self.run_id}-{self._starts}"
        self._stopping = False
        self.stop_sent.clear()
        name = f"nbcluster-distribute-{self.run_id}"
        target = self._drive_everywhere if self.plan and self.plan.mode == "everywhere" else self._drive
        driver = threading.Thread(target=target, args=(indices,), name=name, daemon=True)
        driver.start()
        threading.Thread(target=self._watch, args=(driver,), name=f"{name}-watch", daemon=True).start()

    def _watch(self, driver: threading.Thread) -> None:
        """End the run if its cluster goes away (see the module docstring)."""
        unanswered = 0
        while driver.is_alive():
            driver.join(WATCH_S)
            if not driver.is_alive() or self._stopping:
                return
            reason = self._gone()
            # An external scheduler is judged by the client's connection alone; a dropped
            # connection that comes back within a couple of seconds is not a lost cluster.
            unanswered = unanswered + 1 if reason else 0
            if reason and (reason != "its scheduler stopped answering" or unanswered * WATCH_S >= 2):
                self._lose(reason)
                return

    def _gone(self) -> str | None:
        entry = getattr(self.handle, "entry", None) or {}
        pid = entry.get("supervisor_pid")
        if pid:
            from nbcluster.cluster import registry

            if not registry.process_alive(pid, entry.get("supervisor_started")):
                return "its supervisor exited"
        if self.client.status != "running":
            return "its scheduler stopped answering"
        return None

    def _lose(self, reason: str) -> None:
        assert self.results is not None
        with self._lock:
            self._stopping = True
            self._pending.clear()
            completed = self._completed
        name = getattr(self.handle, "name", None) or self.cluster or "the cluster"
        self.results._lose(f"cluster {name!r} stopped answering ({reason})")
        if completed is not None:
            completed.clear()
        client, self.connected, self.context = self.client, False, None
        if self.handle is not None:  # ours to drop: retry() connects afresh
            self.client, self.handle = None, None
        with contextlib.suppress(Exception):
            client.close(timeout=2)

    def retry(self, indices: list[int]) -> None:
        """Run `indices` again (Results.retry waits and reports)."""
        assert self.results is not None
        if self.local_only:  # a --local run is retried in the kernel too
            self.results._begin(indices)
            try:
                self.run_local(indices)
            finally:
                self.results._end()
            return
        self.connect()
        self.ship()
        self.results._begin(indices)
        self.start(indices)

    def cancel(self) -> None:
        """Stop the run, keeping every item that finished (see the module docstring)."""
        with self._lock:
            self._stopping = True
            busy = bool(self._pending)
        if busy:
            # In a thread: a worker that hangs must not hold the kernel beyond the grace.
            threading.Thread(target=self._tell_workers, name="nbcluster-stop", daemon=True).start()
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
                self._idle.wait(config.seconds("distribute.cancel-grace"))
        self._cancel_outstanding()

    def _cancel_outstanding(self) -> None:
        """Cancel on the scheduler whatever is still out; its items are given up."""
        with self._lock:
            self._stopping = True
            futures = list(self._pending)
            self._pending.clear()
            completed = self._completed
        if futures:
            self.client.cancel(futures, reason="interrupted from the notebook")
        if completed is not None:
            completed.clear()

    def _tell_workers(self) -> None:
        # If the cluster is gone, the scheduler-side cancel is all that is left to do.
        with contextlib.suppress(Exception):
            self.client.run(worker.stop_run, self.token, on_error="return")
        self.stop_sent.set()

    def _drive(self, indices: list[int]) -> None:
        from distributed import as_completed

        assert self.results is not None
        attempts = dict.fromkeys(indices, 0)

        def may_retry(i: int) -> bool:
            if attempts[i] >= self.job.retries:
                return False
            attempts[i] += 1
            return True

        batcher = Batcher.from_config(self.threads, None if self.job.batch == "auto" else int(self.job.batch))
        limit = max(1, int(config.get("distribute.in-flight"))) * self.threads
        queue = deque(indices)  # not yet submitted, in order
        completed = as_completed(loop=self.client.loop, with_results=True, raise_errors=False)
        with self._lock:
            self._completed = completed
        try:
            self._top_up(completed, queue, batcher, limit)
            for future, result in completed:
                with self._lock:
                    batch = self._pending.pop(future, None)
                if batch is None:
                    continue  # cancelled on the scheduler: its items were given up
                gone = None if future.status == "finished" or self._stopping else self._gone()
                if gone is not None:  # not the items' failure: Dask cancels what a dead cluster held
                    self._lose(gone)
                    break
                retry, fatal = self._handle(future, result, batch, may_retry, batcher)
                if fatal is not None:
                    self.results._fail(list(queue), fatal)
                    queue.clear()
                    self._cancel_outstanding()
                    break
                queue.extendleft(reversed(retry))
                self._top_up(completed, queue, batcher, limit)
                with self._lock:
                    if not self._pending:
                        self._idle.set()
                        break
        except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
            error = RuntimeError(f"nbcluster internal error while running the items: {type(e).__name__}: {e}")
            error.__cause__ = e  # its frames go in the record, for the bug report
            self.results._fail(
                [i for i in indices if self.results._state[i] == 0], worker.error_record(error)
            )
        finally:
            with self._lock:
                self._completed = None
                self._idle.set()
            self.results._end()

    def _top_up(self, completed: Any, queue: deque[int], batcher: Batcher, limit: int) -> None:
        """Submit batches from the front of `queue` until `limit` are out."""
        while queue and len(self._pending) < limit and not self._stopping:
            size = batcher.next_size(len(queue))
            self._submit(completed, [queue.popleft() for _ in range(size)], batcher.budget)

    def _submit(self, completed: Any, batch: list[int], budget: float | None = None) -> None:
        assert self.plan is not None and self.results is not None
        indices: Any = batch
        if batch and batch[-1] - batch[0] == len(batch) - 1:
            indices = range(batch[0], batch[-1] + 1)  # contiguous: pickles in a few bytes
        try:
            blob = cloudpickle.dumps((indices, [self.plan.items[i] for i in batch], budget))
        except Exception as e:
            self.results._fail(
                batch, worker.error_record(TypeError(f"the item values cannot be sent to the workers: {e}"))
            )
            return
        key = f"distribute-{self.run_id}-{next(self._seq)}"
        with self._lock:
            if self._stopping:
                return
            future = self.client.submit(
                worker.run_batch, self.context, blob, self.token,
                key=key, pure=False, **self.submit_kwargs,
            )  # fmt: skip
            self._pending[future] = indices
            self._idle.clear()
        completed.add(future)

    def _handle(
        self,
        future: Any,
        result: Any,
        indices: Any,
        may_retry: Callable[[int], bool] | None = None,
        batcher: Batcher | None = None,
    ) -> tuple[list[int], dict[str, Any] | None]:
        """Deliver one batch, holding back failed items `may_retry` takes for another attempt.

        Returns (items to submit again, fatal record). Items a stopped batch did not reach
        stay pending (the run is ending: they become cancelled), unless the run goes on,
        when they are submitted again.
        """
        assert self.results is not None
        outcome = _unpack(future, result, len(indices))
        if outcome.lost is not None:
            if self._reship(*outcome.lost):
                return list(indices), None  # not the items' fault: no attempt used
            lost = worker.error_record(RuntimeError("a captured value was lost with the workers holding it"))
            outcome = _Outcome(
                [None] * len(indices), dict.fromkeys(range(len(indices)), lost), {}, fatal=lost
            )
        values, errors, outputs = outcome.values, outcome.errors, outcome.outputs
        if batcher is not None and outcome.seconds is not None:
            batcher.observe(len(values), outcome.seconds)
        retry: list[int] = []
        if outcome.fatal is None and may_retry is not None:
            retry = [indices[j] for j in errors if may_retry(indices[j])]
        if len(values) < len(indices) and not self._stopping:
            retry += list(indices[len(values) :])
        if retry:
            held = set(retry)
            keep = [j for j in range(len(values)) if indices[j] not in held]
            self.results._deliver(
                [indices[j] for j in keep],
                [values[j] for j in keep],
                {k: errors[j] for k, j in enumerate(keep) if j in errors},
                {i: o for i, o in outputs.items() if i not in held},
            )
        else:
            self.results._deliver(indices, values, errors, outputs)
        return retry, outcome.fatal

    def _drive_everywhere(self, indices: list[int]) -> None:
        assert self.results is not None and self.plan is not None
        items = self.plan.items
        futures: dict[Any, int] = {}
        changed = threading.Event()

        def submit(i: int) -> None:
            with self._lock:
                if self._stopping:
                    return
                future = self.client.submit(
                    worker.run_batch, self.context, cloudpickle.dumps(([i], [None], None)), self.token,
                    key=f"distribute-{self.run_id}-{next(self._seq)}", pure=False,
                    workers=[items[i]], allow_other_workers=False, **self.submit_kwargs,
                )  # fmt: skip
                self._pending[future] = [i]
                self._idle.clear()
            futures[future] = i
            future.add_done_callback(lambda _: changed.set())

        try:
            for i in indices:
                submit(i)
            while True:
                with self._lock:
                    pending = [f for f in futures if f in self._pending]
                if not pending or self._stopping:
                    break
                # Woken by a finished task, or once a second to look for departed workers.
                changed.wait(1.0)
                changed.clear()
                for future in [f for f in pending if f.done()]:
                    with self._lock:
                        batch = self._pending.pop(future, None)
                    if batch is not None:
                        for i in self._handle(future, _outcome(future), batch)[0]:
                            submit(i)
                    with self._lock:
                        if not self._pending:
                            self._idle.set()
                # A task pinned to a worker that has left would wait forever: fail it instead.
                try:
                    alive = set(self.client.scheduler_info()["workers"])
                except Exception:
                    if self._stopping:
                        break  # the cluster went away: _lose has ended the run
                    raise
                for future in pending:
                    i = futures[future]
                    if future.status == "pending" and items[i] not in alive:
                        with self._lock:
                            self._pending.pop(future, None)
                        future.cancel()
                        left = RuntimeError(f"worker {items[i]} left the cluster before running the cell")
                        self.results._fail([i], worker.error_record(left))
        finally:
            self._idle.set()
            self.results._end()


class _Outcome(NamedTuple):
    values: list[Any]  # of the first len(values) items of the batch: fewer if it stopped early
    errors: dict[int, dict[str, Any]]  # by position in the batch
    outputs: dict[int, Any]  # by item index
    seconds: float | None = None  # time the items took on the worker
    fatal: dict[str, Any] | None = None  # the context could not load: every batch would fail
    lost: tuple[str, str | None] | None = None  # (key no worker holds any more, who asked)


def _unpack(future: Any, result: Any, n: int) -> _Outcome:
    record: dict[str, Any] | None = None
    if future.status != "finished":
        record = _batch_failure(result[1] if isinstance(result, tuple) else result)
    else:
        try:
            data = cloudpickle.loads(result)
        except Exception as e:
            record = worker.error_record(
                TypeError(f"the results could not be loaded in the kernel: {type(e).__name__}: {e}")
            )
    if record is not None:
        return _Outcome([None] * n, dict.fromkeys(range(n), record), {})
    if "lost" in data:
        return _Outcome([], {}, {}, lost=(data["lost"], data.get("worker")))
    if "fatal" in data:
        return _Outcome([None] * n, dict.fromkeys(range(n), data["fatal"]), {}, fatal=data["fatal"])
    return _Outcome(data["values"], data["errors"], data["outputs"], data["seconds"])


def _outcome(future: Any) -> Any:
    """What as_completed(with_results=True) would give: the blob, or the exception."""
    try:
        return future.result()
    except BaseException as e:
        return e


def placement(job: Job, workers: dict[str, Any]) -> tuple[dict[str, Any], int, list[str]]:
    """Resource restrictions for `--gpus/--cpus/--cpu-only`, usable threads, eligible workers.

    nbcluster's CPU workers advertise `{"CPU": threads}` and GPU workers `{"GPU": 1}`, so
    `--cpu-only` is simply a `CPU` restriction: it can never land on a GPU worker.
    """
    resources: dict[str, float] = {}
    if job.gpus:
        resources["GPU"] = job.gpus
    if job.cpus:
        resources["CPU"] = job.cpus
    offered = {k for w in workers.values() for k in (w.get("resources") or {})}
    if job.cpu_only and "CPU" not in resources:
        if "CPU" in offered:
            resources["CPU"] = 1
        elif "GPU" in offered:
            raise BadArgument(
                "--cpu-only: this cluster's workers do not say which ones are CPU workers (none "
                "advertises a CPU resource); start the cluster with nbcluster, or drop --cpu-only"
            )
    if "CPU" in resources and "CPU" not in offered and workers:
        raise BadArgument(
            "--cpus needs workers that advertise a CPU resource (nbcluster's clusters do); this "
            "cluster's workers advertise none"
        )
    eligible, threads = [], 0
    for address, info in workers.items():
        have = info.get("resources") or {}
        if all(have.get(k, 0) >= v for k, v in resources.items()):
            eligible.append(address)
            slots = min([int(have[k] // v) for k, v in resources.items()], default=info.get("nthreads", 1))
            threads += max(1, min(slots, info.get("nthreads", 1)))
    if resources and workers and not eligible:
        wanted = ", ".join(f"{k}={v:g}" for k, v in resources.items())
        fix = " Start GPU workers with `%cluster start --gpus N`." if "GPU" in resources else ""
        raise BadArgument(f"no worker offers {wanted} per item (workers offer: {_offers(workers)}).{fix}")
    kwargs = {"resources": resources} if resources else {}
    return kwargs, max(threads, 1), eligible


def _offers(workers: dict[str, Any]) -> str:
    kinds = sorted(
        {
            ", ".join(f"{k}={v:g}" for k, v in (w.get("resources") or {}).items()) or "no resources"
            for w in workers.values()
        }
    )
    return "; ".join(kinds)


def _batch_failure(exc: Any) -> dict[str, Any]:
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        exc = KilledWorker(f"the workers running these items kept dying (a crash, or out of memory?): {exc}")
    elif isinstance(exc, BaseException) and type(exc).__name__ == "CancelledError":
        exc = type(exc)("the batch was cancelled on the cluster")
    elif not isinstance(exc, BaseException):
        exc = RuntimeError(f"the batch failed: {exc!r}")
    record = worker.error_record(exc)
    for link in record["chain"]:
        link["frames"] = []  # Dask's own frames: nothing the user can act on
    return record
