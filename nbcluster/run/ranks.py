"""`--ranks N`: one job as N ranks that talk (data-parallel training), all or nothing.

The engine's strategy for a plan of N ranks (`api.launch` makes it with ``ranks=N``, for
``%%distribute --ranks N`` and `nbcluster.ranks`): the items are ``(0,), (1,), ...``, each
binding ``rank`` only in messages, and the cell or function runs once per rank with
torchrun's environment (`worker/rank.py`). It shares the engine's tasks and state through
the `everywhere.Tasks` verbs, and none of the batch driver's policy. Policy, in the order a
job lives:

1. **Workers.** Each rank needs a worker process of its own (a process has one
   environment, torch one default process group). The driver waits until N distinct
   workers that qualify (``--gpus``/``--cpus``) each have a free thread and, for a job
   that asks them, the GPUs (CPUs) a rank asks free as well (a GPU worker has several
   threads for fractional items: a spare one beside a ``--gpus 1`` item is no room for a
   ``--gpus 1`` rank), saying once what it waits for; meanwhile it reports the missing ranks as held-back work, so an adaptive
   cluster grows. Ranks on one host get consecutive numbers, as under torchrun.
2. **Rendezvous.** ``MASTER_ADDR`` is rank 0's host, ``MASTER_PORT`` a port free there
   (asked of rank 0's worker). N tasks are submitted at once, each pinned to its worker.
3. **All or nothing.** Every rank, once running, reports on the job's Dask `Queue` and
   waits at its gate (a Dask `Variable`). When all N reported, the kernel opens the gate
   (``"go"``); when they have not within ``nbcluster.ranks.start`` (a worker's thread was
   taken between the look and the submit), or the run is stopped first, it closes it with
   the reason, every rank returns having run nothing, and the job fails with one line. No
   rank ever waits in a collective for a peer that never came.
4. **Failure.** When a rank fails or its worker leaves, the ranks still running are
   stopped within about a second: their tasks are cancelled, and every rank's worker
   process is ended, the failed ones' too (a rank blocked in gloo or NCCL cannot be
   interrupted otherwise, and a failed ``init_process_group`` leaves its process unfit for
   the next; each nanny starts a fresh worker, which later jobs wait for). The rank that
   failed keeps its own error; the stopped ones say why, and `cause(run_id)` is the one
   line naming the rank and the cause. A Ctrl-C (or ``Results.cancel()``) stops every rank
   the same way. A ``--gpus`` job ends its ranks' processes when it ends, however it ends:
   each rank saw its host's GPUs (``worker/rank.py``), and the next task on that worker
   must see only its own.
5. **Stopping the job.** In a trial job (``--timeout``, or a cell that calls `report`,
   `should_stop` or `checkpoint`), `attach` makes any stop of any rank stop the whole job:
   ``--timeout`` (counted from the ranks' start, past the gate), ``runs.stop(i)``, a
   stopper. Every rank is asked first (``should_stop()`` turns True, ``report()`` raises
   `TrialStopped`); when one is still running after ``nbcluster.stop.grace`` (or one
   failed meanwhile), every rank's worker process is ended as in 4, since a rank whose peer
   stopped may wait in a collective for ever. The ranks
   still out then end *timed out* or *stopped* (`Trials.state`), and `cause` is one line,
   such as "the job timed out after 2 s: stopped ranks 0, 1".

Results are in rank order: ``runs[0]`` is rank 0's value. A trial job's reports are kept
from every rank (``runs.metrics`` has the rank beside the item), and the live curve is rank
0's, as a training script logs on rank 0 only. Worked example, ``--ranks 2`` on
two idle workers A and B (B's address sorts first): rank 0 on B, rank 1 on A; B picks port
40123; both tasks start, report, the gate opens, both train; rank 1 raises at step 7, so
A's task is settled with its error, both processes are ended, and rank 0 fails with
"stopped because rank 1 failed (ValueError: ...)".
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any, Protocol

import cloudpickle

from nbcluster import _compat, config
from nbcluster import _threads as threads
from nbcluster._wire import TRIAL_TOPIC_PREFIX
from nbcluster.errors import BadArgument
from nbcluster.run.everywhere import Tasks
from nbcluster.run.state import RunState
from nbcluster.run.transport import Link, placement
from nbcluster.run.trials import Trials
from nbcluster.worker import error_record, trial
from nbcluster.worker.rank import RankSpec, end_process, free_port, own_device, run_rank

LOOK_S = 0.25  # how often a running job looks for departed workers
WAIT_LINE_S = 1.0  # a job waiting for workers says so after this long
RETURN_S = 30.0  # how long a GPU job's end waits for its ended worker processes to be back
RANK_S = 3600.0  # what a waiting rank counts as in the adaptive target: a long job

# run id -> the one line naming the rank that failed and why (kept for the cell's summary)
CAUSES: dict[str, str] = {}
# run id -> (why its whole job is to stop, the job's line): a --timeout, runs.stop(i), a stopper
STOPS: dict[str, tuple[str, str]] = {}
# (scheduler, worker) addresses of the worker processes a job ended, which the scheduler may
# list a moment longer (a restarted worker comes back under a new address): `ended`
ENDED: set[tuple[str, str]] = set()
# run ids of the jobs whose driver runs now: a stop of any other job is stale (it ended), and
# must not stop a later retry of it
RUNNING: set[str] = set()


class RankFailed(RuntimeError):
    """A rank's worker left while it ran."""


