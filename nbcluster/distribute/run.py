"""`distribute()`: check everything in the kernel, then submit, stream, gather, cancel, retry.

The order of a run, and why:

1. Validate arguments, parse the cell, evaluate `--over/--grid/--zip` in the user's
   namespace, capture the free names (pickling each: a bad one is named here), connect to
   the cluster and check resource restrictions can be met. Any of these failing raises an
   `NbclusterError` with one message, and nothing has been sent or written.
2. Create the `Results` (written to `--into` now, so a `--no-wait` variable exists at
   once), run the first `--local K` items in the kernel, ship large values (once per
   worker, cached) and the cell's context blob.
3. A driver thread (`Engine._drive`) submits the batches, probe first (see `plan.py`),
   streams each finished batch into the `Results` and resubmits failed items while
   `--retries` allow. It is the only thread that talks to Dask after the start, so
   `--no-wait` is the same code with the kernel's main thread returning at once.
4. With `wait=True`, the main thread follows the `Results` (`follow`): it prints item
   output as it arrives, then one summary line and the first traceback if items failed.
   Ctrl-C / the stop button lands there: the engine cancels every outstanding batch on the
   scheduler (one `client.cancel` call), the `Results` keep what finished, and an
   `Interrupted` exception (a `KeyboardInterrupt`, so "Run all" stops) ends the cell with
   one line instead of a traceback.

Worker loss: Dask re-runs the batches a dead worker held (its nanny restarts it);
`Results` ignores any second delivery for an item, so every item is reported exactly once.
"""

from __future__ import annotations

import builtins
import itertools
import marshal
import secrets
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import cloudpickle

from nbcluster.distribute import worker
from nbcluster.distribute.capture import Capture, capture, code_index, human, shipments
from nbcluster.distribute.cell import Cell
from nbcluster.distribute.plan import Plan, batch_sizes, fixed_sizes, plan, probe_size
from nbcluster.distribute.results import Results
from nbcluster.errors import BadArgument, ClusterUnreachable, NbclusterError, NoCluster

_SHOWN_OUTPUTS = 5  # items whose output is printed in full; the rest are counted


class Interrupted(KeyboardInterrupt):
    """The user stopped a waiting cell; outstanding items were cancelled on the cluster."""

    def __init__(self, message: str, results: Results):
        super().__init__(message)
        self.results = results

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback of nbcluster's waiting loop.
        return [f"Interrupted: {self.args[0]}"]


