"""The engine of a run: the driver thread that submits batches and streams them back.

An `Engine` is made from a `Job` (what to run: `job.py`) and a `Link` (where: `target.py`,
None when every item runs in the kernel). It owns the run's `RunState` (`state.py`) and
is the only thing that writes it; the `Results` view reads it, and `run.Run` hands the
user's verbs (cancel, retry) to the engine.

Policy
------
`_drive` owns everything between the first submit and the last result. It keeps
`in-flight` batches per usable worker thread submitted (one running, the next already
waiting on the worker, so no thread waits for the kernel between batches), sizes each new
batch with `batching.Batcher` (probes sharing out the items until an item time is measured,
each returning after its first item slower than a few ms, then sized from the time), and
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
  worker without it fails the batch as it runs it, `loadable.py`, named in the line; the
  tasks themselves load anywhere, so a scheduler without nbcluster passes them on)
  *halts* the run: nothing more is submitted, the unfinished items are given up, not
  failed, and the waiting cell ends with one line naming the fix (`ClusterCannotRun`).
  It is looked for only in a batch that failed: a finished batch costs nothing more.

State of one start (the first run, each retry): `_Backlog`, the items not yet submitted
(in order, failed items put back in front) with their attempts, the batch sizer and the
suspects;
`_pending`, each submitted future -> the item indices of its batch; `token`, the start's
stop token. Worked example, 2 threads, `in-flight` 2, 400 items of 10 ms: four batches go out, each
returning one item; as each comes back its items are delivered and the backlog tops the
pending batches up to four again, now of 25 items (0.25 s), shrinking to 5 at the end.
(The four first batches are probes of 100 items, each returning after its first item.)

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

import collections
import contextlib
import functools
import itertools
import logging
import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import cloudpickle
from dask.base import annotate

from nbcluster import _threads as threads
from nbcluster import config, worker
from nbcluster._compat import nanny_logs, run_on_holder
from nbcluster.errors import ClusterUnreachable, WorkerKilled
from nbcluster.journal.store import Writer
from nbcluster.journal.store import failure as journal_failure
from nbcluster.persist.handles import Handle, held_slots, made_where, publish
from nbcluster.run import direct, everywhere, loadable, ranks, reports
from nbcluster.run.batching import PROBE_ITEMS, Batcher
from nbcluster.run.capture import pin_soon, shipments
from nbcluster.run.job import Job
from nbcluster.run.state import RunState
from nbcluster.run.target import Link, Needs
from nbcluster.run.values import Packed
from nbcluster.worker import held

WATCH_S = 0.5  # how often a running run checks that its cluster is still there
CLUSTER, KERNEL = "the cluster", "the kernel"  # where an item ran, for its error
PERSIST_AHEAD = 1024  # --persist: items submitted ahead, per thread, at most


@contextlib.contextmanager
def _placing(keys: Sequence[str], placed: Sequence[Sequence[str]], where: dict[str, Any]) -> Iterator[None]:
    """Bind each of the tasks `keys` loosely to its workers in `placed`, within one graph message.

    Dask's submit keywords bind every task of a message to the same workers, which cost a
    chained cell one message per worker holding its inputs (~1.5 ms of the scheduler's time
    each: a thousand at a thousand workers). A graph's annotation may instead be a function
    of the key, which the scheduler calls for each new task: a mapping's own lookup, so the
    scheduler needs nothing of nbcluster to load it. `where` is updated in place when all the
    tasks go to the same workers.
    """
    if not any(placed):
        yield
        return
    if all(list(p) == list(placed[0]) for p in placed):
        where.update(workers=list(placed[0]), allow_other_workers=True)
        yield
        return
    by_key = collections.defaultdict(list, {k: list(p) for k, p in zip(keys, placed, strict=True) if p})
    with annotate(workers=by_key.__getitem__, allow_other_workers=True):
        yield


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
        self.local_only = link is None  # a --local run is retried in the kernel too
        self.state = RunState(len(job.plan))
        self.context_key = f"nbcluster-context-{run_id}"
        self.context: tuple[str, bytes | None] | None = None  # (key, inline blob or None)
        self._context_blob = b""
        self._context_future: Any = None
        self._reships = 0
        self._lock = threading.Lock()
        self._pending: dict[Any, Any] = {}  # future -> the item indices of its batch
        self._alone: Any = None  # the batch that has been the only one out since its submit
        self._stopping = False  # cancel() was called: submit nothing more
        self._idle = threading.Event()  # set while no batch is out (and delivered)
        self._idle.set()
        self._starts = 0
        self.token = ""  # this start's stop token (see worker.stop_run)
        self.stop_sent = threading.Event()  # every worker has been told the token
        self._seq = itertools.count()
        self._completed: Any = None
        self._backlog: _Backlog | None = None  # the running start's, for the watch thread
        self._reports = True  # the scheduler takes backlog reports (until it refuses one)
        self._holding = False  # the last backlog report sent said items were held back
        self._inbox: reports.Inbox | None = None  # --persist: the reports the workers push
        self.journal: Writer | None = None  # every delivered batch is appended (`journal.py`)
        self.publish: str | None = None  # --persist, journaled: the dataset prefix of its handles
        self._placed: dict[Any, list[str]] | None = None  # where the handles read were, once per start
        self._direct: direct.Direct | None = None  # the running start's direct batches (`direct.py`)

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
    def client(self) -> Any:
        """The run's Dask client; None for a --local run, or once its cluster went away."""
        return self.link.client if self.link is not None else None

    # -- set-up (kernel main thread) -------------------------------------------------------
    def ship(self) -> list[str]:
        """Scatter large values (cached) and this run's context blob; report lines.

        Called on the kernel's main thread before the first submit, and again by a retry
        after the cluster went away (the context is then sent afresh). A context of up to
        `worker.INLINE_CONTEXT` bytes travels inline in every batch instead of being
        scattered.

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
        assert self.link is not None
        if self.context is not None:
            return []
        client = self.link.open().client
        try:
            large, notes = shipments(client).ship(client, self.job.capture.large)
            blob = self.job.for_workers(large)
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
        client = self.client
        try:
            current = self._context_future if key == self.context_key else shipments(client).future(key)
            # A value lost with all its holders shows as a cancelled future here.
            if current is not None and current.status == "finished" and client.who_has([current]).get(key):
                return True
            self._reships += 1
            if self._reships > 10:
                return False
            workers = [to] if to else None
            if key == self.context_key:
                self._context_future = self._scatter_context(workers)
                return True
            return shipments(client).reship(client, key, self.job.capture.large, workers)
        except (OSError, TimeoutError):
            return False

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
        with self._lock:
            self._stopping = True
            busy = bool(self._pending)
        if busy:
            # In a thread: a worker that hangs must not hold the kernel beyond the grace.
            threads.spawn(self._tell_workers, name="nbcluster-stop")
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
                self._idle.wait(config.seconds("distribute.cancel-grace"))
        self._cancel_outstanding()
        self.state.cancel_pending()

    def _cancel_outstanding(self) -> None:
        """Cancel on the scheduler whatever is still out; its items are given up."""
        with self._lock:
            self._stopping = True
            futures = list(self._pending)
            self._pending.clear()
            completed = self._completed
        # A direct batch cannot be cancelled: it was told the stop token, and its answer, if
        # it still comes, is ignored.
        futures = [f for f in futures if not isinstance(f, direct.Call)]
        if futures:
            self.client.cancel(futures, reason="interrupted from the notebook")
        if completed is not None:
            completed.clear()

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
        self._starts += 1
        self.state.add_done_callback(self.job.forget_handles)
        self.token = f"{self.run_id}-{self._starts}"
        self._stopping = False
        if self._inbox is None and self.client is not None:
            self._inbox = reports.inbox(self.client)
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
            if self._stopping:
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
            sending = self._direct
            if sending is not None:
                sending.abandon_lost(link.workers())
        if self._reports:
            self._report(backlog.held(), backlog.batcher.seconds_per_item)

    def _report(self, items: int, per_item: float | None) -> None:
        """Send the scheduler this run's held-back work (from the client's event loop)."""
        import dask.config
        from dask.utils import parse_timedelta

        assert self.link is not None
        client = self.client
        kind = "gpu" if self.link.needs.gpus else "cpu"
        if per_item is None:  # nothing measured yet: what Dask assumes of an unknown task
            per_item = float(parse_timedelta(dask.config.get("distributed.scheduler.unknown-task-duration")))
        self._holding = items > 0

        async def send() -> None:
            try:
                await client.scheduler.nbcluster_backlog(
                    run=self.run_id, kind=kind, items=items, seconds=items * per_item
                )
            except Exception:  # not nbcluster's scheduler (or gone): stop asking it
                self._reports = False

        with contextlib.suppress(Exception):
            client.loop.add_callback(send)

    def _lose(self, reason: str) -> None:
        assert self.link is not None
        with self._lock:
            self._stopping = True
            self._pending.clear()
            completed = self._completed
        self.state.lose(f"cluster {self.link.name!r} stopped answering ({reason})")
        if completed is not None:
            completed.clear()
        self.context = None
        self.link.close()

    def _drive(self, indices: Sequence[int]) -> None:
        assert self.link is not None
        _quiet_rescheduling()
        backlog = _Backlog(indices, self.job, self.link.threads)
        self._placed = None
        completed = direct.Completions()
        sending = None
        job = self.job
        if not (job.persist or job.reads_handles) and self.link.needs == Needs() and config.seconds("distribute.direct") > 0:
            sending = direct.Direct(self.client, self.link.workers(), backlog.per_thread, completed)
            if sending.worker() is not None:
                backlog.batcher.alone_first = False  # its first batch sends its first item ahead instead
        with self._lock:
            self._completed = completed
            self._backlog = backlog
            self._direct = sending
        try:
            self._top_up(completed, backlog)
            going = True
            for done in completed.batches():
                for future, result in zip(done, self._results(done), strict=True):
                    going = going and self._settle(future, result, backlog)
                if not going:
                    break
                self._top_up(completed, backlog)
                if self._drained():
                    break
        except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
            self._fail(self.state.pending(indices), _internal_error(e))
        finally:
            with self._lock:
                self._completed = None
                self._backlog = None
                self._direct = None
                self._idle.set()
            if self._holding and self._reports and self.client is not None:
                # Nothing held back any more. A run over before the watch thread's first report
                # (every small cell) told the scheduler nothing, and has nothing to withdraw.
                self._report(0, 0.0)
            self._forget_pushes()
            self.state.end()

    def _forget_pushes(self) -> None:
        """Stop expecting pushes for this run's tasks (those cancelled or withdrawn never come)."""
        if self._inbox is not None:
            for prefix in ("persist", "distribute"):
                self._inbox.forget(f"{prefix}-{self.run_id}-")

    def _results(self, done: list[Any]) -> list[Any]:
        """The result blobs of the finished batches in `done`, fetched in one gather.

        Fetched one by one as each finished (Dask's ``as_completed(with_results=True)``), the
        results of a cell of 8 items took 8 gathers, each a request to the scheduler and one
        from it to a worker; the scheduler's sends were a fifth of its time (py-spy). A batch
        that did not finish gives its exception instead, and so does one whose gather failed
        (`_outcome`, asked alone). A small blob was pushed by its worker ahead of its task's
        end (`worker/push.py`) and needs no gather at all. A `--persist` run gathers nothing:
        its values stay where they are, and only their reports are read (`_held_report`).
        """
        if self.job.persist:
            return [None] * len(done)
        got: dict[int, Any] = {id(f): f.answer for f in done if isinstance(f, direct.Call)}  # came with it
        finished = [f for f in done if f.status == "finished" and id(f) not in got]
        if self._inbox is not None:  # pushed by the worker ahead of the task's end (`worker/push.py`)
            for f in finished:
                if (pushed := self._inbox.take(str(f.key), 0.0)) is not None:
                    got[id(f)] = pushed
        if fetch := [f for f in finished if id(f) not in got]:
            with contextlib.suppress(Exception):  # one of them went meanwhile: each is asked alone
                got.update({id(f): blob for f, blob in zip(fetch, self.client.gather(fetch), strict=True)})
        return [got[id(f)] if id(f) in got else _outcome(f) for f in done]

    def _settle(self, future: Any, result: Any, backlog: _Backlog) -> bool:
        """Take in one finished batch; False when the run cannot go on."""
        ahead = isinstance(future, direct.Call) and future.of is not None
        with self._lock:
            if ahead:
                # The first item of a batch still out (`worker/ahead.py`): delivered now, as a
                # batch of its own; the batch's answer will leave it out.
                whole = self._pending.get(future.of)
                if whole is None:
                    return True
                batch, self._pending[future.of] = whole[:1], whole[1:]
                alone = False
            else:
                batch = self._pending.pop(future, None)
                alone, self._alone = self._alone is future, None
        if batch is None:
            return True  # cancelled on the scheduler: its items were given up
        assert self.link is not None
        if isinstance(future, direct.Call) and future.status != "finished":
            # Refused, or its worker died under it: nothing of it was delivered, so its items go
            # through the scheduler now, once (not an attempt of theirs), and so does the rest.
            if self._direct is not None:
                self._direct.failed(future)
            if not self._stopping:
                backlog.put_back(list(batch))
                if not backlog.batcher.items:
                    backlog.batcher.alone_first = True  # no first item came: the next batch is one
            return True
        if isinstance(future, direct.Call) and not ahead:
            self.state.direct_keys.append(future.key)
        # A batch that did not finish may have been cancelled by Dask with a dead cluster:
        # not the items' failure.
        gone = None if future.status == "finished" or self._stopping else self.link.gone()
        if gone is not None:
            self._lose(gone)
            return False
        retry, fatal = self._handle(future, result, batch, backlog, alone=alone)
        if fatal is not None:
            self._fail(backlog.drain(), fatal)
            self._cancel_outstanding()
            return False
        backlog.put_back(retry)
        return True

    def _drained(self) -> bool:
        """Nothing is out any more (and nothing was topped up): the start is over."""
        with self._lock:
            if self._pending:
                return False
            self._idle.set()
            return True

    def _top_up(self, completed: Any, backlog: _Backlog) -> None:
        """Submit batches from the front of the backlog until `in-flight` per thread are out.

        While there are suspects, one at a time runs alone instead (see the module docstring).
        The batches of one top-up go out together, in one message to the scheduler per
        placement (`submit_tasks`): each message costs the scheduler ~1.5 ms here.
        """
        budget = backlog.batcher.budget
        if backlog.suspects:
            if not self._pending and not self._stopping:
                self._submit(completed, [backlog.suspects.popleft()], budget)
            return
        batches: list[Sequence[int]] = []
        while backlog.items and len(self._pending) + len(batches) < backlog.limit and not self._stopping:
            batches.append(backlog.take(backlog.limit - len(self._pending) - len(batches)))
        self._submit(completed, batches, budget)

    def _submit(self, completed: Any, batches: Sequence[Sequence[int]], budget: float | None = None) -> None:
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
            if not deps and self._send_direct(completed, indices, blob):
                continue
            # Where its input is (nothing moves, `worker/held.py`); a persisted item without one,
            # loosely on every worker that fits: Dask never queues a restricted task as a root
            # task, so the items reach the workers at once and run back to back (queued, each
            # waited for a scheduler round trip: 1.6 ms a tiny item, 0.6 ms so; RESULTS.md).
            holders = self._placement(deps) or (self.link.eligible if self.job.persist else [])
            groups.setdefault(bool(deps), []).append((indices, blob, deps))
            placed.setdefault(bool(deps), []).append(holders)
        if self._direct is not None:
            self._direct.flush()  # the direct batches of this top-up go out together
        for has_deps, tasks in groups.items():
            for future in self.submit_tasks(tasks, placed=placed[has_deps], **self.link.submit_kwargs):
                if future is not None:
                    completed.add(future)

    def _send_direct(self, completed: direct.Completions, indices: Any, blob: bytes) -> bool:
        """Send one batch to a worker directly (`direct.py`); False: it goes through the scheduler."""
        sending = self._direct
        address = sending.worker() if sending is not None else None
        if sending is None or address is None:
            return False
        assert self.context is not None
        with self._lock:
            if self._stopping:
                return True  # nothing more goes out: its items become cancelled
            key = f"distribute-{self.run_id}-{next(self._seq)}"
            call = sending.send(key, address, self.context, blob, self.token, first=not self._pending)
            self._alone = None if self._pending else call
            self._pending[call] = indices
            self._idle.clear()
        return True

    def _handle(
        self, future: Any, result: Any, indices: Any, backlog: _Backlog | None = None, *, alone: bool = True
    ) -> tuple[list[int], worker.ErrorRecord | None]:
        """Deliver one batch, holding back the failed items the backlog takes for another attempt.

        Returns (items to submit again, fatal record). Items a stopped batch did not reach
        stay pending (the run is ending: they become cancelled), unless the run goes on,
        when they are submitted again. `alone`: no other batch was out while this one was.
        """
        if self.job.persist:
            result = self._held_report(future, result, len(indices))
        outcome = _unpack(future, result, len(indices))
        if outcome.killed is not None:
            if backlog is not None and not (alone and len(indices) == 1):
                backlog.suspect(list(indices))  # not an attempt: which item it was is not known yet
                return [], None
            for i in indices:
                self._fail([i], self._killed(i, outcome.killed))
            return [], None
        if outcome.halt is not None:
            reason = loadable.halt_reason(self.client, str(future.key), outcome.halt)  # while the key is held
            self._cancel_outstanding()
            self.state.halt(reason)
            return [], None
        if outcome.lost is not None:
            if self._reship(*outcome.lost):
                return list(indices), None  # not the items' fault: no attempt used
            lost = worker.error_record(RuntimeError("a captured value was lost with the workers holding it"))
            every = dict.fromkeys(range(len(indices)), lost)
            outcome = _Outcome([None] * len(indices), every, {}, fatal=lost)
        values, errors, outputs = outcome.values, outcome.errors, outcome.outputs
        if self.job.persist and outcome.held is not None:
            values = self._handles(future, indices, outcome.held, errors, outcome.ran_on)
        retry: list[int] = []
        if backlog is not None:
            if outcome.seconds is not None:
                backlog.batcher.observe(len(values), outcome.seconds, idle=outcome.idle)
            if outcome.fatal is None:
                retry = [indices[j] for j in errors if backlog.may_retry(indices[j])]
        # Items a batch did not reach (its budget was spent) are simply not delivered: the
        # state and the journal take the first len(values) of `indices`.
        unreached = list(indices[len(values) :]) if len(values) < len(indices) and not self._stopping else []
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

    def _killed(self, index: int, killed: Any) -> worker.ErrorRecord:
        """The failure record of item `index`, whose worker died each time it ran it."""
        described = self.job.plan.describe(index)
        message = (
            f"item {index}{f' ({described})' if described else ''} killed its worker "
            f"{killed.allowed_failures + 1} times (a crash or out of memory)"
        )
        said = _last_words(self.client, killed.last_worker)
        if said:
            message += f"; the worker's nanny logged: {said}"
        return worker.error_record(WorkerKilled(message), frames=False)

    # -- --persist (worker/held.py) --------------------------------------------------------------
    def _held_report(self, future: Any, result: Any, n: int) -> Any:
        """A persisted item's report blob, read where it ran; else its task's exception.

        The worker pushed it as an event ahead of the task's end (`reports.py`): no round trip.
        Where it did not come, it is read from the worker's event loop (a task would queue
        behind the worker's next item), and failing that (the worker dropped it) made again
        from the value by a small task. A task without a value raised after its report was
        out (`worker/held.py`): its report, too large to push, is asked of the workers.
        """
        key = str(future.key)
        if self._inbox is not None and (pushed := self._inbox.take(key, 0.0)) is not None:
            return pushed
        if future.status == "error":
            with contextlib.suppress(Exception):
                for said in self.client.run(held.report_of, key, on_error="return").values():
                    if isinstance(said, bytes):
                        return said
        if future.status != "finished":
            return result if result is not None else _outcome(future)
        with contextlib.suppress(Exception):
            report = run_on_holder(self.client, key, held.report_of, key)
            if report is not None:
                return report
        return _outcome(self.client.submit(held.report_for, future, pure=False))

    def _handles(
        self, future: Any, indices: Sequence[int], described: list[Any], errors: dict[int, Any],
        ran_on: tuple[str, str] | None,
    ) -> list[Any]:
        """The handle of a persisted item that has a value: its task's own future and key."""
        if not described or 0 in errors or described[0] is None:
            return [None] * len(described)  # no value (its task raised, or ran nothing): the future goes with this frame
        handle = Handle(future, described[0], indices[0], made_on=ran_on[0] if ran_on else None)
        if self.publish is not None:
            self._publish([handle])
        return [handle]

    def _publish(self, made: list[Handle]) -> None:
        """Keep a journaled run's new values on the cluster past this kernel (`handles.publish`)."""
        try:
            publish(self.client, made, self.publish or "")
        except Exception as e:  # a journal must never break a cell: the run goes on, unjournaled
            self.publish = None
            if self.journal is not None:
                self.journal.release()
            print(f"nbcluster: the cluster would not keep this run's values for --resume ({type(e).__name__}: {e}): "
                  "the run goes on without a journal", file=sys.stderr)  # fmt: skip

    def _placement(self, deps: Sequence[Any]) -> list[str]:
        """Where a batch reading the handles `deps` should run: a hint, once per start for every
        handle the run reads; Dask may still run it elsewhere (`allow_other_workers`), and moves
        the value then.

        A handle made in this kernel knows the worker that made it (`Handle.made_on`), and Dask
        keeps a value there until that worker goes (then the hint names no live worker, and
        Dask places the batch itself): nothing is asked, which was a round trip before the
        first item of every chained cell could go out. Only the others (handles adopted from a
        journal) are asked of the scheduler, in one round trip.
        """
        if not deps:
            return []
        if self._placed is None:
            known, unknown = made_where(self.job.plan.items)
            self._placed = known
            if unknown:
                with contextlib.suppress(Exception):  # the scheduler busy or gone: let Dask place them
                    self._placed.update({k: list(v) for k, v in self.client.who_has(unknown).items()})
        for f in deps:
            if self._placed.get(f.key):
                return self._placed[f.key]
        return []

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
        return self._stopping

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
                calls.append(loadable.task(
                    held.run_batch_held, self.context, blob, self.token, job.persist, names, deps=tuple(futures)
                ))  # fmt: skip
            else:  # fails, not hangs, without nbcluster
                calls.append(loadable.task(runner or worker.run_batch, self.context, blob, self.token))
        if not calls:
            return []
        prefix = "persist" if job.persist else "distribute"
        with self._lock:
            if self._stopping:
                return [None] * len(calls)
            keys = [f"{prefix}-{self.run_id}-{next(self._seq)}" for _ in calls]
            if self._inbox is not None:
                for key in keys:
                    self._inbox.expect(key)  # before the task can run: its push may come first
            # One `client.map`: one graph message, however many tasks (the function is the
            # same for all: `loadable.task`'s) and however many workers they are bound for.
            columns = zip(*(c[1:] for c in calls), strict=True)
            with _placing(keys, placed, where):
                made = self.client.map(calls[0][0], *columns, key=keys, pure=False, **where)
            for future, (indices, _, _) in zip(made, tasks, strict=True):
                self._alone = None if self._pending else future
                self._pending[future] = indices
            self._idle.clear()
        return list(made)

    def hold_back(self, items: int, seconds: float | None = None) -> None:
        """Report `items` that wait for workers to the scheduler's adaptive target (ranks).

        Parameters
        ----------
        items : int
            How many items wait for a worker to be free; 0 withdraws the report.
        seconds : float, optional
            Each item's expected seconds; default Dask's guess for an unknown task.
        """
        if self._reports and self.client is not None and (items or self._holding):
            self._report(items, seconds)

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
        with self._lock:
            return [f for f in futures if f in self._pending]

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
        with self._lock:
            batch = self._pending.pop(future, None)
        [result] = self._results([future])
        retry = [] if batch is None else self._handle(future, result, batch)[0]
        with self._lock:
            if not self._pending:
                self._idle.set()
        return retry

    def withdraw(self, future: Any) -> None:
        """Stop waiting for a task (its items are then failed or given up by the caller).

        Parameters
        ----------
        future : distributed.Future
            A task `submit_task` returned; its result, if it still comes, is ignored.
        """
        with self._lock:
            self._pending.pop(future, None)

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
        self._idle.set()
        self._forget_pushes()
        self.state.end()