class RankStopped(RuntimeError):
    """This rank was stopped because another rank failed, or the job was interrupted."""


class RanksTasks(Tasks, Protocol):
    """What the ranks strategy asks of the engine beyond `everywhere.Tasks`."""

    @property
    def state(self) -> RunState:
        """The run's state: which ranks failed."""

    @property
    def run_id(self) -> str:
        """The run's id, naming the job's gate."""

    @property
    def link(self) -> Link | None:
        """The run's cluster: what each rank needs of a worker."""

    def hold_back(self, items: int, seconds: float | None = None) -> None:
        """Report `items` waiting for workers to the scheduler (an adaptive cluster grows).

        Parameters
        ----------
        items : int
            How many ranks wait for a worker; 0 when none do.
        seconds : float, optional
            Each one's expected seconds.
        """


def check(n: int, link: Link) -> None:
    """Refuse, with one line, a job the cluster can never hold.

    Parameters
    ----------
    n : int
        The ranks asked for.
    link : Link
        The run's cluster, open.

    Raises
    ------
    nbcluster.errors.BadArgument
        When fewer than `n` workers can ever qualify: an adaptive cluster's maximum, or the
        workers of one that does not adapt.
    """
    gpus = bool(link.needs.gpus)
    kind = "GPU workers" if gpus else "workers"
    data: Any = {}
    if link.handle is not None:
        try:
            data = link.handle.info().data
        except Exception:  # the supervisor busy: judge by the workers alone
            data = {}
    adaptive = data.get("adaptive")
    if adaptive:
        most = adaptive.get("gpu_maximum", 0) if gpus else adaptive["maximum"]
        if most < n:
            raise BadArgument(
                f"--ranks {n} needs {n} {kind}, each rank a process of its own, and {link.name} adapts up to "
                f"{most}: `%cluster adapt --max {n}` first, or ask for fewer ranks"
            )
        return
    # Those it has, or those it was asked for: a worker a failed job ended is on its way back.
    has = max(len(link.eligible_now()), (data.get("requested") or {}).get("gpu" if gpus else "cpu", 0))
    if has < n:
        raise BadArgument(
            f"--ranks {n} needs {n} {kind}, each rank a process of its own, and {link.name} has {has}: "
            f"`%cluster scale {n}{' --kind gpu' if gpus else ''}` first, or ask for fewer ranks"
        )