def distribute(
    body: str | Callable[..., Any],
    *,
    over: Any = None,
    grid: Any = None,
    zip: Any = None,
    namespace: dict[str, Any] | None = None,
    into: str | None = None,
    gpus: float | None = None,
    cpus: float | None = None,
    cpu_only: bool = False,
    retries: int = 0,
    batch: int | str = "auto",
    wait: bool = True,
    seed: int | None = None,
    everywhere: bool = False,
    local: int | str | bool = 0,
    cluster: str | None = None,
    client: Any = None,
    progress: Callable[[Results], None] | None = None,
    first_line: int = 1,
) -> Results:
    """Run a cell body (source) or a function on the cluster, once per item; see README.

    `body` is cell source (run with the item's names bound, value of its last expression
    kept) or a function (called as `fn(x)` for `over`, `fn(a, b)` for a tuple target,
    `fn(**params)` for `grid`/`zip`, `fn()` otherwise; plus `seed=` with `seed`).
    `over`, `grid`, `zip` are strings evaluated in `namespace` (default: the caller's
    globals and locals), or for functions also an iterable / a dict of lists.
    `first_line` is the notebook line number of the body's first line (2 in a cell magic).
    """
    _check(
        body, into, gpus, cpus, cpu_only, retries, batch, seed, everywhere, local, over, grid, zip, namespace
    )
    frame_globals = None
    if namespace is None:
        caller = sys._getframe(1)
        frame_globals = caller.f_globals
        namespace = {**caller.f_globals, **caller.f_locals}
    run_id = _run_id()
    cell = fn = None
    if isinstance(body, str):
        cell = Cell.parse(body, filename=f"<distribute-{run_id}>", first_line=first_line)
    else:
        fn = body
    job = Job(
        cell=cell, fn=fn, seed=seed, gpus=gpus, cpus=cpus, cpu_only=cpu_only, retries=retries, batch=batch
    )
    engine = Engine(job, run_id, client=client, cluster=cluster)

    if everywhere:
        engine.connect()
        the_plan = Plan("everywhere", list(engine.eligible))
        if not the_plan.items:
            raise BadArgument("--everywhere: the cluster has no workers right now; scale it up first")
    else:
        the_plan = plan(over=over, grid=grid, zip=zip, evaluate=_evaluator(namespace))
    n = len(the_plan)
    n_local = n if local in ("all", True) else min(int(local), n)
    remote = n_local < n
    if cell is not None and fn is None:
        bound = [*the_plan.names, *(["seed"] if seed is not None else [])]
        job.capture = capture(cell.free_names(bound), namespace, pickle_values=remote)
    if remote:
        engine.connect()
        job.check_items(the_plan, n_local)
    results = Results(the_plan, run_id=run_id, label=into)
    results.code_index = code_index([*job.capture.direct.values(), *([fn] if fn is not None else [])])
    engine.bind(results, the_plan)
    results._begin([])
    if into is not None:
        (frame_globals if frame_globals is not None else namespace)[into] = results
    if progress is not None:
        results.subscribe(progress)
        progress(results)

    engine.local_only = not remote
    try:
        if (n_local and not engine.run_local(range(n_local))) or not remote:
            # A failure in the kernel stops the fan-out: that is what --local K is for.
            results._cancel_pending()
            results._end()
            _report(results)
            return results
        notes = engine.ship()
    except BaseException as e:
        # Interrupted (or failed) before anything was submitted: the results end here.
        results._cancel_pending()
        results._end()
        if isinstance(e, KeyboardInterrupt):
            raise _interrupted(results) from None
        raise
    line = _shipped_line(job.capture, notes)
    if line:
        results.shipped = line
        print(line)
    engine.start(list(range(n_local, n)))
    if wait:
        follow(results)
    return results


def wait(target: Results | str, *, namespace: dict[str, Any] | None = None) -> Results:
    """Block until a `--no-wait` run finishes, printing its output and failures here.

    `target` is the `Results` or the name of the variable holding it (`%distribute wait NAME`).
    """
    if isinstance(target, str):
        name = target
        ns = namespace if namespace is not None else sys._getframe(1).f_globals
        if name not in ns:
            raise BadArgument(f"`{name}` is not defined: give the --into name of a --no-wait cell")
        target = ns[name]
        if not isinstance(target, Results):
            raise BadArgument(
                f"`{name}` is a {type(target).__name__}, not the results of a %%distribute cell"
            )
    follow(target)
    return target


def follow(results: Results) -> None:
    """Wait in the kernel's main thread, printing output as it comes; Ctrl-C cancels."""
    printer = _Printer(results)
    try:
        while not results.done:
            results._wait_change(printer.seen, 1.0)
            printer.flush()
        printer.flush()
    except KeyboardInterrupt:
        results.cancel()
        raise _interrupted(results) from None
    printer.finish()
    _report(results)