class _Backlog:
    """One start's items not yet submitted (in order), their attempts, and the batch sizer."""

    def __init__(self, indices: Sequence[int], job: Job, threads: int):
        self.items = _Queue(indices)
        self.suspects: deque[list[int]] = deque()  # parts of killed batches, each to run alone
        self.retries = job.retries
        self.attempts: dict[int, int] = {}  # attempts used, by the failed items only (no dict of a million)
        # A persisted item is a task of its own (`worker/held.py`).
        # A range's items travel as a range, in a few bytes however many a batch takes: the
        # probes share them out whole, and tiny items need no second round (`batching.py`).
        probe_items = None if isinstance(job.plan.items, range) else PROBE_ITEMS
        self.batcher = Batcher.from_config(threads, 1 if job.persist else job.fixed_batch, probe_items)
        self.per_thread = max(1, int(config.get("distribute.in-flight")))
        if job.reads_handles:
            # One item a task, each placed where its value is: no batch to size from what comes
            # back, so all go out at once and wait on their holders, as hand-written futures would
            # (two a thread left each worker idle for a round trip after every short item).
            self.per_thread = max(self.per_thread, len(indices))
        elif job.persist:
            # Likewise, as `client.map` would: the scheduler's queue feeds the workers, not a round
            # trip to the kernel after each item; bounded, so a huge run is not all futures at once.
            self.per_thread = max(self.per_thread, min(len(indices), PERSIST_AHEAD))
        self.limit = self.per_thread * threads  # batches out at once

    def resize(self, threads: int) -> None:
        """The cluster now has `threads` usable threads (workers joined or left)."""
        self.batcher.threads = max(threads, 1)
        self.limit = self.per_thread * max(threads, 1)

    def held(self) -> int:
        """Items not submitted yet."""
        return len(self.items) + sum(len(part) for part in self.suspects)

    def take(self, free: int = 1) -> Sequence[int]:
        """The next batch, sized by the batcher; `free`: batches that may go out now, this one too."""
        return self.items.take(self.batcher.next_size(len(self.items), free))

    def may_retry(self, i: int) -> bool:
        """Whether failed item `i` has an attempt left (`--retries`); uses it up if so."""
        used = self.attempts.get(i, 0)
        if used >= self.retries:
            return False
        self.attempts[i] = used + 1
        return True

    def put_back(self, indices: list[int]) -> None:
        self.items.put_back(indices)

    def suspect(self, indices: list[int]) -> None:
        """A batch whose workers kept dying: its halves run alone, one after the other."""
        half = (len(indices) + 1) // 2
        self.suspects.extend(part for part in (indices[:half], indices[half:]) if part)

    def drain(self) -> list[int]:
        taken = [*(i for part in self.suspects for i in part), *self.items]
        self.items.clear()
        self.suspects.clear()
        return taken


