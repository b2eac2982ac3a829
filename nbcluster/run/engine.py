"""The engine of a run: the driver thread that feeds the policy and performs its actions.

An `Engine` is made from a `Job` (what to run: `capture.Job`) and a `Link` (where: `transport.py`,
opened only when items leave the kernel). It owns the run's `RunState` (`state.py`), which
its driver writes as batches finish, and `run_local` as items run in the kernel (`api.py`
writes the items a resumed journal holds); the `Results` view reads it, and `api.Run` hands
the user's verbs (cancel, retry) to the engine. The engine decides nothing by itself: its
`policy.Policy` says what to submit and what a finished batch means, its
`transport.Transport` sends batches and hands back what finished, and the driver
(`_drive`) feeds each the events of the other, until nothing is out.

A finished batch is read by `_unpack`, which sorts one that did not finish into the cases
the driver acts on:

- *killed*: its workers kept dying (``KilledWorker``: Dask ran it on ``allowed-failures +
  1`` workers, and each died). The policy splits it into suspects that run alone; a batch
  of one item killed alone is the culprit, which fails with `WorkerKilled`: one line with
  the count and the last thing the worker's nanny logged. The run goes on;
- *fatal*: its context cannot load on the worker (a module missing there). Every batch
  would fail the same way, so the rest fails at once, with that message;
- *lost*: a scattered value it reads was lost with every worker holding it. The engine
  ships it again and the batch goes back to the backlog, up to 10 times a run
  (`Shipment`); after that it is fatal;
- *halt*: nbcluster cannot be imported where the batch was unpickled (`transport.task`).
  Nothing more is submitted, the unfinished items are given up, not failed, and the
  waiting cell ends with one line naming the fix (`ClusterCannotRun`).

For the first ``distribute.direct`` seconds of a start (10 s) each batch goes to a worker
directly (`transport.py`), one a worker thread, and one that comes back refused goes through
the scheduler, with every later batch. A ``--persist`` run, and one reading persisted
values, sends one item a task (a Dask key holds one value: `worker/held.py`), all at once as
`client.map` would (at most `PERSIST_AHEAD` per thread ahead), placed where its inputs are.

Stopping (`cancel`: Ctrl-C in the waiting cell, or `Results.cancel()`) keeps finished work.
Nothing more is submitted; every worker is told the start's stop token
(`worker.context.stop_run`), so each running batch returns after its current item with the items
it finished, and batches still queued return at once. The kernel waits for those
(``distribute.cancel-grace``, 2 s, at most) and delivers them; whatever is still out after
that is cancelled on the scheduler, and its items count as cancelled. Each start (the
first run, each retry) has its own token, so a retry is not stopped by an earlier cancel.

The watch thread (`_watch`, from half a second into a start) looks every `WATCH_S`:
it re-reads the usable threads (the policy's limit follows workers that join or leave),
reports the backlog to the scheduler for the adaptive target (`hold_back`,
``nbcluster_backlog``, the handler of the clusters nbcluster starts), and
notices a cluster that went away: the unfinished items are then given up as *lost*, the
run ends and the link is closed at once. `retry()` opens the link afresh.

What goes before the first batch (`Shipment`, `ship`). The run's context (the cell or
function and what it captured) travels inline in every batch when small (up to
`worker.context.INLINE_CONTEXT` bytes), else is scattered once to every worker and pinned
there; large captured values are scattered once per kernel (`capture.shipments`). A
scattered value every holder of which died is sent again (`Shipment.reship`) to the worker
that asked, which is alive, at most `RESHIPS` times a run.

``--everywhere`` (`everywhere.py`) and ``--ranks N`` (`ranks.py`) are strategies of their
own: they drive tasks through the `everywhere.Tasks` verbs (`submit_task`, `settle_task`,
`outstanding`, `withdraw`, `fail`, `finish`, `hold_back`), not the policy.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import cloudpickle
import dask.config
from dask.utils import parse_timedelta

from nbcluster import _threads as threads
from nbcluster import config, worker
from nbcluster._compat import nanny_logs
from nbcluster.errors import ClusterUnreachable, WorkerKilled
from nbcluster.journal.store import Writer
from nbcluster.journal.store import failure as journal_failure
from nbcluster.persist.handles import Handle, Placement, handle_of, held_report, held_slots, publish
from nbcluster.run import everywhere, ranks, transport
from nbcluster.run.capture import Job, scatter, shipments
from nbcluster.run.policy import PROBE_ITEMS, Batcher, Policy
from nbcluster.run.state import RunState
from nbcluster.run.transport import Link, Transport
from nbcluster.worker import held

WATCH_S = 0.5  # how often a running start checks its cluster
CLUSTER, KERNEL = "the cluster", "the kernel"  # where an item ran, for its error
PERSIST_AHEAD = 1024  # --persist: items submitted ahead, per thread, at most
RESHIPS = 10  # a run sends its lost values again at most this many times


class Engine:
    """Runs one job's items and writes their state; see the module docstring.

    Parameters
    ----------
    job : Job
        What to run: the plan of items, the cell or function, what it captured, the options.
    run_id : str
        The run's id: its Dask keys are ``distribute-<run id>-<n>``, its stop tokens
        ``<run id>-<start>``.
    link : Link
        The cluster to run on, opened when items are first sent there.
    local_only : bool
        Every item runs in the kernel (``--local`` with all items), and a retry does too.
    """

    def __init__(self, job: Job, run_id: str, link: Link, *, local_only: bool):
        self.job, self.link, self.local_only = job, link, local_only
        self.state = RunState(len(job.plan))
        self.shipment = Shipment(run_id)  # the context and large values sent to the cluster
        self.transport = Transport(run_id)  # the batches out, and how they go and come back
        self.token = ""  # this start's stop token (see worker.context.stop_run)
        self.driven = threading.Event()  # set once this start's driver has ended (all taken in)
        self.journal: Writer | None = None  # every delivered batch is appended (`journal/store.py`)
        self.publish: str | None = None  # --persist, journaled: the dataset prefix of its handles
        self._told = False  # the last backlog report held items back or named busy workers
        self._starts = itertools.count(1)  # a start's stop token is the run's id and its number

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.transport.run_id

    @property
    def client(self) -> Any:
        """The run's Dask client; None for a --local run, or once its cluster went away."""
        return self.link.client

    def journal_to(self, writer: Writer | None) -> None:
        """Append every batch delivered from now on to `writer`; each start's end closes it.

        Parameters
        ----------
        writer : Writer or None
            The run's journal (`journal/store.py`); None writes no journal.
        """
        self.journal = writer
        if writer is not None:
            state = weakref.proxy(self.state)  # the state holds this hook: it must not keep itself alive
            self.state.on_end(lambda: writer.end(state.counts()["done"], len(state)))

    # -- set-up and the user's verbs (kernel main thread) ------------------------------------
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
        return self.shipment.ship(self.link.open().client, self.job)

    def run_local(self, indices: Iterable[int]) -> bool:
        """Run items in the kernel, one by one, each delivered as it ends; False if one failed.

        The first failure stops there; an item's output goes to the cell as it is printed.

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
        context, items = self.job.for_kernel(), self.job.plan.items
        for i in indices:
            out = worker.run_items(context, [i], [items[i]], capture=False)
            self._deliver([i], out["values"], out["errors"], {}, where=KERNEL)
            if out["errors"]:
                return False
        return True

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
        if not (indices := self.state.unfinished()):
            return False
        if self.journal is not None:
            self.journal.reopen()
        if self.local_only:
            self.state.begin(indices)
            try:
                self.run_local(indices)
            finally:
                self.state.end()
            return True
        self.job.hold_handles(strongly=True)
        self.ship()  # opens the link
        self.state.begin(indices)
        self.start(indices)
        return True

    def cancel(self) -> None:
        """Stop the run, keeping every item that finished (see the module docstring)."""
        if self.transport.stop():
            # In a thread: a worker that hangs must not hold the kernel beyond the grace.
            threads.spawn(_tell_workers, self.client, self.token, name="nbcluster-stop")
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
                self.driven.wait(config.seconds("distribute.cancel-grace"))
        self.transport.cancel(self.client)
        self.state.cancel_pending()

    # -- driving (a background thread) -------------------------------------------------------
    def start(self, indices: Sequence[int]) -> None:
        """Submit `indices` from a driver thread, watched by a thread that notices a lost cluster.

        Returns at once: the driver (`_drive`, or the strategy of ``--everywhere`` and
        ``--ranks``) ends the state's start when its last batch is in.

        Parameters
        ----------
        indices : sequence of int
            The items to run, in order (a `range` for consecutive ones).
        """
        self.state.add_done_callback(functools.partial(self.job.hold_handles, strongly=False))
        self.token = f"{self.run_id}-{next(self._starts)}"
        self.transport.stopping = False
        strategy: Any = {"everywhere": everywhere.drive, "ranks": ranks.drive}.get(self.job.plan.mode)
        policy = None if strategy else _policy(indices, self.job, self.link.threads)
        target = functools.partial(strategy, self) if policy is None else functools.partial(self._drive, policy)
        name, driven = f"nbcluster-distribute-{self.run_id}", threading.Event()
        self.driven = driven  # what a cancel waits for
        # The watch thread starts after its first look's wait: a run over by then never starts one.
        watch = threads.later(WATCH_S, self._watch, driven, policy, name=f"{name}-watch")

        def driving() -> None:
            try:
                target(indices)
            finally:
                driven.set()
                watch.cancel()

        threads.spawn(driving, name=name)

    def _watch(self, driven: threading.Event, policy: Policy | None) -> None:
        """Until the driver ends (`driven`): follow the cluster's threads, report the backlog,
        and end the run if the cluster goes away (see the module docstring)."""
        unanswered = 0
        while not driven.is_set() and not self.transport.stopping:
            reason = self.link.gone()
            if reason is None and policy is not None:
                with contextlib.suppress(Exception):  # the scheduler busy, or no worker fits: keep the last
                    policy.resize(self.link.usable_threads())
                busy = self.transport.direct_workers(self.link.eligible)  # the calls to departed ones given up
                self.hold_back(policy.held(), policy.batcher.seconds_per_item, busy)
            # A dropped connection to an external scheduler that comes back within a couple of
            # seconds is not a lost cluster.
            unanswered = unanswered + 1 if reason else 0
            if reason and (reason != "its scheduler stopped answering" or unanswered * WATCH_S >= 2):
                self._lose(reason)
                return
            driven.wait(WATCH_S)

    def _lose(self, reason: str) -> None:
        self.transport.lose()
        self.state.lose(f"cluster {self.link.name!r} stopped answering ({reason})")
        self.shipment.context = None
        self.link.close()

    def _drive(self, policy: Policy, indices: Sequence[int]) -> None:
        logging.getLogger("distributed.client").addFilter(_not_rescheduling)
        job = self.job
        if self.transport.open(self.link, direct=not (job.persist or job.reads_handles)):
            policy.batcher.alone_first = False  # its first batch sends its first item ahead instead
        placed = Placement() if job.reads_handles else None  # where the handles read are, asked once
        try:
            self._top_up(policy, placed)
            for done in self.transport.completions():
                results = self.transport.results(self.client, done, gather=not job.persist)
                if not all(self._settle(f, r, policy) for f, r in zip(done, results, strict=True)):
                    break
                self._top_up(policy, placed)  # `completions` ends once nothing is out
        except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
            error = RuntimeError(f"nbcluster internal error while running the items: {type(e).__name__}: {e}")
            error.__cause__ = e
            self.fail(self.state.pending(indices), worker.error_record(error))
        finally:
            self.hold_back(0)
            self.finish()

    def _settle(self, future: Any, result: Any, policy: Policy) -> bool:
        """Take in one finished batch; False when the run cannot go on."""
        batch, alone, unrun = self.transport.take(future)
        if batch is None:
            return True  # cancelled on the scheduler: its items were given up
        if unrun:
            # Refused, or its worker died under it: its items go through the scheduler now,
            # with the rest (not an attempt of theirs).
            if not self.transport.stopping:
                policy.finished(batch, reached=0)
            return True
        if isinstance(future, transport.Call) and future.of is None:
            self.state.direct_keys.append(future.key)
        # A batch that did not finish may have been cancelled by Dask with a dead cluster:
        # not the items' failure.
        if (gone := None if future.status == "finished" or self.transport.stopping else self.link.gone()) is not None:
            self._lose(gone)
            return False
        if (fatal := self._handle(future, result, batch, policy, alone=alone)) is not None:
            self.fail(policy.drain(), fatal)
            self.transport.cancel(self.client)
            return False
        return True

    def _top_up(self, policy: Policy, placed: Placement | None) -> None:
        """Submit the policy's batches: each direct one at once, the Dask tasks of one top-up
        together, in one message to the scheduler."""
        if self.transport.stopping:
            return
        assert self.shipment.context is not None
        budget, items, job = policy.batcher.budget, self.job.plan.items, self.job
        tasks: list[tuple[Any, bytes, list[Any], list[str]]] = []
        for batch in policy.top_up(len(self.transport.pending), direct=self.transport.all_direct()):
            # The plan's items are a list or a range (whose slice is a range: a few bytes).
            chosen = items[batch.start : batch.stop] if isinstance(batch, range) else [items[i] for i in batch]
            chosen, deps = held_slots(chosen, len(job.capture.held)) if job.reads_handles else (chosen, [])
            try:
                blob = cloudpickle.dumps((batch, chosen, budget))
            except Exception as e:
                self.fail(batch, worker.error_record(TypeError(f"the item values cannot be sent to the workers: {e}")))
                continue
            if not deps and self.transport.send_direct(batch, self.shipment.context, blob, self.token):
                continue
            # Where its input is (`worker/held.py`); a persisted item without one, loosely on every
            # worker that fits: Dask never queues a restricted task as a root task, so the items
            # reach the workers at once and run back to back.
            holders = placed.of(self.client, items, deps) if placed is not None else []
            tasks.append((batch, blob, deps, holders or (self.link.eligible if job.persist else [])))
        if tasks:
            self.submit_tasks(tasks, **self.link.submit_kwargs)

    def _handle(self, future: Any, result: Any, indices: Any, policy: Policy, *, alone: bool) -> worker.ErrorRecord | None:
        """Deliver one batch; the record that fails every batch, if the batch's context could not load.

        The items that run again (failed with an attempt left, not reached by a batch its
        budget stopped, or reading a value shipped again) go back to `policy`, undelivered.
        `alone`: no other batch was out while it ran.
        """
        client, n = self.client, len(indices)
        if self.job.persist:
            result = held_report(client, result, future, None)  # `result`: what its worker pushed, or None
        data = _unpack(future, result, n)
        if "killed" in data:
            for i in policy.killed(indices, alone=alone):
                self.fail([i], _killed_record(client, self.job.plan.describe(i), i, data["killed"]))
            return None
        if "halt" in data:
            reason = transport.halt_reason(client, str(future.key), data["halt"])  # while the key is held
            self.transport.cancel(client)
            self.state.lose(reason, halted=True)
            return None
        if "lost" in data:
            if self.shipment.reship(client, self.job, data["lost"], data.get("worker")):
                policy.finished(indices, reached=0)  # not the items' fault: no attempt used
                return None
            data = _failed(n, worker.error_record(RuntimeError("a captured value was lost with the workers holding it")))
        values, errors, outputs, ran_on = data["values"], data["errors"], data["outputs"], data.get("ran_on")
        if self.job.persist and data.get("held") is not None:
            values = handle_of(future, indices, data["held"], errors, ran_on)
            publish(client, values, self.publish)
        # The state and the journal take the first len(values) of `indices`: items the batch did
        # not reach (its budget was spent) are not delivered, the policy puts them back.
        failed = {} if "fatal" in data else errors
        if again := set(policy.finished(indices, reached=len(values), failed=failed, seconds=data.get("seconds"),
                                        idle=data.get("idle"))):  # fmt: skip
            keep = [j for j in range(len(values)) if indices[j] not in again]
            indices, values = [indices[j] for j in keep], [values[j] for j in keep]
            errors = {k: errors[j] for k, j in enumerate(keep) if j in errors}
            outputs = {i: o for i, o in outputs.items() if i not in again}
        self._deliver(indices, values, errors, outputs, ran_on=ran_on)
        return data.get("fatal")

    def _deliver(self, indices: Sequence[int], values: Sequence[Any], records: dict[int, worker.ErrorRecord],
                 outputs: dict[int, Any], where: str = CLUSTER,
                 ran_on: tuple[str, str] | None = None) -> None:  # fmt: skip
        """Store a batch in the state and the journal, its failure records made `ItemError`s.

        `ran_on`: the worker that ran it, (address, name), for the journal; None in the kernel,
        or when the kernel failed the items itself.
        """
        errors = {j: self.job.item_error(indices[j], record, where) for j, record in records.items()}
        self.state.deliver(indices, values, errors, outputs)
        if self.journal is not None:
            failures = {indices[j]: journal_failure(e) for j, e in errors.items()}
            recipes = None
            if self.job.persist:
                # values may be fewer than indices (a stopped batch): the first len(values) count
                pairs = zip(indices, values, strict=False)
                recipes = [v.recipe(self.job.plan.describe(i)) if isinstance(v, Handle) else None for i, v in pairs]
            self.journal.write(indices, values, failures, outputs, where, ran_on, recipes)

    # -- the tasks a strategy drives (everywhere.Tasks) ---------------------------------------
    @property
    def items(self) -> Sequence[Any]:
        """The plan's items (for ``--everywhere``: the workers' addresses)."""
        return self.job.plan.items

    @property
    def placement(self) -> dict[str, Any]:
        """The submit keywords every task of the run takes (its resource restrictions)."""
        return self.link.submit_kwargs

    @property
    def stopping(self) -> bool:
        """True once the run was told to stop (interrupt, cancel, or the cluster gone)."""
        return self.transport.stopping

    def submit_task(self, indices: Any, blob: bytes, runner: Any = None, **where: Any) -> Any | None:
        """Submit one task running `indices` (their items in `blob`); None once stopping.

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
        return self.submit_tasks([(indices, blob, [], [])], runner=runner, **where)[0]

    def submit_tasks(self, tasks: Sequence[tuple[Any, bytes, list[Any], list[str]]], runner: Any = None,
                     **where: Any) -> list[Any | None]:  # fmt: skip
        """Submit tasks, each running the items of one batch, in one message to the scheduler.

        A task is `worker.run_batch`, or `held.run_batch_held` for a run that persists or
        reads persisted values (taking the handles' futures as Dask dependencies); its key is
        ``distribute-<run id>-<n>`` (``persist-<run id>-<n>`` for a persisted item). Each is
        pending until `settle_task` or `withdraw` takes it.

        Parameters
        ----------
        tasks : sequence of (indices, blob, deps, placed)
            Per task: the items it runs (a list, or a `range` when consecutive), the pickled
            batch ``(indices, items, budget)``, the futures of the handles in its items
            (after those captured by name), and the workers it should run on, loosely (Dask
            may run it elsewhere, and moves its inputs there; none: anywhere).
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
        job, context, token = self.job, self.shipment.context, self.token
        # A run that persists or reads handles: `held.run_batch_held`, told whether to keep the
        # value and where each captured handle's value is among its arguments.
        names = {name: k for k, name in enumerate(job.capture.held)}
        kept = (job.persist, names) if job.persist or job.reads_handles else ()
        fn = held.run_batch_held if kept else runner or worker.run_batch
        mine = [h.future for h in job.capture.held.values()]  # the handles' futures stay arguments Dask sees
        # A task fails, not hangs, on a worker without nbcluster (`transport.task`).
        calls = [transport.task(fn, context, blob, token, *kept, deps=(*mine, *deps)) for _, blob, deps, _ in tasks]
        batches, placed = [t[0] for t in tasks], [t[3] for t in tasks]
        return self.transport.map(self.client, calls, batches, persist=job.persist, placed=placed, **where)

    def hold_back(self, items: int, seconds: float | None = None, busy: Sequence[str] = ()) -> None:
        """Report `items` not yet submitted, and the workers running direct batches, to the
        scheduler's adaptive scaling.

        Sent only when it changes something: a run over before the watch thread's first
        report told the scheduler nothing, and has nothing to withdraw.

        Parameters
        ----------
        items : int
            How many items wait; 0 (and no `busy`) withdraws the report.
        seconds : float, optional
            Each item's expected seconds; default Dask's guess for an unknown task.
        busy : sequence of str
            The workers running this run's direct batches: not to be retired meanwhile.
        """
        client = self.client
        if client is None or not (items or busy or self._told):
            return
        if seconds is None:
            seconds = float(parse_timedelta(dask.config.get("distributed.scheduler.unknown-task-duration")))
        self._told, kind, expected = bool(items or busy), "gpu" if self.link.needs.gpus else "cpu", items * seconds

        async def report() -> None:
            with contextlib.suppress(Exception):  # the scheduler is gone: the run's watch ends it
                await client.scheduler.nbcluster_backlog(run=self.run_id, kind=kind, items=items, seconds=expected,
                                                         busy=list(busy))  # fmt: skip

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
        return [f for f in futures if f in self.transport.pending]  # each test is atomic: no lock

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
        batch, again = self.transport.take(future)[0], Policy([], Batcher(1))  # this task's verdicts
        if batch is not None:
            result = self.transport.results(self.client, [future], gather=not self.job.persist)[0]
            self._handle(future, result, batch, again, alone=True)
        return [] if self.transport.stopping else again.drain()

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
        """The start is over, or nothing (more) is sent: the items still pending count as
        cancelled, the state ends."""
        self.transport.close()
        self.state.end()


def _policy(indices: Sequence[int], job: Job, threads: int) -> Policy:
    """The policy of one start: its batch sizer and how many batches a thread keeps out."""
    # A range's items travel as a range, in a few bytes however many a batch takes: the
    # probes share them out whole. A persisted item is a task of its own.
    probe_items = None if isinstance(job.plan.items, range) else PROBE_ITEMS
    batcher = Batcher(threads, fixed=1 if job.persist else job.batch, probe_items=probe_items,
                      min_batch=config.seconds("distribute.min-batch"),
                      max_batch=config.seconds("distribute.max-batch"))  # fmt: skip
    per_thread = int(config.get("distribute.in-flight"))
    if job.reads_handles or job.persist:
        # One item a task, all out at once as `client.map` would (each placed where its value
        # is, for handles read), so the scheduler's queue feeds the workers, not a round trip
        # to the kernel after each item; a persisted run bounded, not all futures at once.
        per_thread = max(per_thread, len(indices) if job.reads_handles else min(len(indices), PERSIST_AHEAD))
    return Policy(indices, batcher, retries=job.retries, per_thread=per_thread)


def _tell_workers(client: Any, token: str) -> None:
    # If the cluster is gone, the scheduler-side cancel is all that is left to do.
    with contextlib.suppress(Exception):
        client.run(worker.context.stop_run, token, on_error="return")


def _not_rescheduling(record: logging.LogRecord) -> bool:
    """Keep the client's "Couldn't gather 1 keys, rescheduling" out of the cell: Dask computes
    the batch again, and the run takes the result from that; nothing is lost."""
    return not str(record.msg).startswith("Couldn't gather")


def _failed(n: int, record: worker.ErrorRecord, fatal: bool = True) -> dict[str, Any]:
    """A batch of `n` items that each failed with `record` (`fatal`: every batch would)."""
    return {"values": [None] * n, "errors": dict.fromkeys(range(n), record), "outputs": {}, **({"fatal": record} if fatal else {})}


def _unpack(future: Any, result: Any, n: int) -> dict[str, Any]:
    """What the finished batch `future` of `n` items says, from its `result` (blob or exception).

    The worker's dict (`worker.run_batch`: values, errors, outputs, seconds, ...), or one of
    ``{"halt": why}``, ``{"killed": KilledWorker}``, ``{"lost": key, "worker": ...}``, or each
    item failed (``fatal`` set when every batch would fail the same way).
    """
    from distributed import KilledWorker

    # A result blob is a result even if the future reads "lost" by now: the worker that
    # held it died after it was gathered.
    if future.status != "finished" and not isinstance(result, bytes):  # then `result` is its exception
        if (missing := _nbcluster_missing(result)) is not None:
            return {"halt": missing}
        if isinstance(result, KilledWorker) and len(result.args) == 3:
            return {"killed": result}
        if type(result).__name__ == "CancelledError":
            result = type(result)("the batch was cancelled on the cluster")
        return _failed(n, worker.error_record(result, frames=False), fatal=False)
    try:
        data: dict[str, Any] = cloudpickle.loads(result)
    except Exception as e:
        failed = TypeError(f"the results could not be loaded in the kernel: {type(e).__name__}: {e}")
        return _failed(n, worker.error_record(failed), fatal=False)
    return _failed(n, data["fatal"]) if "fatal" in data else data


def _nbcluster_missing(exc: Any) -> str | None:
    """The import error in `exc`'s chain that names nbcluster, as one line, else None.

    Dask wraps the scheduler's failure to unpickle a graph in its own multi-line
    RuntimeError; the cause it keeps says which module was missing.
    """
    for _ in range(8):  # a chain is short; a cycle must not hang the driver
        if isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] == "nbcluster":
            return f"{type(exc).__name__}: {exc}"
        exc = getattr(exc, "__cause__", None) or getattr(exc, "__context__", None)
    return None


def _killed_record(client: Any, described: str, index: int, killed: Any) -> worker.ErrorRecord:
    """The failure of item `index`, whose worker died each time it ran it: the count, and the
    last thing the dead worker's nanny logged (its exit status, or the memory limit it
    passed); Dask keeps no stderr of the dead process itself."""
    last, lines = killed.last_worker, []
    with contextlib.suppress(Exception):  # no nanny (`dask worker --no-nanny`), or it is gone too
        logs = nanny_logs(client, last.nanny) if last.nanny else []
        lines = [str(msg).split(" - ", 3)[-1].strip() for _, msg in logs]
    # Newest first. Nannies that share a process share its log: keep this worker's lines.
    pid = getattr(last, "pid", None)
    lines = [line for line in lines if pid is None or f"pid={pid})" in line or f"process {pid} " in line]
    said = next((line for wanted in ("memory budget", "Worker process") for line in lines if wanted in line), None)
    logged = f"; the worker's nanny logged: {said}" if said else ""
    message = (f"item {index}{f' ({described})' if described else ''} killed its worker "
               f"{killed.allowed_failures + 1} times (a crash or out of memory){logged}")  # fmt: skip
    return worker.error_record(WorkerKilled(message), frames=False)


# -- what goes before the first batch --------------------------------------------------------
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
        self._blob, self._reships = b"", 0
        self._future: Any = None

    def ship(self, client: Any, job: Job) -> list[str]:
        """Scatter large values (once per kernel) and the context blob; report lines.

        Called before the first submit, and again by a retry after the cluster went away
        (the context is then sent afresh: `context` was reset).

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
            self._blob = job.for_workers(large)
            if not (inline := len(self._blob) <= worker.context.INLINE_CONTEXT):
                self._future = scatter(client, self.key, self._blob, len(self._blob))
        except (OSError, TimeoutError) as e:
            raise ClusterUnreachable(f"could not send the cell's data to the workers ({e}); if a worker just died, "
                                     "run the cell again in a moment") from None  # fmt: skip
        self.context = (self.key, self._blob if inline else None)
        return notes

    def reship(self, client: Any, job: Job, key: str, to: str | None) -> bool:
        """Send again a scattered value every holder of which died; False to give up.

        Sent to the worker that asked, which is alive: a broadcast could pick a dead worker
        the scheduler still lists, and wait out its connect timeout.

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
                self._future = scatter(client, key, self._blob, len(self._blob), workers)
                return True
            return bool(shipments(client).reship(client, key, job.capture.large, workers))
        except (OSError, TimeoutError):
            return False