def _interrupted(results: Results) -> Interrupted:
    c = results.counts()
    where = f"`{results.label}`" if results.label else "sys.last_value.results (use --into NAME to keep them)"
    return Interrupted(
        f"{c['done']}/{c['total']} items finished, {c['cancelled']} cancelled; partial results are in {where}",
        results,
    )


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
        self._pending: dict[Any, Any] = {}
        self._cancelled = False
        self._seq = itertools.count()
        self._completed: Any = None

    # -- set-up (kernel main thread) -------------------------------------------------------
    def connect(self) -> None:
        if self.connected:
            return
        if self.client is None:
            from nbcluster._current import client_for

            try:
                self.client = client_for(self.cluster)
            except NoCluster as e:
                raise NoCluster(f"{e}; or run the items in this kernel with --local") from None
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
        large, notes = shipments(self.client).ship(self.client, self.job.capture.large)
        blob = cloudpickle.dumps(self.job.spec(self.plan, for_workers=True, large=large))
        self._context_blob = blob
        if len(blob) <= worker.INLINE_CONTEXT:
            self.context = (self.context_key, blob)
        else:
            self._context_future = self._scatter_context()
            self.context = (self.context_key, None)
        return notes

    def _scatter_context(self) -> Any:
        key = self.context_key
        future = self.client.scatter({key: self._context_blob}, broadcast=True, hash=False)[key]
        self.client.run(worker.pin, [(key, len(self._context_blob))])
        return future

    def _reship(self, key: str) -> bool:
        """Send again a scattered value every holder of which died; False to give up."""
        self._reships += 1
        if self._reships > 10:
            return False
        if key == self.context_key:
            self._context_future = self._scatter_context()
            return True
        return shipments(self.client).reship(self.client, key, self.job.capture.large)

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
        name = f"nbcluster-distribute-{self.run_id}"
        target = self._drive_everywhere if self.plan and self.plan.mode == "everywhere" else self._drive
        threading.Thread(target=target, args=(indices,), name=name, daemon=True).start()

    def retry(self, indices: list[int], *, wait: bool) -> None:
        assert self.results is not None
        if self.local_only:  # a --local run is retried in the kernel too
            self.results._begin(indices)
            self.run_local(indices)
            self.results._end()
            _report(self.results)
            return
        self.connect()
        self.ship()
        self._cancelled = False
        self.results._begin(indices)
        self.start(indices)
        if wait:
            follow(self.results)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            futures = list(self._pending)
            self._pending.clear()
            completed = self._completed
        if futures:
            self.client.cancel(futures, reason="interrupted from the notebook")
        if completed is not None:
            completed.clear()

    def _drive(self, indices: list[int]) -> None:
        from distributed import as_completed

        assert self.results is not None
        attempts = dict.fromkeys(indices, 0)

        def may_retry(i: int) -> bool:
            if attempts[i] >= self.job.retries:
                return False
            attempts[i] += 1
            return True

        queue = list(indices)  # not yet submitted, in order
        rate: float | None = None  # seconds per item, measured on the workers
        completed = as_completed(loop=self.client.loop, with_results=True, raise_errors=False)
        with self._lock:
            self._completed = completed
        try:
            if self.job.batch != "auto":
                queue = self._submit_all(completed, queue, fixed_sizes(len(queue), int(self.job.batch)))
            elif len(queue) <= self.threads:
                queue = self._submit_all(completed, queue, [1] * len(queue))
            else:
                probe = probe_size(len(queue), self.threads)
                queue = self._submit_all(completed, queue, [probe] * self.threads)
            for future, result in completed:
                with self._lock:
                    batch = self._pending.pop(future, None)
                    if self._cancelled:
                        break
                if batch is None:
                    continue
                retry, batch_rate, fatal = self._handle(future, result, batch, may_retry)
                if fatal is not None:
                    self.results._fail(queue, fatal)
                    self.cancel()
                    break
                rate = batch_rate if batch_rate is not None else rate
                queue = retry + queue
                # The rest goes out once a probe has measured the items (or nothing is left
                # in flight to measure, e.g. every probe's worker died).
                if queue and (rate is not None or not self._pending):
                    if self.job.batch != "auto":
                        sizes = fixed_sizes(len(queue), int(self.job.batch))
                    elif rate is not None:
                        sizes = list(batch_sizes(len(queue), self.threads, rate))
                    else:
                        sizes = fixed_sizes(len(queue), probe_size(len(queue), self.threads))
                    queue = self._submit_all(completed, queue, sizes)
        except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
            error = RuntimeError(f"nbcluster internal error while running the items: {type(e).__name__}: {e}")
            self.results._fail(
                [i for i in indices if self.results._state[i] == 0], worker.error_record(error)
            )
        finally:
            self.results._end()

    def _submit_all(self, completed: Any, queue: list[int], sizes: Any) -> list[int]:
        start = 0
        for size in sizes:
            self._submit(completed, queue[start : start + size])
            start += size
        return queue[start:]

    def _submit(self, completed: Any, batch: list[int]) -> None:
        assert self.plan is not None and self.results is not None
        indices: Any = batch
        if batch and batch[-1] - batch[0] == len(batch) - 1:
            indices = range(batch[0], batch[-1] + 1)  # contiguous: pickles in a few bytes
        try:
            blob = cloudpickle.dumps((indices, [self.plan.items[i] for i in batch]))
        except Exception as e:
            self.results._fail(
                batch, worker.error_record(TypeError(f"the item values cannot be sent to the workers: {e}"))
            )
            return
        key = f"distribute-{self.run_id}-{next(self._seq)}"
        with self._lock:
            if self._cancelled:
                return
            future = self.client.submit(
                worker.run_batch, self.context, blob,
                key=key, pure=False, **self.submit_kwargs,
            )  # fmt: skip
            self._pending[future] = indices
        completed.add(future)

    def _handle(
        self, future: Any, result: Any, indices: Any, may_retry: Callable[[int], bool] | None = None
    ) -> tuple[list[int], float | None, dict[str, Any] | None]:
        """Deliver one batch, holding back failed items `may_retry` takes for another attempt.

        Returns (items to submit again, seconds per item measured on the worker, fatal record).
        """
        assert self.results is not None
        outcome = _unpack(future, result, len(indices))
        if outcome.lost is not None:
            if self._reship(outcome.lost):
                return list(indices), None, None  # not the items' fault: no attempt used
            lost = worker.error_record(RuntimeError("a captured value was lost with the workers holding it"))
            outcome = _Outcome(
                [None] * len(indices), dict.fromkeys(range(len(indices)), lost), {}, fatal=lost
            )
        values, errors, outputs = outcome.values, outcome.errors, outcome.outputs
        retry: list[int] = []
        if outcome.fatal is None and may_retry is not None:
            retry = [indices[j] for j in errors if may_retry(indices[j])]
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
        return retry, outcome.rate, outcome.fatal

    def _drive_everywhere(self, indices: list[int]) -> None:
        assert self.results is not None and self.plan is not None
        items = self.plan.items
        futures: dict[Any, int] = {}
        changed = threading.Event()

        def submit(i: int) -> None:
            with self._lock:
                if self._cancelled:
                    return
                future = self.client.submit(
                    worker.run_batch, self.context, cloudpickle.dumps(([i], [None])),
                    key=f"distribute-{self.run_id}-{next(self._seq)}", pure=False,
                    workers=[items[i]], allow_other_workers=False, **self.submit_kwargs,
                )  # fmt: skip
                self._pending[future] = [i]
            futures[future] = i
            future.add_done_callback(lambda _: changed.set())

        try:
            for i in indices:
                submit(i)
            while True:
                with self._lock:
                    pending = [f for f in futures if f in self._pending]
                if not pending or self._cancelled:
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
                # A task pinned to a worker that has left would wait forever: fail it instead.
                alive = set(self.client.scheduler_info()["workers"])
                for future in pending:
                    i = futures[future]
                    if future.status == "pending" and items[i] not in alive:
                        with self._lock:
                            self._pending.pop(future, None)
                        future.cancel()
                        left = RuntimeError(f"worker {items[i]} left the cluster before running the cell")
                        self.results._fail([i], worker.error_record(left))
        finally:
            self.results._end()


