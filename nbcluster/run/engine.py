"""The engine of a run: the driver thread that submits batches and streams them back.

An `Engine` is made from a `Job` (what to run: `capture.Job`) and a `Link` (where: `target.py`,
None when every item runs in the kernel). It owns the run's `RunState` (`state.py`) and
writes it as batches finish (`api.py` begins and ends a run's state around a ``--local``
part); the `Results` view reads it, and `run.Run` hands the user's verbs (cancel, retry) to
the engine. The engine decides nothing by itself: its `policy.Policy` says what to submit
and what a finished batch means, its `transport.Transport` sends batches and hands back
what finished, and the engine feeds the one the events of the other.

Policy
------
`_drive` owns everything between the first submit and the last result. It keeps
`in-flight` batches per usable worker thread submitted (one running, the next already
waiting on the worker, so no thread waits for the kernel between batches), sized by the
policy (`batching.Batcher`: probes sharing out the items until an item time is measured,
each returning after its first item past `batching.PROBE_S`, then sized from the time), and
turns each finished batch into deliveries to the state (`_settle`). The batches of one
top-up go to the scheduler as one graph (`submit_tasks`, a `client.map`), not one message
each; but for the first `distribute.direct` seconds of a start (0.5 s), each batch goes to
a worker directly (`direct.py`: 0.5 ms a round trip, not the scheduler's 4-5 ms), and one
that comes back refused or broken goes through the scheduler, with every later batch. A `--persist` run, and one reading persisted values, sends one item a task instead
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
future -> the item indices of its batch); `token`, the start's stop token. The policy's
docstring has a worked example (it runs as a doctest).

Stopping (`cancel()`: Ctrl-C in the waiting cell, or `Results.cancel()`) keeps finished
work. Nothing more is submitted; every worker is told the run's stop token
(`worker.stop_run`), so each running batch returns after its current item with the items
it finished, and batches still queued return at once. The kernel waits for those
(`distribute.cancel-grace`, 2 s, at most) and delivers them; whatever is still out after
that (an item that runs for minutes) is cancelled on the scheduler, and its items count as
cancelled. Because only `in-flight` batches per thread are ever out, a stop drains in about
one item's time. Each start has its own token, so a retry is not stopped by an earlier
cancel.

Adaptive clusters: the scheduler sees only the batches out, never the backlog in the
kernel, so every half second the watch thread (`_watch`) reports the backlog to the
scheduler (`nbcluster_backlog`: items left and their expected seconds), where the adaptive
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
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import cloudpickle

from nbcluster import _threads as threads
from nbcluster import config, worker
from nbcluster.journal.store import Writer
from nbcluster.journal.store import failure as journal_failure
from nbcluster.persist.handles import Handle, Placement, handle_of, held_report, held_slots, publish
from nbcluster.run import everywhere, ranks, transport
from nbcluster.run.backlog import BacklogReport
from nbcluster.run.batching import PROBE_ITEMS, Batcher
from nbcluster.run.capture import Job
from nbcluster.run.outcome import Outcome, internal_error, killed_record, quiet_rescheduling, unpack
from nbcluster.run.policy import Policy
from nbcluster.run.state import RunState
from nbcluster.run.target import Link
from nbcluster.run.transport import Shipment, Transport
from nbcluster.worker import held

WATCH_S = 0.5  # how often a running run checks that its cluster is still there
CLUSTER, KERNEL = "the cluster", "the kernel"  # where an item ran, for its error
PERSIST_AHEAD = 1024  # --persist: items submitted ahead, per thread, at most
_STARTS = itertools.count(1)  # each start's stop token is the run's id and one of these


def _policy(indices: Sequence[int], job: Job, threads: int) -> Policy:
    """The policy of one start: its batch sizer and how many batches a thread keeps out."""
    # A range's items travel as a range, in a few bytes however many a batch takes: the
    # probes share them out whole, and tiny items need no second round (`batching.py`).
    probe_items = None if isinstance(job.plan.items, range) else PROBE_ITEMS
    # A persisted item is a task of its own (`worker/held.py`).
    batcher = Batcher.from_config(threads, 1 if job.persist else job.fixed_batch, probe_items)
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

    Made by `run.distribute`, which hands the user's verbs to it through `run.Run`; the
    strategy of an ``--everywhere`` run drives it through the `everywhere.Tasks` verbs
    (`submit_task`, `settle_task` and the properties beside them).

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
        self.transport = Transport(run_id)  # the batches out, and how they go and come back
        self.token = ""  # this start's stop token (see worker.stop_run)
        self.stop_sent = threading.Event()  # every worker has been told the token
        self._backlog: Policy | None = None  # the running start's, for the watch thread
        self._adaptive = BacklogReport(run_id)  # the held-back work, told to the adaptive target
        self.journal: Writer | None = None  # every delivered batch is appended (`journal.py`)
        self.publish: str | None = None  # --persist, journaled: the dataset prefix of its handles
        self._placed = Placement()  # where the handles the run reads are, asked once per start

    def journal_to(self, writer: Writer | None) -> None:
        """Append every batch delivered from now on to `writer`; each start's end closes it.

        Parameters
        ----------
        writer : Writer or None
            The run's journal (`journal.py`); None writes no journal.
        """
        self.journal = writer
        if writer is not None:
            # Weakly: a bound method would make a cycle state -> engine -> state, and a --persist
            # run's handles (in the state) would then outlive `del` until a garbage collection.
            engine = weakref.ref(self)
            self.state.on_end(lambda: _call(engine, Engine._end_journal))

    def _end_journal(self) -> None:
        if self.journal is not None:
            c = self.state.counts()
            self.journal.end(c["done"], c["total"])

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

    @property
    def context(self) -> tuple[str, bytes | None] | None:
        """The run's context as batches name it: (key, inline blob or None); None until shipped."""
        return self.shipment.context

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

    # -- the user's verbs, through run.Run ---------------------------------------------------
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
        if self.local_only:
            self.state.begin(indices)
            try:
                self.run_local(indices)
            finally:
                self.state.end()
            return True
        assert self.link is not None
        self.job.recall_handles()
        self.link.open()
        self.ship()
        self.state.begin(indices)
        self.start(indices)
        return True

    def cancel(self) -> None:
        """Stop the run, keeping every item that finished (see the module docstring)."""
        if self.transport.stop():
            # In a thread: a worker that hangs must not hold the kernel beyond the grace.
            threads.spawn(self._tell_workers, name="nbcluster-stop")
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
                self.transport.idle.wait(config.seconds("distribute.cancel-grace"))
        self.transport.cancel(self.client)
        self.state.cancel_pending()

    def _tell_workers(self) -> None:
        # If the cluster is gone, the scheduler-side cancel is all that is left to do.
        with contextlib.suppress(Exception):
            self.client.run(worker.stop_run, self.token, on_error="return")
        self.stop_sent.set()

    # -- driving (a background thread) -------------------------------------------------------
    def start(self, indices: Sequence[int]) -> None:
        """Submit `indices` from a driver thread, watched by a thread that notices a lost cluster.

        Returns at once: the driver (`_drive`, or `everywhere.drive` for ``--everywhere``)
        ends the state's start when its last batch is in. Each start gets its own stop token,
        so an earlier cancel does not stop it.

        Parameters
        ----------
        indices : sequence of int
            The items to run, in order (a `range` for consecutive ones).
        """
        self.state.add_done_callback(self.job.forget_handles)
        self.token = f"{self.run_id}-{next(_STARTS)}"
        self.transport.stopping = False
        self.stop_sent.clear()
        name = f"nbcluster-distribute-{self.run_id}"
        strategies = {"everywhere": everywhere.drive, "ranks": ranks.drive}
        strategy = strategies.get(self.job.plan.mode)
        target = functools.partial(strategy, self) if strategy is not None else self._drive
        # The watch thread starts after its first half-second: a run over by then (a small cell)
        # never starts one.
        driven = threading.Event()
        watch = threads.later(WATCH_S, self._watch, driven, name=f"{name}-watch")
        threads.spawn(self._driving, target, indices, driven, watch, name=name)

    @staticmethod
    def _driving(target: Any, indices: Sequence[int], driven: threading.Event, watch: threads.Later) -> None:
        try:
            target(indices)
        finally:
            driven.set()
            watch.cancel()

    def _watch(self, driven: threading.Event) -> None:
        """End the run if its cluster goes away (see the module docstring); `driven`: the driver ended.

        Started `WATCH_S` after the run, it looks at once, then every `WATCH_S`.
        """
        assert self.link is not None
        unanswered = 0
        while not driven.is_set():
            if self.transport.stopping:
                return
            reason = self.link.gone()
            if reason is None:
                self._follow_cluster()
            # An external scheduler is judged by the client's connection alone; a dropped
            # connection that comes back within a couple of seconds is not a lost cluster.
            unanswered = unanswered + 1 if reason else 0
            if reason and (reason != "its scheduler stopped answering" or unanswered * WATCH_S >= 2):
                self._lose(reason)
                return
            driven.wait(WATCH_S)

    def _follow_cluster(self) -> None:
        """Report the backlog for the adaptive target; size it to the workers there now."""
        backlog, link, client = self._backlog, self.link, self.client
        if backlog is None or link is None or client is None:
            return
        try:
            usable: int | None = link.usable_threads()  # twice a second: the cheap way where it can
        except Exception:  # the scheduler busy, or no worker fits any more: keep the last
            usable = None
        if usable is not None:
            backlog.resize(usable)
            self.transport.abandon_lost(link.workers())
        self._adaptive.send(client, link.needs, backlog.held(), backlog.batcher.seconds_per_item)


    def _lose(self, reason: str) -> None:
        assert self.link is not None
        self.transport.lose()
        self.state.lose(f"cluster {self.link.name!r} stopped answering ({reason})")
        self.shipment.context = None
        self.link.close()

    def _drive(self, indices: Sequence[int]) -> None:
        assert self.link is not None
        quiet_rescheduling()
        backlog = _policy(indices, self.job, self.link.threads)
        self._placed = Placement()
        if self.transport.open(self.link, backlog.per_thread, direct=not (self.job.persist or self.job.reads_handles)):
            backlog.batcher.alone_first = False  # its first batch sends its first item ahead instead
        self._backlog = backlog
        try:
            self._top_up(backlog)
            going = True
            for done in self.transport.completions():
                for future, result in zip(done, self._results(done), strict=True):
                    going = going and self._settle(future, result, backlog)
                if not going:
                    break
                self._top_up(backlog)
                if self.transport.drained():
                    break
        except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
            self._fail(self.state.pending(indices), internal_error(e))
        finally:
            self._backlog = None
            self.transport.close()
            self._adaptive.withdraw(self.client, self.link.needs)
            self.state.end()

    def _results(self, done: list[Any]) -> list[Any]:
        """The result blobs of the finished batches in `done` (`Transport.results`); a
        `--persist` run gathers nothing: its values stay where they are, and only their
        reports are read (`handles.held_report`)."""
        if self.job.persist:
            return [None] * len(done)
        return self.transport.results(self.client, done)

    def _settle(self, future: Any, result: Any, backlog: Policy) -> bool:
        """Take in one finished batch; False when the run cannot go on."""
        batch, alone, unrun = self.transport.take(future)
        if batch is None:
            return True  # cancelled on the scheduler: its items were given up
        assert self.link is not None
        if unrun:
            # Refused, or its worker died under it: nothing of it was delivered, so its items go
            # through the scheduler now, once (not an attempt of theirs), and so does the rest.
            if not self.transport.stopping:
                backlog.refused(batch)
            return True
        if isinstance(future, transport.Call) and future.of is None:
            self.state.direct_keys.append(future.key)
        # A batch that did not finish may have been cancelled by Dask with a dead cluster:
        # not the items' failure.
        gone = None if future.status == "finished" or self.transport.stopping else self.link.gone()
        if gone is not None:
            self._lose(gone)
            return False
        fatal = self._handle(future, result, batch, backlog, alone=alone)[1]
        if fatal is not None:
            self._fail(backlog.drain(), fatal)
            self.transport.cancel(self.client)
            return False
        return True

    def _top_up(self, backlog: Policy) -> None:
        """Submit the policy's batches: `in-flight` per thread out, or a suspect alone.

        The batches of one top-up go out together, in one message to the scheduler per
        placement (`submit_tasks`): each message costs the scheduler ~1.5 ms here.
        """
        if not self.transport.stopping:
            self._submit(backlog.top_up(len(self.transport.pending)), backlog.batcher.budget)

    def _submit(self, batches: Sequence[Sequence[int]], budget: float | None = None) -> None:
        assert self.link is not None
        groups: dict[bool, list[tuple[Any, bytes, list[Any]]]] = {}
        placed: dict[bool, list[list[str]]] = {}
        items = self.job.plan.items
        for batch in batches:
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
                blob = cloudpickle.dumps((indices, chosen, budget))
            except Exception as e:
                error = TypeError(f"the item values cannot be sent to the workers: {e}")
                self._fail(batch, worker.error_record(error))
                continue
            assert self.context is not None
            if not deps and self.transport.send_direct(indices, self.context, blob, self.token):
                continue
            # Where its input is (nothing moves, `worker/held.py`); a persisted item without one,
            # loosely on every worker that fits: Dask never queues a restricted task as a root
            # task, so the items reach the workers at once and run back to back (queued, each
            # waited for a scheduler round trip: 1.6 ms a tiny item, 0.6 ms so; RESULTS.md).
            holders = self._placed.of(self.client, self.job.plan.items, deps) or (
                self.link.eligible if self.job.persist else []
            )
            groups.setdefault(bool(deps), []).append((indices, blob, deps))
            placed.setdefault(bool(deps), []).append(holders)
        self.transport.flush()  # the direct batches of this top-up go out together
        for has_deps, tasks in groups.items():
            self.submit_tasks(tasks, placed=placed[has_deps], **self.link.submit_kwargs)

    def _handle(
        self, future: Any, result: Any, indices: Any, backlog: Policy | None = None, *, alone: bool = True
    ) -> tuple[list[int], worker.ErrorRecord | None]:
        """Deliver one batch, holding back the failed items the backlog takes for another attempt.

        Returns (items to submit again, fatal record); with a `backlog` (the driver's policy),
        it has taken those back itself and none are returned. Items a stopped batch did not
        reach stay pending (the run is ending: they become cancelled). `alone`: no other batch
        was out while this one was.
        """
        if self.job.persist:
            result = held_report(self.client, self.transport.pushed(str(future.key)), future, result)
        outcome = unpack(future, result, len(indices))
        if outcome.killed is not None:
            for i in backlog.killed(indices, alone=alone) if backlog is not None else indices:
                self._fail([i], killed_record(self.client, self.job.plan.describe(i), i, outcome.killed))
            return [], None
        if outcome.halt is not None:
            reason = transport.halt_reason(self.client, str(future.key), outcome.halt)  # while the key is held
            self.transport.cancel(self.client)
            self.state.halt(reason)
            return [], None
        if outcome.lost is not None:
            if self.shipment.reship(self.client, self.job, *outcome.lost):  # not the items' fault: no attempt used
                if backlog is None:
                    return list(indices), None
                backlog.put_back(list(indices))
                return [], None
            lost = worker.error_record(RuntimeError("a captured value was lost with the workers holding it"))
            every = dict.fromkeys(range(len(indices)), lost)
            outcome = Outcome([None] * len(indices), every, {}, fatal=lost)
        values, errors, outputs = outcome.values, outcome.errors, outcome.outputs
        if self.job.persist and outcome.held is not None:
            values = self._handles(future, indices, outcome)
        # Items a batch did not reach (its budget was spent) are simply not delivered: the
        # state and the journal take the first len(values) of `indices`; the policy puts them
        # back, with the failed items that get another attempt (`retry`, not delivered).
        retry: list[int] = []
        unreached = list(indices[len(values) :]) if len(values) < len(indices) and not self.transport.stopping else []
        if backlog is not None:
            failed = errors if outcome.fatal is None else {}
            retry = backlog.finished(
                indices, reached=len(values), failed=failed, seconds=outcome.seconds, idle=outcome.idle
            )
            unreached = []
        if retry:
            held = set(retry)
            keep = [j for j in range(len(values)) if indices[j] not in held]
            self._deliver(
                [indices[j] for j in keep],
                [values[j] for j in keep],
                {k: errors[j] for k, j in enumerate(keep) if j in errors},
                {i: o for i, o in outputs.items() if i not in held},
                ran_on=outcome.ran_on,
            )
        else:
            self._deliver(indices, values, errors, outputs, ran_on=outcome.ran_on)
        return retry + unreached, outcome.fatal

    def _deliver(
        self,
        indices: Sequence[int],
        values: Sequence[Any],
        records: dict[int, worker.ErrorRecord],
        outputs: dict[int, Any],
        where: str = CLUSTER,
        ran_on: tuple[str, str] | None = None,
    ) -> None:
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

    def _fail(self, indices: Sequence[int], record: worker.ErrorRecord) -> None:
        self._deliver(indices, [None] * len(indices), dict.fromkeys(range(len(indices)), record), {})

    # -- --persist (worker/held.py) --------------------------------------------------------------
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

    def submit_task(
        self, indices: Any, blob: bytes, _deps: Sequence[Any] = (), runner: Any = None, **where: Any
    ) -> Any | None:
        """Submit one task running `indices` (their items in `blob`); None once stopping.

        `submit_tasks` of one task.

        Parameters
        ----------
        indices : sequence of int
            The items the task runs (a list, or a `range` when consecutive).
        blob : bytes
            The pickled batch, ``(indices, items, budget)``.
        _deps : sequence of distributed.Future
            The futures of the handles in the batch's items (after those captured by name).
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
        return self.submit_tasks([(indices, blob, list(_deps))], runner=runner, **where)[0]

    def submit_tasks(
        self,
        tasks: Sequence[tuple[Any, bytes, list[Any]]],
        placed: Sequence[Sequence[str]] = (),
        runner: Any = None,
        **where: Any,
    ) -> list[Any | None]:
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
        job = self.job
        calls: list[tuple[Any, ...]] = []
        for _, blob, deps in tasks:
            if job.persist or job.reads_handles:
                captured = job.capture.held
                names = {name: k for k, name in enumerate(captured)}
                futures = [h.future for h in captured.values()] + list(deps)
                # fails, not hangs, without nbcluster: the handles' futures stay arguments Dask sees
                calls.append(transport.task(
                    held.run_batch_held, self.context, blob, self.token, job.persist, names, deps=tuple(futures)
                ))  # fmt: skip
            else:  # fails, not hangs, without nbcluster
                calls.append(transport.task(runner or worker.run_batch, self.context, blob, self.token))
        batches = [indices for indices, _, _ in tasks]
        return self.transport.map(self.client, calls, batches, persist=job.persist, placed=placed, **where)

    def hold_back(self, items: int, seconds: float | None = None) -> None:
        """Report `items` that wait for workers to the scheduler's adaptive target (ranks).

        Parameters
        ----------
        items : int
            How many items wait for a worker to be free; 0 withdraws the report.
        seconds : float, optional
            Each item's expected seconds; default Dask's guess for an unknown task.
        """
        if self.client is not None and self.link is not None and (items or self._adaptive.holding):
            self._adaptive.send(self.client, self.link.needs, items, seconds)

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
        retry = [] if batch is None else self._handle(future, result, batch)[0]
        self.transport.drained()
        return retry

    def withdraw(self, future: Any) -> None:
        """Stop waiting for a task (its items are then failed or given up by the caller).

        Parameters
        ----------
        future : distributed.Future
            A task `submit_task` returned; its result, if it still comes, is ignored.
        """
        with self.transport.lock:
            self.transport.pending.pop(future, None)

    def fail(self, indices: Sequence[int], record: worker.ErrorRecord) -> None:
        """Record the same error for each of `indices` (in the state and the journal).

        Parameters
        ----------
        indices : sequence of int
            The items that failed.
        record : ErrorRecord
            Why, as `worker.error_record` makes it.
        """
        self._fail(indices, record)

    def finish(self) -> None:
        """The start is over: nothing is out, the state ends."""
        self.transport.close()
        self.state.end()


def _call(ref: weakref.ref[Engine], method: Any) -> None:
    engine = ref()
    if engine is not None:
        method(engine)