def cause(run_id: str) -> str | None:
    """The line naming the rank that failed the job and why; None when none failed.

    Parameters
    ----------
    run_id : str
        The run's id.

    Returns
    -------
    str or None
        Such as ``"rank 1 failed (ValueError: bad batch); stopped rank 0"``.
    """
    return CAUSES.get(run_id)


def attach(tracker: Trials, run_id: str) -> None:
    """Make a trial job's tracker stop the whole job, and draw rank 0's curve only.

    Parameters
    ----------
    tracker : Trials
        The job's reports and stops (`trials.py`).
    run_id : str
        The job's run id.
    """
    tracker.stops.job = functools.partial(stop_job, run_id, timeout=tracker.rules.timeout)
    tracker.series.drawn = lambda i: i == 0


def stop_job(run_id: str, reason: str, timeout: float | None = None) -> None:
    """Stop every rank of job `run_id` (its driver acts within `LOOK_S`); see the module docstring.

    Parameters
    ----------
    run_id : str
        The job's run id.
    reason : str
        ``"timed out"``, or who stopped it (``"stopped from the notebook"``), as the ranks'
        states and the job's line say.
    timeout : float, optional
        The job's ``--timeout`` in seconds, for its line.
    """
    if run_id not in RUNNING:
        return  # it ended: nothing to stop, and a retry of it starts afresh
    if reason == "timed out":
        line = f"the job timed out after {timeout:g} s" if timeout else "the job timed out"
    else:
        line = f"the job was {reason}" if reason.startswith("stopped") else f"the job was stopped ({reason})"
    STOPS.setdefault(run_id, (reason, line))


def finished(values: dict[int, Any], n: int) -> bool:
    """Whether a journaled job finished, so that ``--resume`` takes its ranks whole.

    Parameters
    ----------
    values : dict of int to Any
        The ranks' values found in the journal.
    n : int
        The job's ranks.

    Returns
    -------
    bool
        True when every rank has a value and none was stopped (``--timeout``, a stop): a job
        that did not finish runs all its ranks again, from its checkpoint.
    """
    return len(values) == n and not any(isinstance(v, trial.Stopped) for v in values.values())


def summary(run_id: str) -> str | None:
    """The line said under a job's cell when it did not end well; None when it did.

    A job that was stopped (``--timeout``, a stop, a stopper) says what happened and what to
    do in this one line, and only this line: the ranks it ended by force count as failed
    (`RankStopped`), but the cell prints no failure summary for them (`stopped`).

    Parameters
    ----------
    run_id : str
        The job's run id.

    Returns
    -------
    str or None
        ``"the job failed: rank 1 failed (...)"``, or a stopped job's own line and what to do
        (``"the job timed out after 2 s: stopped ranks 0, 1; --resume runs it again from its
        last checkpoint (with a longer --timeout)"``).
    """
    line = CAUSES.get(run_id)
    if line is None:
        return None
    if not stopped(run_id):
        return f"the job failed: {line}"
    longer = " (with a longer --timeout)" if line.startswith("the job timed out") else ""
    return f"{line}; --resume runs it again from its last checkpoint{longer}"


def stopped(run_id: str) -> bool:
    """Whether job `run_id` was stopped as a whole: its own line then says all.

    Parameters
    ----------
    run_id : str
        The job's run id.

    Returns
    -------
    bool
        True for a job ended by ``--timeout``, a stop or a stopper (or stopped before every
        rank started), False for one a rank failed, and for one still running.
    """
    return CAUSES.get(run_id, "").startswith("the job ")