class _Outcome(NamedTuple):
    values: list[Any]
    errors: dict[int, dict[str, Any]]  # by position in the batch
    outputs: dict[int, Any]  # by item index
    rate: float | None = None  # seconds per item, measured on the worker
    fatal: dict[str, Any] | None = None  # the context could not load: every batch would fail
    lost: str | None = None  # key of a scattered value no worker holds any more


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
        return _Outcome([], {}, {}, lost=data["lost"])
    if "fatal" in data:
        return _Outcome([None] * n, dict.fromkeys(range(n), data["fatal"]), {}, fatal=data["fatal"])
    count = data["count"]
    return _Outcome(
        data["values"], data["errors"], data["outputs"], data["elapsed"] / count if count else None
    )


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


def _evaluator(namespace: Any) -> Callable[[str, str], Any]:
    def evaluate(expression: str, flag: str) -> Any:
        try:
            code = compile(expression, f"<--{flag}>", "eval")
        except SyntaxError as e:
            raise BadArgument(f"--{flag}: {expression!r} is not a Python expression ({e.msg})") from None
        # A copy as globals: eval would add __builtins__ to the user's dict, and
        # comprehensions in the expression need the names as globals to see them.
        scope = dict(namespace)
        scope.setdefault("__builtins__", builtins)
        try:
            return eval(code, scope)
        except Exception as e:
            raise BadArgument(
                f"--{flag}: evaluating {expression!r} failed: {type(e).__name__}: {e}"
            ) from None

    return evaluate