class _Queue:
    """Item indices in order, held as runs of consecutive ones (ranges), not one int each.

    A backlog of 1,000,000 items is then one range, not a deque of a million ints (~36 MB
    in the kernel); a batch's indices exist as a list only while it is made.
    """

    def __init__(self, indices: Sequence[int]):
        self._runs: deque[range] = deque(_runs(indices))
        self._count = len(indices)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self._runs)

    def take(self, n: int) -> Sequence[int]:
        """The first `n` indices (fewer if there are fewer), removed: a `range` when consecutive.

        A million tiny items go out in batches of 100,000 consecutive indices; as lists they
        cost the driver thread 0.016 us an item to build (py-spy), as ranges nothing.
        """
        runs = self._runs
        if runs and len(runs[0]) >= n:
            run = runs[0]
            taken, runs[0] = run[:n], run[n:]
            if not runs[0]:
                runs.popleft()
            self._count -= len(taken)
            return taken
        out: list[int] = []
        while runs and len(out) < n:
            run = runs[0]
            want = n - len(out)
            if len(run) <= want:
                out.extend(runs.popleft())
            else:
                out.extend(run[:want])
                runs[0] = run[want:]
        self._count -= len(out)
        return out

    def put_back(self, indices: Sequence[int]) -> None:
        """`indices` go back in front, in their order."""
        self._runs.extendleft(reversed(_runs(indices)))
        self._count += len(indices)

    def clear(self) -> None:
        self._runs.clear()
        self._count = 0