def drive(tasks: RanksTasks, indices: Sequence[int]) -> None:
    """Run the job's ranks, all or nothing, until every rank is in or the job failed.

    Parameters
    ----------
    tasks : RanksTasks
        The engine, whose tasks and state the strategy uses.
    indices : sequence of int
        The ranks to run: every rank of the job (a job is never run in part).
    """
    n = len(tasks.items)
    gate = f"nbcluster-ranks-{tasks.run_id}-{time.monotonic_ns()}"
    running: dict[Any, int] = {}  # future -> rank, until taken in
    where: dict[int, str] = {}  # rank -> its worker
    queue: Any = None  # where the ranks say they started
    RUNNING.add(tasks.run_id)
    try:
        chosen = _wait_for_workers(tasks, n)
        if chosen is None:
            return
        specs = _specs(tasks.client, chosen, gate, gpus=bool(_link(tasks).needs.gpus))
        queue = _started_queue(tasks.client, gate)  # before any rank: the scheduler drops it with its last handle
        changed = threading.Event()
        for r in range(n):
            where[r] = chosen[r]
            blob = cloudpickle.dumps(([r], [tasks.items[r]], None))
            future = tasks.submit_task(
                [r],
                blob,
                runner=_runner(specs[r]),
                workers=[chosen[r]],
                allow_other_workers=False,
                **tasks.placement,
            )
            if future is None:
                return
            running[future] = r
            future.add_done_callback(lambda _: changed.set())
        if not _open_gate(tasks, queue, gate, n, running, where):
            return
        _follow(tasks, running, where, changed)
    except Exception as e:  # an nbcluster bug must not leave the cell waiting forever
        tasks.fail(list(tasks.state.pending(range(n))), error_record(e))
    finally:
        if running:  # stopped (Ctrl-C, cancel): the ranks still out must not hang
            stopped = sorted(running.values())
            _stop(tasks, running, where, "the job was stopped from the notebook")
            CAUSES.setdefault(tasks.run_id, f"the job was stopped from the notebook: {_stopped(stopped)}")
        elif where and _link(tasks).needs.gpus:
            # A GPU rank's process may have started CUDA seeing its host's other GPUs: a fresh
            # process sees only its own again (and the job's GPU memory is freed). The job ends
            # once those processes are back, so that the next GPU cell finds its workers.
            before = len(_qualifying(tasks))
            _stop(tasks, running, where, "the job ended")
            _await_return(tasks, before)
        _forget(tasks.client, gate, queue)
        RUNNING.discard(tasks.run_id)
        STOPS.pop(tasks.run_id, None)
        tasks.hold_back(0)
        tasks.finish()


def ended(client: Any, listed: Collection[str]) -> set[str]:
    """Those of `listed`, the workers the scheduler lists now, whose process a job ended.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    listed : collection of str
        The addresses of the workers its scheduler lists now.

    Returns
    -------
    set of str
        Their addresses. An ended worker the scheduler no longer lists is forgotten: a later
        worker at its address (the OS reuses ports) is another process, and so is one of
        another cluster (they go by scheduler too).
    """
    scheduler, known = client.scheduler.address, list(ENDED)  # one copy: another job's driver may add
    ENDED.difference_update([(s, a) for s, a in known if s == scheduler and a not in listed])
    return {a for s, a in known if s == scheduler and a in listed}


def _qualifying(tasks: RanksTasks) -> list[str]:
    """The workers that fit the job's needs, less those whose process a job has ended."""
    workers = _compat.workers(tasks.client)
    try:
        eligible = placement(_link(tasks).needs, workers)[2]
    except BadArgument:  # none of the kind (now)
        return []
    gone = ended(tasks.client, workers)
    return [a for a in eligible if a not in gone]


def _await_return(tasks: RanksTasks, count: int) -> None:
    """Wait (`RETURN_S` at most) until `count` qualifying workers are there again."""
    deadline = time.monotonic() + RETURN_S
    pause = threading.Event()  # never set: the pause between looks at the scheduler
    with contextlib.suppress(Exception):  # the cluster gone: nothing to wait for
        while len(_qualifying(tasks)) < count and time.monotonic() < deadline:
            pause.wait(LOOK_S)


def _runner(spec: RankSpec) -> Any:
    return functools.partial(run_rank, spec)