def _shipped_line(cap: Capture, notes: list[str]) -> str:
    parts = []
    if cap.values:
        size = sum(len(b) for b in cap.values.values())
        parts.append(f"sent {', '.join(cap.values)} ({human(size)}) with the cell")
    if cap.modules:
        parts.append(f"import {', '.join(sorted(set(cap.modules.values())))} on the workers")
    parts.extend(notes)
    return "nbcluster: " + "; ".join(parts) if parts else ""


class _Printer:
    """Prints item output in the waiting cell: the first few items in full, then a count."""

    def __init__(self, results: Results):
        self.results = results
        self.seen = 0
        self.shown = 0
        self.hidden = 0

    def flush(self) -> None:
        order = self.results._output_order
        new, self.seen = order[self.seen : len(order)], len(order)
        for i in new:
            if self.shown >= _SHOWN_OUTPUTS:
                self.hidden += 1
                continue
            self.shown += 1
            described = self.results._plan.describe(i)
            sys.stdout.write(f"── item {i}{f' ({described})' if described else ''} ──\n")
            for stream, payload in self.results._outputs.get(i, []):
                if stream == "display":
                    _show(payload)
                else:
                    (sys.stdout if stream == "stdout" else sys.stderr).write(payload)
            sys.stdout.flush()
            sys.stderr.flush()

    def finish(self) -> None:
        if self.hidden:
            name = self.results.label or "results"
            print(f"── … and {self.hidden} more items printed output: {name}.output(i) shows item i's ──")


def _show(bundle: dict[str, Any]) -> None:
    """Show an item's display() output here: rich in IPython, as text elsewhere."""
    shell = sys.modules.get("IPython.core.interactiveshell")
    if shell is not None and shell.InteractiveShell.initialized():
        from IPython.display import display

        sys.stdout.flush()
        display(bundle, raw=True)
    else:
        print(bundle.get("text/plain", ""))


def _report(results: Results) -> None:
    errors = results.errors
    if not errors:
        return
    name = results.label or "results"
    text = results.summary() + "\n" + errors[0].traceback
    text += f"({name}.errors lists the failures, {name}.raise_first() raises the first, {name}.retry() re-runs them)\n"
    sys.stderr.write(text)
    sys.stderr.flush()


def _run_id() -> str:
    rid = secrets.token_hex(6)
    # Dask's key_split drops an all-letters hex word, but a digit keeps key prefixes tidy.
    return rid if any(c.isdigit() for c in rid) else "0" + rid[1:]


def _check(body: Any, into: Any, gpus: Any, cpus: Any, cpu_only: Any, retries: Any, batch: Any, seed: Any,
           everywhere: Any, local: Any, over: Any, grid: Any, zip_: Any, namespace: Any) -> None:  # fmt: skip
    if not isinstance(body, str) and not callable(body):
        raise BadArgument(f"distribute() needs cell source (a str) or a function, got {type(body).__name__}")
    if into is not None and (not isinstance(into, str) or not into.isidentifier()):
        raise BadArgument(f"into= needs a variable name, got {into!r}")
    for name, value in (("gpus", gpus), ("cpus", cpus)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise BadArgument(f"--{name} needs a number above 0, got {value!r}")
    if cpu_only and gpus:
        raise BadArgument("--cpu-only and --gpus contradict each other: pick one")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise BadArgument(f"--retries needs a whole number of 0 or more, got {retries!r}")
    if batch != "auto" and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise BadArgument(f"--batch needs 'auto' or a whole number of 1 or more, got {batch!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadArgument(f"--seed needs a whole number, got {seed!r}")
    if local not in ("all", True, False) and (not isinstance(local, int) or local < 0):
        raise BadArgument(
            f"--local needs a whole number of 0 or more (or nothing, for all items), got {local!r}"
        )
    if everywhere and any(v is not None for v in (over, grid, zip_)):
        raise BadArgument(
            "--everywhere runs the cell once per worker: it cannot be combined with --over/--grid/--zip"
        )
    if everywhere and local not in (0, False):
        raise BadArgument("--everywhere runs on the workers; it cannot be combined with --local")
    if namespace is not None and not hasattr(namespace, "__getitem__"):
        raise BadArgument("namespace= needs a dict of the notebook's variables")


__all__ = ["Interrupted", "NbclusterError", "distribute", "follow", "wait"]