def _runs(indices: Sequence[int]) -> list[range]:
    """`indices` as ranges of consecutive ones, in order."""
    if isinstance(indices, range):
        return [indices] if len(indices) else []
    runs: list[range] = []
    start = previous = None
    for i in indices:
        if previous is not None and i == previous + 1:
            previous = i
            continue
        if start is not None and previous is not None:
            runs.append(range(start, previous + 1))
        start = previous = i
    if start is not None and previous is not None:
        runs.append(range(start, previous + 1))
    return runs


class _Rescheduling(logging.Filter):
    """Drops the client's "Couldn't gather 1 keys, rescheduling" warning.

    A worker that dies holding a finished batch's result makes Dask compute that batch
    again, and the run takes the result from the second computation; nothing is lost, so
    nothing belongs in the cell (where the kernel's log handler would print it).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Couldn't gather")


def _call(ref: weakref.ref[Engine], method: Any) -> None:
    engine = ref()
    if engine is not None:
        method(engine)


def _quiet_rescheduling() -> None:
    log = logging.getLogger("distributed.client")
    if not any(isinstance(f, _Rescheduling) for f in log.filters):
        log.addFilter(_Rescheduling())


def _internal_error(e: Exception) -> worker.ErrorRecord:
    error = RuntimeError(f"nbcluster internal error while running the items: {type(e).__name__}: {e}")
    error.__cause__ = e  # its frames go in the record, for the bug report
    return worker.error_record(error)


class _Outcome(NamedTuple):
    values: Sequence[Any]  # of the first len(values) items of the batch (fewer if it stopped early); maybe Packed
    errors: dict[int, worker.ErrorRecord]  # by position in the batch
    outputs: dict[int, Any]  # by item index
    seconds: float | None = None  # time the items took on the worker
    fatal: worker.ErrorRecord | None = None  # the context could not load: every batch would fail
    lost: tuple[str, str | None] | None = None  # (key no worker holds any more, who asked)
    killed: Any = None  # Dask's KilledWorker: every worker that ran the batch died
    halt: str | None = None  # nbcluster could not be imported to unpickle the batch: why
    held: list[Any] | None = None  # --persist: the workers' description of each value (HeldValue)
    ran_on: tuple[str, str] | None = None  # the worker that ran the batch: (address, name)
    idle: float | None = None  # how long its thread waited for it after its last batch of the run


def _unpack(future: Any, result: Any, n: int) -> _Outcome:
    record: worker.ErrorRecord | None = None
    # A result blob is a result even if the future reads "lost" by now: the worker that
    # held it died after it was gathered.
    if future.status != "finished" and not isinstance(result, bytes):
        exc = result[1] if isinstance(result, tuple) else result
        missing = _nbcluster_missing(exc)
        if missing is not None:
            return _Outcome([], {}, {}, halt=missing)
        if _is_killed_worker(exc):
            return _Outcome([], {}, {}, killed=exc)
        record = _batch_failure(exc)
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
    values = data["values"]
    if isinstance(values, bytes):  # builtin data, pickled as one list: kept so until read (values.py)
        values = Packed(values, data["count"])
    return _Outcome(
        values, data["errors"], data["outputs"], data["seconds"], held=data.get("held"),
        ran_on=data.get("ran_on"), idle=data.get("idle"),
    )  # fmt: skip


def _outcome(future: Any) -> Any:
    """What as_completed(with_results=True) would give: the blob, or the exception."""
    try:
        return future.result()
    except BaseException as e:
        return e


def _nbcluster_missing(exc: Any) -> str | None:
    """The import error in `exc`'s chain that names nbcluster, as one line, else None.

    Dask wraps the scheduler's failure to unpickle a graph in its own multi-line
    RuntimeError; the cause it keeps says which module was missing.
    """
    for _ in range(8):  # a chain is short; a cycle must not hang the driver
        if not isinstance(exc, BaseException):
            return None
        if isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] == "nbcluster":
            return f"{type(exc).__name__}: {exc}"
        exc = exc.__cause__ or exc.__context__
    return None


def _is_killed_worker(exc: Any) -> bool:
    from distributed import KilledWorker

    return isinstance(exc, KilledWorker) and len(exc.args) == 3


def _last_words(client: Any, last: Any) -> str | None:
    """What the nanny of a worker that died last logged about it, as one line, else None.

    The nanny outlives its worker (and restarts it); its log says how the worker ended
    ("Worker process 4242 exited with status 1", or that it passed its memory budget).
    Dask keeps no stderr of the dead process itself.
    """
    nanny = getattr(last, "nanny", None)
    if client is None or not nanny:
        return None
    try:
        records = nanny_logs(client, nanny)
    except Exception:  # no nanny (a plain `dask worker --no-nanny`), or it is gone too
        return None
    # Newest first. Nannies that share a process share its log: keep this worker's lines.
    pid = getattr(last, "pid", None)
    lines = [str(msg).split(" - ", 3)[-1].strip() for _, msg in records]
    lines = [line for line in lines if pid is None or f"pid={pid})" in line or f"process {pid} " in line]
    for wanted in ("memory budget", "Worker process"):
        for line in lines:
            if wanted in line:
                return line
    return None


def _batch_failure(exc: Any) -> worker.ErrorRecord:
    if isinstance(exc, BaseException) and type(exc).__name__ == "CancelledError":
        exc = type(exc)("the batch was cancelled on the cluster")
    elif not isinstance(exc, BaseException):
        exc = RuntimeError(f"the batch failed: {exc!r}")
    return worker.error_record(exc, frames=False)