def _wait_for_workers(tasks: RanksTasks, n: int) -> list[str] | None:
    """N distinct qualifying workers with a free thread, rank order; None when stopped first."""
    client, needs = tasks.client, _link(tasks).needs
    began, said = time.monotonic(), False
    tick = threading.Event()  # never set: the pause between looks at the scheduler
    while not _stopping(tasks):
        workers = _compat.workers(client)
        try:
            eligible = placement(needs, workers)[2]
        except BadArgument:  # no worker of the kind yet: an adaptive cluster may start some
            eligible = []
        free = _free(client, workers, eligible, tasks.placement.get("resources") or {})
        if len(free) >= n:
            tasks.hold_back(0)
            hosts = {a: _host(a) for a in free}
            return sorted(free, key=lambda a: (hosts[a], a))[:n]
        # Every rank waits (none starts alone), and a rank is a whole job: report all N as long
        # work, so the adaptive target asks for N workers, not for what a short item would need.
        tasks.hold_back(n, RANK_S)
        if not said and time.monotonic() - began > WAIT_LINE_S:
            said = True
            room = "a free GPU" if needs.gpus else "a free thread"
            print(
                f"nbcluster: waiting for {n} workers with {room} to start the {n} ranks together "
                f"({len(free)} free now); Ctrl-C stops waiting",
                flush=True,
            )
        tick.wait(0.5)
    return None


def _free(client: Any, workers: dict[str, Any], eligible: list[str], resources: dict[str, float]) -> list[str]:
    """Those of `eligible` with a free thread and, for a job asking `resources`, those free too.

    A GPU worker has several threads (fractional ``--gpus`` items share its GPU): one running
    a ``--gpus 1`` item still has a free thread, but no free GPU, and a rank pinned there
    would wait inside Dask's scheduler while its peers had started.
    """
    busy = client.processing(eligible)
    used: dict[str, dict[str, float]] = {}
    if resources:

        def in_use(dask_scheduler: Any) -> dict[str, dict[str, float]]:  # on the scheduler, sent by value
            return {a: dict(ws.used_resources) for a, ws in dask_scheduler.workers.items()}

        used = client.run_on_scheduler(in_use)
    free, gone = [], ended(client, workers)
    for a in eligible:
        if a in gone or len(busy.get(a, ())) >= int(workers[a].get("nthreads", 1)):
            continue
        has, taken = workers[a].get("resources") or {}, used.get(a, {})
        if all(has.get(k, 0) - taken.get(k, 0) >= need for k, need in resources.items()):
            free.append(a)
    return free


def _stopping(tasks: RanksTasks) -> bool:
    return bool(tasks.stopping) or tasks.run_id in STOPS


def _stop_job(
    tasks: RanksTasks, running: dict[Any, int], where: dict[int, str], changed: threading.Event,
    reason: str, line: str,
) -> None:  # fmt: skip
    """Stop the whole job: ask every rank, wait out the grace, then end every rank's process.

    What a rank returns or raises meanwhile is its own outcome, never the job's cause: a
    rank whose peer stopped fails in its collective, which is this stop's echo.
    """
    began = time.monotonic()
    alive = set(_compat.workers(tasks.client))
    addresses = sorted(set(where.values()) & alive)
    with contextlib.suppress(Exception):  # a worker gone since: its rank is ended below anyway
        tasks.client.run(
            trial.stop_items, TRIAL_TOPIC_PREFIX + tasks.run_id, list(range(len(tasks.items))), reason,
            workers=addresses, on_error="return",
        )  # fmt: skip
    deadline = began + config.seconds("stop.grace")
    failed: list[int] = []
    while running and time.monotonic() < deadline and not tasks.stopping:
        changed.wait(LOOK_S)
        changed.clear()
        failed += _settle_done(tasks, running)
    stopped = sorted(running.values())
    if stopped or failed:  # a rank still out may wait in a collective; a failed one's torch state is suspect
        _stop(tasks, running, where, line)
    if stopped:
        line += f": {_stopped(stopped)}"
    CAUSES[tasks.run_id] = line


def _stopped(ranks: list[int]) -> str:
    return f"stopped rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _link(tasks: RanksTasks) -> Link:
    link = tasks.link
    assert link is not None  # a ranks run always has a cluster
    return link


