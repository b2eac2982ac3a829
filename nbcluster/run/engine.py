"""The engine of a run: the driver thread that submits batches and streams them back.

An `Engine` is made from a `Job` (what to run: `job.py`) and a `Link` (where: `target.py`,
None when every item runs in the kernel). It owns the run's `RunState` (`state.py`) and
writes it as batches finish (`api.py` also begins and ends a run's state around a
``--local`` part); the `Results` view reads it, and `api.Run` hands the user's verbs (cancel,
retry) to the engine. The engine decides nothing by itself: its `policy.Policy` says what to submit
and what a finished batch means, its `transport.Transport` sends batches and hands back
what finished, and the engine feeds the one the events of the other.

Policy
------
`_drive` owns everything between the first submit and the last result. It keeps
`in-flight` batches per usable worker thread submitted (one running, the next already
waiting on the worker, so no thread waits for the kernel between batches), sized by the
policy (`batching.Batcher`: the first item alone, then probes sharing out the items until
an item time is measured, each returning after its first item past `batching.PROBE_S`, then
sized from the time), and
turns each finished batch into deliveries to the state (`_settle`). The batches of one
top-up go to the scheduler as one graph (`submit_tasks`, a `client.map`), not one message
each. A `--persist` run, and one reading persisted values, sends one item a task instead
(a Dask key holds one value: `worker/held.py`), all at once as `client.map` would (at most
`PERSIST_AHEAD` per thread ahead), so that the scheduler's queue, not a round trip to the
kernel, feeds the workers. Per batch it decides:

- a batch whose workers kept dying (`KilledWorker`: Dask ran it on
  `allowed-failures + 1` workers, and each died) is split, not failed: one item that
  crashes its worker (`os._exit`, a segfault, past the memory limit) must not take the
  items batched with it down too. The halves become *suspects*, and a suspect runs
  *alone*: nothing else of the run is out while it runs (the others drain first), because
  Dask counts a death against every task a worker holds, queued ones too, and a suspect
  killed beside another batch proves nothing. A batch of one item killed while it ran
  alone is the culprit: that item fails with `WorkerKilled`, one line with the count and
  the last thing the worker's nanny logged (exit status, or the memory limit it passed).
  The run then goes on as before, on the restarted workers;
- a batch whose context cannot load on the worker (a module missing there) is *fatal*:
  every other batch would fail the same way, so the rest is failed at once, with that
  one message, and nothing more is submitted;
- a batch that found a scattered value *lost* (every worker holding it died) makes the
  engine scatter it again from the kernel and resubmit the batch, up to 10 times a run.
- a batch that failed because nbcluster cannot be imported where it was unpickled (a
  worker without it fails the batch as it runs it, `transport.task`, named in the line; the
  tasks themselves load anywhere, so a scheduler without nbcluster passes them on)
  *halts* the run: nothing more is submitted, the unfinished items are given up, not
  failed, and the waiting cell ends with one line naming the fix (`ClusterCannotRun`).
  It is looked for only in a batch that failed: a finished batch costs nothing more.

State of one start (the first run, each retry): its `policy.Policy` (the backlog, batch
sizes, suspects and retries: a pure state machine that this driver feeds the events of
each finished batch, and whose batches it submits); the transport's pending batches (each
future -> the item indices of its batch) and the start's stop token. The policy's
docstring has a worked example (it runs as a doctest).

Stopping (`cancel()`: Ctrl-C in the waiting cell, or `Results.cancel()`) keeps finished
work. Nothing more is submitted; every worker is told the start's stop token
(`worker.stop_run`, `Transport.stop`), so each running batch returns after its current item
with the items it finished, and batches still queued return at once. The kernel waits for those
(`distribute.cancel-grace`, 2 s, at most) and delivers them; whatever is still out after
that (an item that runs for minutes) is cancelled on the scheduler, and its items count as
cancelled. Because only `in-flight` batches per thread are ever out, a stop drains in about
one item's time. Each start has its own token, so a retry is not stopped by an earlier
cancel.

Adaptive clusters: the scheduler sees only the batches out, never the backlog in the
kernel, so every half second the watch thread (`_watch`) reports the backlog to the
scheduler (`hold_back`: items left and their expected seconds), where the adaptive
target counts it as queued work (`cluster/adaptive.py`), and re-reads the workers: the
backlog's `limit` grows with the threads that joined, so a new worker gets batches at
once, and shrinks with those that left. A cluster without that handler (a scheduler
nbcluster did not start) answers the first report with an error, and gets no more.

A cluster that goes away mid-run (its supervisor killed, its scheduler gone) is noticed
by the same watch thread within half a second: the items not yet finished are given up
as *lost* (not failed: nothing is wrong with them), the run ends, and the link is closed
at once, so that its client's reconnect attempts log nothing into the cell. `retry()` then
opens the link afresh, to whatever cluster is current by then.

`--everywhere` is its own strategy (`everywhere.py`): one task pinned to each worker, and
a task whose worker leaves the cluster is failed rather than left waiting forever. It
drives the same tasks through the engine's `submit_task`/`settle_task` verbs. So does
`--ranks N` (`ranks.py`): N tasks of one job, started together or not at all.

Shipping (`Shipment`): what a run sends the cluster before its first batch. Its *context* (the cell or function, what it captured: `job.Job.for_workers`) travels
inline in every batch when it is small (up to `worker.INLINE_CONTEXT` bytes), else is
scattered once to every worker under ``nbcluster-context-<run id>`` and pinned there. Large
captured values are scattered once per kernel and reused by later runs (`capture.shipments`).

A scattered value every holder of which died is sent again (`reship`) to the worker that
asked, which is alive; the others fetch it from there. Broadcasting could pick a dead
worker the scheduler still lists, and wait out its connect timeout. Batches that were
already running report the loss too: once the value is back they are simply submitted
again. A run sends again at most `RESHIPS` times.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import cloudpickle
import dask.config
from dask.utils import parse_timedelta

from nbcluster import _threads as threads
from nbcluster import config, worker
from nbcluster.errors import ClusterUnreachable
from nbcluster.journal.store import Writer
from nbcluster.journal.store import failure as journal_failure
from nbcluster.persist.handles import Handle, Placement, handle_of, held_report, held_slots, publish
from nbcluster.run import everywhere, ranks, transport
from nbcluster.run.batching import PROBE_ITEMS, Batcher
from nbcluster.run.capture import pin_soon, shipments
from nbcluster.run.job import Job
from nbcluster.run.outcome import Outcome, internal_error, killed_record, quiet_rescheduling, unpack
from nbcluster.run.policy import Policy
from nbcluster.run.state import RunState
from nbcluster.run.target import Link
from nbcluster.run.transport import Transport
from nbcluster.worker import held

WATCH_S = 0.5  # how often a running run checks that its cluster is still there
CLUSTER, KERNEL = "the cluster", "the kernel"  # where an item ran, for its error
PERSIST_AHEAD = 1024  # --persist: items submitted ahead, per thread, at most
RESHIPS = 10  # a run sends its lost values again at most this many times


def _policy(indices: Sequence[int], job: Job, threads: int) -> Policy:
    """The policy of one start: its batch sizer and how many batches a thread keeps out."""
    # A range's items travel as a range, in a few bytes however many a batch takes: the
    # probes share them out whole, and tiny items need no second round (`batching.py`).
    probe_items = None if isinstance(job.plan.items, range) else PROBE_ITEMS
    # A persisted item is a task of its own (`worker/held.py`).
    fixed = 1 if job.persist else job.fixed_batch
    min_batch, max_batch = config.seconds("distribute.min-batch"), config.seconds("distribute.max-batch")
    batcher = Batcher(threads, fixed=fixed, min_batch=min_batch, max_batch=max_batch, probe_items=probe_items)
    per_thread = max(1, int(config.get("distribute.in-flight")))
    if job.reads_handles:
        # One item a task, each placed where its value is: no batch to size from what comes
        # back, so all go out at once and wait on their holders, as hand-written futures would
        # (two a thread left each worker idle for a round trip after every short item).
        per_thread = max(per_thread, len(indices))
    elif job.persist:
        # Likewise, as `client.map` would: the scheduler's queue feeds the workers, not a round
        # trip to the kernel after each item; bounded, so a huge run is not all futures at once.
        per_thread = max(per_thread, min(len(indices), PERSIST_AHEAD))
    return Policy(indices, batcher, retries=job.retries, per_thread=per_thread)


class Engine:
    """Runs one job's items and writes their state; see the module docstring.

    Made by `api.distribute`, which hands the user's verbs to it through `api.Run`; the
    strategies of ``--everywhere`` and ``--ranks`` drive it through the `everywhere.Tasks`
    verbs (`submit_task`, `settle_task` and the properties beside them).

    Parameters
    ----------
    job : Job
        What to run: the plan of items, the cell or function, what it captured, the options.
    run_id : str
        The run's id: its Dask keys are ``distribute-<run id>-<n>``, its stop tokens
        ``<run id>-<start>``.
    link : Link or None
        The cluster to run on; None when every item runs in the kernel (``--local`` with all
        items), and then a retry runs in the kernel too.
    """

    def __init__(self, job: Job, run_id: str, link: Link | None):
        self.job = job
        self.run_id = run_id
        self.link = link
        self.state = RunState(len(job.plan))
        self.shipment = Shipment(run_id)  # the context and large values sent to the cluster
        self.transport = Transport(run_id)  # the batches out, the stop token, and what came back
        self.journal: Writer | None = None  # every delivered batch is appended (`journal.py`)
        self.publish: str | None = None  # --persist, journaled: the dataset prefix of its handles
        self._policy: Policy | None = None  # the running start's, for the watch thread
        self._reported = 0  # items the last backlog report told the scheduler of; -1: it refused them

    def journal_to(self, writer: Writer | None) -> None:
        """Append every batch delivered from now on to `writer`; each start's end closes it.

        Parameters
        ----------
        writer : Writer or None
            The run's journal (`journal.py`); None writes no journal.
        """
        self.journal = writer
        if writer is not None:
            # Weakly: a closure over the state would make a cycle state -> closure -> state, and
            # a --persist run's handles (in the state) would outlive `del` until a collection.
            state = weakref.ref(self.state)
            self.state.on_end(lambda: _end_journal(writer, state()))

    @property
    def local_only(self) -> bool:
        """Whether every item runs in the kernel (``--local`` with all items); a retry too."""
        return self.link is None

    @property
    def client(self) -> Any:
        """The run's Dask client; None for a --local run, or once its cluster went away."""
        return self.link.client if self.link is not None else None

    # -- set-up (kernel main thread) -------------------------------------------------------
    def ship(self) -> list[str]:
        """Send the run's large values and context to the cluster (`Shipment.ship`); report lines.

        Returns
        -------
        list of str
            What shipping did, for the line the cell prints; empty when it was shipped already.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            When the values cannot be sent, saying to run the cell again in a moment.
        """
        assert self.link is not None
        return self.shipment.ship(self.link.open().client, self.job)

    def run_local(self, indices: Iterable[int]) -> bool:
        """Run items in the kernel; False if one failed (then nothing is sent).

        Items run one by one in this thread, their output going to the cell as it is
        printed; each is delivered (and journaled) as it finishes, and the first failure
        stops there.

        Parameters
        ----------
        indices : iterable of int
            The items to run (``--local K``: the first K; all of them for ``--local``).

        Returns
        -------
        bool
            True when every one of them succeeded.

        Raises
        ------
        KeyboardInterrupt
            Ctrl-C while an item runs: the items delivered so far are kept.
        """
        context = self.job.for_kernel()
        items = self.job.plan.items
        for i in indices:
            out = worker.run_items(context, [i], [items[i]], capture=False)
            self._deliver([i], out["values"], out["errors"], {}, where=KERNEL)
            if out["errors"]:
                return False
        return True

    def give_up(self) -> None:
        """Nothing (more) is sent: the items still pending count as cancelled, the run ends."""
        self.state.end()

    # -- the user's verbs, through api.Run ---------------------------------------------------
    def retry(self) -> bool:
        """Run the failed and cancelled items again; False if there are none.

        A run on a cluster opens its link again (to whatever cluster is current, if its own
        went away), ships what it needs and starts a driver thread, then returns; a run in
        the kernel runs the items here before it returns. The journal is reopened first.

        Returns
        -------
        bool
            True when a retry started.

        Raises
        ------
        nbcluster.errors.NoCluster
            When no cluster is running to retry on.
        nbcluster.errors.ClusterUnreachable
            When the cluster does not answer.
        nbcluster.errors.HandleGone
            When a persisted value the run reads is gone.
        """
        indices = self.state.unfinished()
        if not indices:
            return False
        if self.journal is not None:
            self.journal.reopen()
        if self.link is None:
            self.state.begin(indices)
            try:
                self.run_local(indices)
            finally:
                self.state.end()
            return True
        self.job.recall_handles()
        self.link.open()
        self.ship()  # before the state begins again: a cluster gone or unreachable changes nothing
        self.state.begin(indices)
        self.start(indices)
        return True

    def cancel(self) -> None:
        """Stop the run, keeping every item that finished (see the module docstring)."""
        if self.transport.stop(self.client):
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
                self.state.finished.wait(config.seconds("distribute.cancel-grace"))
        self.transport.cancel(self.client)
        self.state.cancel_pending()

    # -- driving (a background thread) -------------------------------------------------------
    def start(self, indices: Sequence[int]) -> None:
        """Submit `indices` from a driver thread, watched by a thread that notices a lost cluster.

        Returns at once: the driver (`_drive`, or the strategy of ``--everywhere`` and
        ``--ranks``) ends the state's start when its last batch is in. Each start gets its own
        stop token, so an earlier cancel does not stop it.

        Parameters
        ----------
        indices : sequence of int
            The items to run, in order (a `range` for consecutive ones).
        """
        self.state.add_done_callback(self.job.forget_handles)
        self.transport.open(self.client)
        name = f"nbcluster-distribute-{self.run_id}"
        strategy = {"everywhere": everywhere.drive, "ranks": ranks.drive}.get(self.job.plan.mode)
        drive: Any = functools.partial(strategy, self) if strategy is not None else self._drive
        # The watch thread starts after its first half-second: a run over by then (a small cell)
        # never starts one.
        driven = threading.Event()
        watch = threads.later(WATCH_S, self._watch, driven, name=f"{name}-watch")

        def driving() -> None:
            try:
                drive(indices)
            finally:
                driven.set()
                watch.cancel()

        threads.spawn(driving, name=name)

    def _watch(self, driven: threading.Event) -> None:
        """End the run if its cluster goes away (see the module docstring); `driven`: the driver ended.

        Started `WATCH_S` after the run, it looks at once, then every `WATCH_S`: it also sizes
        the policy to the workers there now, and reports its backlog for the adaptive target.
        """
        assert self.link is not None
        unanswered = 0
        while not driven.is_set() and not self.transport.stopping:
            reason = self.link.gone()
            policy = self._policy
            if reason is None and policy is not None:
                with contextlib.suppress(Exception):  # the scheduler busy, or no worker fits any more: keep the last
                    policy.resize(self.link.usable_threads())
                self.hold_back(policy.held(), policy.batcher.seconds_per_item)
            # An external scheduler is judged by the client's connection alone; a dropped
            # connection that comes back within a couple of seconds is not a lost cluster.
            unanswered = unanswered + 1 if reason else 0
            if reason and (reason != "its scheduler stopped answering" or unanswered * WATCH_S >= 2):
                self._lose(reason)
                return
            driven.wait(WATCH_S)

    def _lose(self, reason: str) -> None:
        assert self.link is not None
        self.transport.lose()
        self.state.lose(f"cluster {self.link.name!r} stopped answering ({reason})")
        self.shipment.context = None
        self.link.close()

    def _drive(self, indices: Sequence[int]) -> None:
        assert self.link is not None
        quiet_rescheduling()
        policy = self._policy = _policy(indices, self.job, self.link.threads)
        placed = Placement()  # where the handles the run reads are, asked once per start
        try:
            self._top_up(policy, placed)
            for done in self.transport.completions():
                going = True
                for future, blob in zip(done, self._results(done), strict=True):
                    going = going and self._settle(future, blob, policy)  # after a fatal one: none
                if not going:
                    break
                self._top_up(policy, placed)
                if self.transport.drained():
                    break
        except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
            self.fail(self.state.pending(indices), internal_error(e))
        finally:
            self._policy = None
            self.transport.close()
            if self._reported > 0:
                self.hold_back(0)
            self.state.end()

    def _results(self, done: list[Any]) -> list[Any]:
        """The result blobs of the finished batches in `done` (`Transport.results`); a
        `--persist` run gathers nothing: its values stay where they are, and only their
        reports are read (`handles.held_report`)."""
        return [None] * len(done) if self.job.persist else self.transport.results(self.client, done)

    def _settle(self, future: Any, result: Any, policy: Policy) -> bool:
        """Take in one finished batch; False when the run cannot go on."""
        batch, alone = self.transport.take(future)
        if batch is None:
            return True  # cancelled on the scheduler: its items were given up
        assert self.link is not None
        # A batch that did not finish may have been cancelled by Dask with a dead cluster:
        # not the items' failure.
        gone = None if future.status == "finished" or self.transport.stopping else self.link.gone()
        if gone is not None:
            self._lose(gone)
            return False
        fatal = self._handle(future, result, batch, policy, alone=alone)[1]
        if fatal is not None:
            self.fail(policy.drain(), fatal)
            self.transport.cancel(self.client)
            return False
        return True

    def _top_up(self, policy: Policy, placed: Placement) -> None:
        """Submit the policy's batches: `in-flight` per thread out, or a suspect alone.

        The batches of one top-up go out together, in one message to the scheduler per
        placement (`submit_tasks`): each message costs the scheduler ~1.5 ms.
        """
        if self.transport.stopping:
            return
        assert self.link is not None
        groups: dict[bool, list[tuple[Any, bytes, list[Any]]]] = {}
        where: dict[bool, list[list[str]]] = {}
        items = self.job.plan.items
        for batch in policy.top_up(len(self.transport.pending)):
            indices: Any = batch
            if batch and batch[-1] - batch[0] == len(batch) - 1:
                indices = range(batch[0], batch[-1] + 1)  # contiguous: pickles in a few bytes
            if isinstance(items, (range, list, tuple)) and isinstance(indices, range):
                chosen: Sequence[Any] = items[indices.start : indices.stop]  # a range pickles in a few bytes
            else:
                chosen = [items[i] for i in batch]
            deps: list[Any] = []
            if self.job.reads_handles:
                chosen, deps = held_slots(chosen, len(self.job.capture.held))
            try:
                blob = cloudpickle.dumps((indices, chosen, policy.batcher.budget))
            except Exception as e:
                self.fail(batch, worker.error_record(TypeError(f"the item values cannot be sent to the workers: {e}")))
                continue
            # Where its input is (nothing moves, `worker/held.py`); a persisted item without one,
            # loosely on every worker that fits: Dask never queues a restricted task as a root
            # task, so the items reach the workers at once and run back to back.
            holders = placed.of(self.client, items, deps) or (self.link.eligible if self.job.persist else [])
            groups.setdefault(bool(deps), []).append((indices, blob, deps))
            where.setdefault(bool(deps), []).append(holders)
        for has_deps, tasks in groups.items():
            self.submit_tasks(tasks, placed=where[has_deps], **self.link.submit_kwargs)

    def _handle(
        self, future: Any, result: Any, indices: Any, policy: Policy | None = None, *, alone: bool = True
    ) -> tuple[list[int], worker.ErrorRecord | None]:
        """Deliver one batch, holding back the failed items the policy takes for another attempt.

        Returns (items to submit again, fatal record); with a `policy` (the driver's), it has
        taken those back itself and none are returned. Items a stopped batch did not reach
        stay pending (the run is ending: they become cancelled). `alone`: no other batch was
        out while this one was.
        """
        if self.job.persist:
            result = held_report(self.client, self.transport.pushed(str(future.key)), future, result)
        outcome = unpack(future, result, len(indices))
        if outcome.killed is not None:
            for i in policy.killed(indices, alone=alone) if policy is not None else indices:
                self.fail([i], killed_record(self.client, self.job.plan.describe(i), i, outcome.killed))
            return [], None
        if outcome.halt is not None:
            reason = transport.halt_reason(self.client, str(future.key), outcome.halt)  # while the key is held
            self.transport.cancel(self.client)
            self.state.halt(reason)
            return [], None
        if outcome.lost is not None:
            if self.shipment.reship(self.client, self.job, *outcome.lost):  # not the items' fault: no attempt used
                if policy is None:
                    return list(indices), None
                policy.put_back(list(indices))
                return [], None
            lost = worker.error_record(RuntimeError("a captured value was lost with the workers holding it"))
            outcome = Outcome([None] * len(indices), dict.fromkeys(range(len(indices)), lost), {}, fatal=lost)
        values, errors, outputs = outcome.values, outcome.errors, outcome.outputs
        if self.job.persist and outcome.held is not None:
            values = self._handles(future, indices, outcome)
        # Items a batch did not reach (its budget was spent) are not delivered: the state and
        # the journal take the first len(values) of `indices`; the policy puts them back, with
        # the failed items that get another attempt (`retry`, not delivered).
        if policy is None:
            stopped = len(values) < len(indices) and not self.transport.stopping
            self._deliver(indices, values, errors, outputs, ran_on=outcome.ran_on)
            return list(indices[len(values) :]) if stopped else [], outcome.fatal
        failed = errors if outcome.fatal is None else {}
        retry = policy.finished(indices, reached=len(values), failed=failed, seconds=outcome.seconds, idle=outcome.idle)
        held = set(retry)
        keep = [j for j in range(len(values)) if indices[j] not in held]
        if len(keep) < len(values):
            indices, values = [indices[j] for j in keep], [values[j] for j in keep]
            errors = {k: errors[j] for k, j in enumerate(keep) if j in errors}
            outputs = {i: o for i, o in outputs.items() if i not in held}
        self._deliver(indices, values, errors, outputs, ran_on=outcome.ran_on)
        return [], outcome.fatal

    def _deliver(
        self, indices: Sequence[int], values: Sequence[Any], records: dict[int, worker.ErrorRecord],
        outputs: dict[int, Any], where: str = CLUSTER, ran_on: tuple[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Store a batch in the state, its failure records made `ItemError`s.

        `ran_on`: the worker that ran it, (address, name), for the journal; None in the kernel,
        or when the kernel failed the items itself.
        """
        errors = {j: self.job.item_error(indices[j], record, where) for j, record in records.items()}
        self.state.deliver(indices, values, errors, outputs)
        if self.journal is not None:
            failures = {indices[j]: journal_failure(e) for j, e in errors.items()}
            recipes = None
            if self.job.persist:
                describe = self.job.plan.describe
                # values may be fewer than indices (a stopped batch): the first len(values) count
                pairs = zip(indices, values, strict=False)
                recipes = [v.recipe(describe(i)) if isinstance(v, Handle) else None for i, v in pairs]
            self.journal.write(indices, values, failures, outputs, where, ran_on, recipes)

    def _handles(self, future: Any, indices: Sequence[int], outcome: Outcome) -> list[Any]:
        """The handle of a persisted item that has a value, published if the run is journaled."""
        made = handle_of(future, indices, outcome.held or [], outcome.errors, outcome.ran_on)
        publish(self.client, made, self.publish)
        return made

    # -- the tasks a strategy drives (everywhere.Tasks) ---------------------------------------
    @property
    def items(self) -> Sequence[Any]:
        """The plan's items (for ``--everywhere``: the workers' addresses)."""
        return self.job.plan.items

    @property
    def placement(self) -> dict[str, Any]:
        """The submit keywords every task of the run takes (its resource restrictions)."""
        assert self.link is not None
        return self.link.submit_kwargs

    @property
    def stopping(self) -> bool:
        """True once the run was told to stop (interrupt, cancel, or the cluster gone)."""
        return self.transport.stopping

    def submit_task(self, indices: Any, blob: bytes, runner: Any = None, **where: Any) -> Any | None:
        """Submit one task running `indices` (their items in `blob`); None once stopping.

        `submit_tasks` of one task.

        Parameters
        ----------
        indices : sequence of int
            The items the task runs (a list, or a `range` when consecutive).
        blob : bytes
            The pickled batch, ``(indices, items, budget)``.
        runner : callable, optional
            What the task runs in place of `worker.run_batch`, with the same arguments and
            result (a rank's `worker.rank.run_rank`, its spec bound): importable by name.
        **where : Any
            Dask's submit keywords: ``workers``, ``allow_other_workers``, resources.

        Returns
        -------
        distributed.Future or None
            The task's future; None when the run is stopping and nothing was submitted.
        """
        return self.submit_tasks([(indices, blob, [])], runner=runner, **where)[0]

    def submit_tasks(
        self, tasks: Sequence[tuple[Any, bytes, list[Any]]], placed: Sequence[Sequence[str]] = (), runner: Any = None,
        **where: Any,
    ) -> list[Any | None]:  # fmt: skip
        """Submit tasks, each running the items of one batch, in one message to the scheduler.

        A task is `worker.run_batch`, or `held.run_batch_held` for a run that persists or
        reads persisted values (taking the handles' futures as Dask dependencies); its key is
        ``distribute-<run id>-<n>`` (``persist-<run id>-<n>`` for a persisted item). Each is
        recorded as pending until `settle_task` or `withdraw` takes it.

        Parameters
        ----------
        tasks : sequence of (indices, blob, deps)
            Per task: the items it runs (a list, or a `range` when consecutive), the pickled
            batch ``(indices, items, budget)``, and the futures of the handles in its items
            (after those captured by name); all with deps, or all without.
        placed : sequence of sequence of str
            Per task, the workers it should run on, loosely (Dask may run it elsewhere, and
            moves its inputs there); an empty one, or none at all: anywhere.
        runner : callable, optional
            What each task runs in place of `worker.run_batch` (`submit_task`).
        **where : Any
            Dask's submit keywords, for every one of them: ``workers``,
            ``allow_other_workers``, resources.

        Returns
        -------
        list of distributed.Future or None
            The tasks' futures, in order; Nones when the run is stopping and nothing was
            submitted.
        """
        job, context, token = self.job, self.shipment.context, self.transport.token
        calls: list[tuple[Any, ...]] = []
        for _, blob, deps in tasks:
            if job.persist or job.reads_handles:
                captured = job.capture.held
                names = {name: k for k, name in enumerate(captured)}
                futures = (*(h.future for h in captured.values()), *deps)
                # The handles' futures stay arguments Dask sees (`transport.task`).
                calls.append(transport.task(held.run_batch_held, context, blob, token, job.persist, names, deps=futures))
            else:
                calls.append(transport.task(runner or worker.run_batch, context, blob, token))
        batches = [indices for indices, _, _ in tasks]
        return self.transport.map(self.client, calls, batches, persist=job.persist, placed=placed, **where)

    def hold_back(self, items: int, seconds: float | None = None) -> None:
        """Report `items` that wait for workers to the scheduler's adaptive target.

        The scheduler sees only the batches out, never the backlog in the kernel, so the
        watch thread reports it twice a second (`nbcluster_backlog`: items left and their
        expected seconds), and the adaptive target counts it as queued work
        (`cluster/adaptive.py`); ``--ranks`` reports the ranks that wait for workers. A
        scheduler without that handler (one nbcluster did not start) answers the first
        report with an error, and gets no more.

        Parameters
        ----------
        items : int
            How many items wait for a worker to be free; 0 withdraws the report.
        seconds : float, optional
            Each item's expected seconds; default Dask's guess for an unknown task.
        """
        client, link = self.client, self.link
        if client is None or link is None or self._reported < 0 or not (items or self._reported):
            return
        if seconds is None:  # nothing measured yet: what Dask assumes of an unknown task
            seconds = float(parse_timedelta(dask.config.get("distributed.scheduler.unknown-task-duration")))
        kind, self._reported = "gpu" if link.needs.gpus else "cpu", items

        async def report() -> None:
            try:
                await client.scheduler.nbcluster_backlog(run=self.run_id, kind=kind, items=items, seconds=items * seconds)
            except Exception:  # not nbcluster's scheduler (or gone): stop asking it
                self._reported = -1

        with contextlib.suppress(Exception):
            client.loop.add_callback(report)

    def outstanding(self, futures: list[Any]) -> list[Any]:
        """Those of `futures` still out (not taken in, withdrawn or cancelled).

        Parameters
        ----------
        futures : list of distributed.Future
            Futures `submit_task` returned.

        Returns
        -------
        list of distributed.Future
            Those still to be taken in, in the order given.
        """
        with self.transport.lock:
            return [f for f in futures if f in self.transport.pending]

    def settle_task(self, future: Any) -> list[int]:
        """Take in one finished task; the items to submit again.

        Its values, errors and output are delivered to the state (and the journal), as for a
        batch of the driver thread. A task already withdrawn or cancelled delivers nothing.

        Parameters
        ----------
        future : distributed.Future
            A done task that `submit_task` returned.

        Returns
        -------
        list of int
            Items to submit again: the task's, when a value it reads was lost with its
            workers and has been sent again, or those it did not reach before it stopped.
            A failed item is not among them (``--retries`` is not applied here).
        """
        batch = self.transport.take(future)[0]
        [result] = self._results([future])
        return [] if batch is None else self._handle(future, result, batch)[0]

    def withdraw(self, future: Any) -> None:
        """Stop waiting for a task (its items are then failed or given up by the caller).

        Parameters
        ----------
        future : distributed.Future
            A task `submit_task` returned; its result, if it still comes, is ignored.
        """
        self.transport.take(future)

    def fail(self, indices: Sequence[int], record: worker.ErrorRecord) -> None:
        """Record the same error for each of `indices` (in the state and the journal).

        Parameters
        ----------
        indices : sequence of int
            The items that failed.
        record : ErrorRecord
            Why, as `worker.error_record` makes it.
        """
        self._deliver(indices, [None] * len(indices), dict.fromkeys(range(len(indices)), record), {})

    def finish(self) -> None:
        """The start is over: nothing is out, the state ends."""
        self.transport.close()
        self.state.end()


class Shipment:
    """One run's context on the cluster; see the module docstring.

    Parameters
    ----------
    run_id : str
        The run's id, in its context's key.
    """

    def __init__(self, run_id: str):
        self.key = f"nbcluster-context-{run_id}"
        self.context: tuple[str, bytes | None] | None = None  # (key, inline blob or None); None: not shipped
        self._blob = b""
        self._future: Any = None
        self._reships = 0

    def ship(self, client: Any, job: Job) -> list[str]:
        """Scatter large values (cached) and the context blob; report lines.

        Called on the kernel's main thread before the first submit, and again by a retry
        after the cluster went away (the context is then sent afresh: `context` was reset).

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        job : Job
            What the run runs.

        Returns
        -------
        list of str
            What shipping did, for the line the cell prints (a large value sent, or one
            already on the workers from an earlier run); empty when it was shipped already.

        Raises
        ------
        nbcluster.errors.ClusterUnreachable
            When the values cannot be sent (the cluster's connection failed), saying to run
            the cell again in a moment.
        """
        if self.context is not None:
            return []
        try:
            large, notes = shipments(client).ship(client, job.capture.large)
            blob = job.for_workers(large)
            self._blob = blob
            if len(blob) > worker.INLINE_CONTEXT:
                self._future = self._scatter(client)
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(
                f"could not send the cell's data to the workers ({e}); if a worker just died, "
                "run the cell again in a moment"
            ) from None
        self.context = (self.key, blob if len(blob) <= worker.INLINE_CONTEXT else None)
        return notes

    def _scatter(self, client: Any, workers: list[str] | None = None) -> Any:
        future = client.scatter({self.key: self._blob}, workers=workers, broadcast=workers is None, hash=False)[self.key]
        pin_soon(client, future, len(self._blob))
        return future

    def reship(self, client: Any, job: Job, key: str, to: str | None) -> bool:
        """Send again a scattered value every holder of which died; False to give up.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        job : Job
            What the run runs (its large values).
        key : str
            The lost value's key.
        to : str or None
            The worker that asked for it.

        Returns
        -------
        bool
            True when the value is on the cluster again (or never was lost).
        """
        try:
            current = self._future if key == self.key else shipments(client).future(key)
            # A value lost with all its holders shows as a cancelled future here.
            if current is not None and current.status == "finished" and client.who_has([current]).get(key):
                return True
            self._reships += 1
            if self._reships > RESHIPS:
                return False
            workers = [to] if to else None
            if key == self.key:
                self._future = self._scatter(client, workers)
                return True
            return bool(shipments(client).reship(client, key, job.capture.large, workers))
        except (OSError, TimeoutError):
            return False


def _end_journal(writer: Writer, state: RunState | None) -> None:
    if state is not None:
        writer.end(state.counts()["done"], len(state))