def _host(address: str) -> str:
    from distributed.comm.addressing import get_address_host

    return str(get_address_host(address))


def _specs(client: Any, chosen: list[str], gate: str, *, gpus: bool) -> list[RankSpec]:
    """Each rank's place: torchrun's numbering, rank 0's host and a port free there."""
    master = _host(chosen[0])
    port = int(client.run(free_port, workers=[chosen[0]])[chosen[0]])
    own = client.run(own_device, workers=chosen) if gpus else {}
    hosts = [_host(a) for a in chosen]
    specs: list[RankSpec] = []
    for r, host in enumerate(hosts):
        same = [i for i, h in enumerate(hosts) if h == host]
        devices = [own.get(chosen[i]) for i in same]
        specs.append({
            "rank": r, "world_size": len(chosen), "local_rank": same.index(r), "local_world_size": len(same),
            "master_addr": master, "master_port": port, "host": host, "gate": gate, "gpus": gpus,
            "devices": ",".join(str(d) for d in devices) if gpus and all(devices) else None,
        })  # fmt: skip
    return specs


def _started_queue(client: Any, gate: str) -> Any:
    """The job's Dask queue on which each rank puts its rank once it started."""
    from distributed import Queue

    return Queue(f"{gate}-started", client=client)


def _open_gate(tasks: RanksTasks, queue: Any, gate: str, n: int, running: dict[Any, int],
               where: dict[int, str]) -> bool:  # fmt: skip
    """Wait for every rank to report on `queue`; open the gate (True), or close it and fail the job."""
    from distributed import Variable

    client = tasks.client
    started: set[int] = set()
    start_s = config.seconds("ranks.start")
    deadline = time.monotonic() + start_s
    why = ""
    while len(started) < n:
        if _stopping(tasks):
            why = "the job was stopped before every rank started"
            break
        if any(f.done() for f in running):  # a rank's task ended before the gate: it cannot load
            why = "a rank's task ended before the job started"
            break
        gone = _departed(tasks, running, where)
        if gone:
            why = f"rank {min(gone)}'s worker left before the job started"
            break
        if time.monotonic() > deadline:
            missing = sorted(set(range(n)) - started)
            why = (
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not start within "
                f"{start_s:g} s (their workers were busy): no rank ran; run the cell again"
            )
            break
        try:
            started.add(int(queue.get(timeout=LOOK_S)))
            started.update(int(r) for r in queue.get(batch=True))
        except TimeoutError:
            pass
    if len(started) == n:
        Variable(f"{gate}-go", client=client).set("go")
        return True
    Variable(f"{gate}-go", client=client).set(why)
    CAUSES[tasks.run_id] = why
    for future in list(running):
        if future.done():  # its own outcome (a context that could not load) says more
            tasks.settle_task(future)
            running.pop(future)
    # The ranks that started return at once; those that did not never will: cancel them.
    for future in list(running):
        tasks.withdraw(future)
        future.cancel()
    tasks.fail(list(running.values()), error_record(RankStopped(why), frames=False))
    running.clear()
    return False


def _follow(
    tasks: RanksTasks, running: dict[Any, int], where: dict[int, str], changed: threading.Event
) -> None:
    """Take the ranks in as they finish; the first failure stops the others.

    A rank's failure often shows first as a peer's echo of it (gloo's "Connection closed by
    peer" when the failing rank's worker died or its process group was torn down): while
    every failure seen is such an echo, the cause is looked for a second longer, among the
    departed workers and the ranks that finish meanwhile.
    """
    while running and not tasks.stopping:
        changed.wait(LOOK_S)
        changed.clear()
        if tasks.run_id in STOPS:
            _stop_job(tasks, running, where, changed, *STOPS[tasks.run_id])
            return
        failed = _settle_done(tasks, running)
        gone = _departed(tasks, running, where)
        if not failed and not gone:
            continue
        pause = threading.Event()
        for _ in range(4):
            if gone or not running or any(not _echo(tasks, r) for r in failed):
                break
            pause.wait(LOOK_S)
            failed += _settle_done(tasks, running)
            gone = _departed(tasks, running, where)
        if gone:
            line = f"rank {min(gone)}'s worker left while it ran (killed, crashed or out of memory)"
            for future, r in list(running.items()):
                if r in gone:
                    tasks.withdraw(future)
                    future.cancel()
                    tasks.fail(
                        [r], error_record(RankFailed(f"rank {r}'s worker left while it ran"), frames=False)
                    )
                    running.pop(future)
        else:
            first = next((r for r in failed if not _echo(tasks, r)), failed[0])
            error = tasks.state.errors[first]
            kind = error.type_name.rsplit(".", 1)[-1]
            said = error.message.splitlines()[0] if error.message else ""
            line = f"rank {first} failed ({kind}: {said})" if said else f"rank {first} failed ({kind})"
        stopped = sorted(running.values())
        _stop(tasks, running, where, line)
        if stopped:
            line += f"; {_stopped(stopped)}"
        CAUSES[tasks.run_id] = line
        return


ECHOES = ("closed by peer", "reset by peer", "broken pipe", "aborted", "connection refused")


def _echo(tasks: RanksTasks, r: int) -> bool:
    """Whether rank `r`'s error reads as a peer's failure seen from this rank."""
    message = tasks.state.errors[r].message.lower()
    return any(e in message for e in ECHOES)


def _settle_done(tasks: RanksTasks, running: dict[Any, int]) -> list[int]:
    """Take in the ranks that finished; those that failed, in rank order."""
    failed = []
    for future in [f for f in running if f.done()]:
        r = running.pop(future)
        tasks.settle_task(future)
        if r in tasks.state.errors:
            failed.append(r)
    return sorted(failed)


def _departed(tasks: RanksTasks, running: dict[Any, int], where: dict[int, str]) -> set[int]:
    """The running ranks whose worker is no longer in the cluster."""
    try:
        alive = set(_compat.workers(tasks.client))
    except Exception:
        return set()
    return {r for r in running.values() if where[r] not in alive}


def _stop(tasks: RanksTasks, running: dict[Any, int], where: dict[int, str], why: str) -> None:
    """Cancel the ranks still out; end every rank's worker process, the finished ones' too.

    A rank still out may be blocked in a collective; a rank that failed may have left torch's
    distributed state half made (a failed ``init_process_group`` poisons the next one in that
    process). Either way a fresh process, which its nanny starts, is the clean state. Workers
    already gone are left out: asking the scheduler to reach one waits out a connect timeout.
    """
    for future in running:
        tasks.withdraw(future)
        future.cancel()
    if running:
        tasks.fail(sorted(running.values()), error_record(RankStopped(f"stopped because {why}"), frames=False))
    running.clear()
    try:
        alive = set(_compat.workers(tasks.client))
    except Exception:  # the cluster gone: nothing to end
        return
    addresses = sorted(set(where.values()) & alive)
    if addresses:
        ENDED.update((tasks.client.scheduler.address, a) for a in addresses)  # later jobs do not pick them while listed
        # In a thread: a worker that died since the look would hold the call for a connect timeout.
        threads.spawn(_end, tasks.client, addresses, name="nbcluster-ranks-end")


def _end(client: Any, addresses: list[str]) -> None:
    """End these worker processes now."""
    with contextlib.suppress(Exception):  # a worker already gone: its rank is stopped anyway
        client.run(end_process, workers=addresses, on_error="return")  # its answer: the comm closed


def _forget(client: Any, gate: str, queue: Any) -> None:
    """Remove the job's gate from the scheduler, and let go of its start queue: the scheduler
    drops a queue once every handle on it is closed, and each rank closes its own."""
    from distributed import Variable

    with contextlib.suppress(Exception):  # the cluster gone: nothing left to remove
        Variable(f"{gate}-go", client=client).delete()
    with contextlib.suppress(Exception):
        if queue is not None:
            queue.close()
