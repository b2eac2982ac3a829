"""`distribute()`, `everywhere()`, `ranks()` and `wait()`: the API that `%%distribute` parses its
line into, and `Run`, the controls of one run.

The order of a run, and why:

1. Validate the options (`options.DistributeOptions`), parse the cell, evaluate
   `--over/--grid/--zip` in the user's namespace into a `Plan`, capture the free names
   (pickling each: a bad one is named here), connect to the cluster and check resource
   restrictions can be met (`Link`), and make the `Job` (a function or an item that cannot
   travel is named here). Any of these failing raises an `NbclusterError` with one message,
   and nothing has been sent or written. (`--everywhere` connects first: its items are the
   cluster's workers.)
2. Make the `Engine` (which owns the run's state) and the `Results` view (written to
   `--into` now, so a `--no-wait` variable exists at once), run the first `--local K`
   items in the kernel, ship large values (once per worker, cached) and the cell's
   context blob.
3. The engine's driver thread submits the batches, sized by the policy (`policy.py`),
   streams each finished batch into the state and resubmits failed items
   while `--retries` allow. The kernel's main thread only follows the run, so `--no-wait`
   is the same code with the main thread returning at once.
4. With `wait=True`, the main thread follows the `Results` (`results.follow`): it prints item
   output as it arrives, then one summary line and the first traceback if items failed.
   Ctrl-C / the stop button lands there: the engine stops the run (running batches return
   after their current item, with what they finished), the `Results` keep it all, and an
   `Interrupted` exception (a `KeyboardInterrupt`, so "Run all" stops) ends the cell with
   one line instead of a traceback.

The user's verbs on a run (`Results.cancel()`, `.retry()`) all land in `Run`, which hands
them to the engine and follows a retry in the kernel as step 4 does.

Python spells some of the magic's flags otherwise: what each item needs of a worker is one
``needs=Needs(...)``, where the run goes is one ``on=`` (a name, a `ClusterHandle` or a Dask
``Client``), and ``--everywhere`` and ``--ranks`` are functions of their own. The keywords
`distribute` took in the release before (0.1.0) still work for one release, each with a
`FutureWarning` of one line naming the new spelling (`OLD`); an old keyword given with its
new one is refused, as the two could disagree. `ranks` and `everywhere` are newer: they
have no old keywords.
"""

from __future__ import annotations

import builtins
import difflib
import functools
import inspect
import secrets
import sys
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from nbcluster import _current
from nbcluster.cluster.handle import ClusterHandle
from nbcluster.errors import BadArgument, Interrupted, NbclusterError
from nbcluster.journal.runs import attach_checkpoints
from nbcluster.journal.store import Resumption, fingerprint, label, prepare
from nbcluster.persist import handles
from nbcluster.run import ranks as rank_jobs
from nbcluster.run.capture import Capture, Job, capture
from nbcluster.run.cell import Cell, Plan, human, mentions_trials, plan
from nbcluster.run.engine import Engine
from nbcluster.run.options import DistributeOptions
from nbcluster.run.results import Results, follow, interrupted, report
from nbcluster.run.state import DONE, FAILED, PENDING
from nbcluster.run.transport import Link, Needs
from nbcluster.run.trials import Trials

#: The keywords of the release before -> how to spell them now (`{fn}` is the function's name).
OLD = {
    "gpus": "{fn}(needs=nbcluster.Needs(gpus=N))", "cpus": "{fn}(needs=nbcluster.Needs(cpus=N))",
    "cpu_only": "{fn}(needs=nbcluster.Needs(cpu_only=True))", "cluster": '{fn}(on="NAME")',
    "client": "{fn}(on=client)", "everywhere": "nbcluster.everywhere(body)",
}  # fmt: skip
#: Old keywords with no new spelling: they go, and what replaces them is said instead.
GOING = {"first_line": "only the magic needs it (a cell's body starts on the cell's line 2); drop it"}
#: What `ranks(**options)` passes on as it is: its options, and those a job refuses
#: (`--ranks 2 ... cannot be combined with --over`), for that one-line message.
RANKS_PASS = ("into", "wait", "seed", "timeout", "progress", "over", "grid", "zip", "retries", "batch", "local",
              "persist", "resume", "objective", "stopper")  # fmt: skip


def distribute(body: str | Callable[..., Any], *, over: Any = None, grid: Any = None, zip: Any = None,
               into: str | None = None, needs: Needs | Mapping[str, Any] | None = None, on: Any = None,
               retries: int = 0, batch: int | str = "auto", wait: bool = True, seed: int | None = None,
               local: int | str | bool = 0, persist: bool = False, resume: bool = False, objective: str | None = None,
               stopper: Any = None, timeout: str | float | None = None, namespace: dict[str, Any] | None = None,
               progress: Callable[[Results], None] | None = None, **old: Any) -> Results:  # fmt: skip
    """Run a cell body or a function on the cluster, once per item: `%%distribute` in Python.

    Each item is one call (or one run of the cell) on a worker; small items are batched
    into one task, and results stream back as they finish. The options are those of
    `%%distribute`, with the same defaults and the same checks; what belongs together is
    one argument: what each item needs of a worker is ``needs=Needs(...)`` (the flags
    ``--gpus``, ``--cpus``, ``--cpu-only``) and where the run goes is ``on=`` (``--cluster``).
    ``--no-wait`` is ``wait=False``. Once on every worker is `everywhere`; one job of
    several ranks is `ranks`.

    Parameters
    ----------
    body : str or callable
        Cell source, run with the item's names bound; an item's result is the value of its
        last expression. Or a function, called as ``body(x)`` for `over`, ``body(a, b)`` for
        a tuple target such as ``"a, b in pairs"``, ``body(**params)`` for `grid` and `zip`,
        and ``body()`` otherwise; with `seed`, also ``seed=`` the item's seed.
    over : str or iterable, optional
        ``"x in ITERABLE"``: one item per element, evaluated in `namespace`. For a function
        body, also a plain iterable.
    grid : str or dict of lists, optional
        ``"lr=[...], depth=[...]"``: every combination of the named lists (the first name
        varies slowest).
    zip : str or dict of lists, optional
        ``"a=[...], b=[...]"``: the named lists walked in step (the same length each).
    into : str, optional
        A variable name: the `Results` are stored there as soon as the run starts.
    needs : Needs or dict, optional
        What each item needs of a worker: ``Needs(gpus=1)`` runs items only on GPU workers,
        ``Needs(cpus=2)`` gives each two cores of a CPU worker, ``Needs(cpu_only=True)``
        keeps them off GPU workers. A dict of the same fields works too.
    on : str, ClusterHandle or distributed.Client, optional
        Where to run: a cluster's name, a cluster's handle (from `start` or `connect`), or a
        Dask client; default the current cluster.
    retries : int, default 0
        Run a failing item again, up to this many more times.
    batch : int or "auto", default "auto"
        Items per task; ``"auto"`` measures the items and batches small ones (the first
        result still arrives after about one item's time).
    wait : bool, default True
        False: return at once; the results fill in while you work (`wait` blocks).
    seed : int, optional
        Each item gets its own reproducible ``seed`` (a variable in a cell, a keyword for a
        function), derived from this and the item's index.
    local : int or bool, default 0
        Run the first `local` items here in this process first, to debug quickly; True
        runs every item here (no cluster needed).
    persist : bool, default False
        Keep each result in the memory of the worker that made it: the values of the
        results are then `Handle`s (``results.gather()`` brings them here), and `into`
        must name them. Not with `local`.
    resume : bool, default False
        Pick up the last run of the same cell on the same items and inputs (in this kernel
        or an earlier one) from its journal: its finished items are taken as they are and
        only the others run. Without a journal of that run, everything runs.
    objective : str, optional
        ``"NAME:min"`` or ``"NAME:max"``: the metric (reported with `nbcluster.report`, or
        the item's result) that ranks the trials in the live table and `Results.best`.
    stopper : str or Stopper, optional
        Stop losing trials early from their reports of `objective`: ``"asha"``,
        ``"median"``, one with parameters (``"asha(grace=1, eta=3, max_t=27)"``), or your
        own object with a ``decide(trial, step, score)`` method (`nbcluster.Stopper`).
        Items then run one a task. See the user guide's "Trials" page.
    timeout : str or float, optional
        Stop an item that runs longer than this: seconds, or ``"90s"``, ``"2h"``. It is asked
        first, then forced after ``nbcluster.stop.grace``; it ends *timed out*.
    namespace : dict, optional
        Where `over`, `grid`, `zip` are evaluated and the cell's free names are looked up;
        default: the caller's globals and locals. `into` is written here (default: the
        caller's globals).
    progress : callable, optional
        Called with the `Results` as the run starts (once its first items are on their way)
        and after each change (as by `Results.subscribe`): a progress display, such as
        ``nbcluster.widgets.progress_hook()``.
    **old
        The keywords of the release before, for one release more, each warning with one
        line (a `FutureWarning`) that names its new spelling: ``gpus``, ``cpus`` and
        ``cpu_only`` (now `needs`), ``cluster`` and ``client`` (now `on`), ``everywhere``
        (now `everywhere`) and ``first_line`` (the magic's own).

    Returns
    -------
    Results
        In the order of the items; complete unless ``wait=False``.

    Raises
    ------
    nbcluster.errors.BadArgument
        An option that is not valid (or not an option), with what to write instead.
    nbcluster.errors.NoCluster
        No cluster to run on (none current, and no `on` given).

    Examples
    --------
    >>> import nbcluster
    >>> cluster = nbcluster.start(workers=2)
    >>> squares = nbcluster.distribute(lambda x: x * x, over=range(5))
    >>> squares.values()
    [0, 1, 4, 9, 16]

    A cell's source, with the notebook's variables it reads sent along, on a cluster named
    by its handle, each item with a core of its own:

    >>> offset = 10
    >>> nbcluster.distribute("x + offset", over="x in range(3)", on=cluster, needs=nbcluster.Needs(cpus=1)).values()
    nbcluster: sent offset (5 B) with the cell
    [10, 11, 12]
    """
    return launch(body, over=over, grid=grid, zip=zip, into=into, retries=retries, batch=batch, wait=wait, seed=seed,
                  local=local, persist=persist, resume=resume, objective=objective, stopper=stopper, timeout=timeout,
                  namespace=namespace, progress=progress, **_spell(distribute, old, needs, on))  # fmt: skip


def everywhere(body: str | Callable[..., Any], *, needs: Needs | Mapping[str, Any] | None = None, on: Any = None,
               into: str | None = None, wait: bool = True, seed: int | None = None, retries: int = 0,
               namespace: dict[str, Any] | None = None, progress: Callable[[Results], None] | None = None) -> Results:  # fmt: skip
    """Run a cell body or a function once on every worker: ``%%distribute --everywhere``.

    For set-up code: an import, a file fetched, a model loaded into `worker_local`. The
    workers are those of the cluster when the call starts (with `needs`, only those that
    have what it asks, such as the GPU workers); a worker that joins later does not run it.
    These runs are not journaled: their items are the workers of now, so there is nothing
    for a later ``resume`` to pick up.

    Parameters
    ----------
    body : str or callable
        Cell source, or a function called with no arguments (``seed=`` with `seed`).
    needs : Needs or dict, optional
        Run only on the workers that have this for it, as in `distribute`.
    on : str, ClusterHandle or distributed.Client, optional
        Where to run, as in `distribute`; default the current cluster.
    into : str, optional
        A variable name: the `Results` are stored there as soon as the run starts.
    wait : bool, default True
        False: return at once; the results fill in while you work.
    seed : int, optional
        Each worker's run gets its own reproducible ``seed``, derived from this.
    retries : int, default 0
        Run a failing worker's body again, up to this many more times.
    namespace : dict, optional
        Where a cell's free names are looked up; default: the caller's variables.
    progress : callable, optional
        A progress display, as in `distribute`.

    Returns
    -------
    Results
        One value per worker, in the order of the workers' addresses as the scheduler
        listed them; ``results.params`` names each item's worker.

    Raises
    ------
    nbcluster.errors.BadArgument
        When the cluster has no worker (that has what `needs` asks) right now.

    Examples
    --------
    >>> def where():
    ...     import os
    ...     return os.getpid()
    >>> len(nbcluster.everywhere(where)) == len(nbcluster.current().client.ncores())
    True
    """
    return launch(body, everywhere=True, into=into, wait=wait, seed=seed, retries=retries, namespace=namespace,
                  progress=progress, **_spell(everywhere, {}, needs, on))  # fmt: skip


def ranks(fn: str | Callable[..., Any], n: int, *, needs: Needs | Mapping[str, Any] | None = None, on: Any = None,
          namespace: dict[str, Any] | None = None, **options: Any) -> Results:  # fmt: skip
    """Run `fn` as `n` ranks of one job, as torchrun would: ``%%distribute --ranks N`` in Python.

    The `n` ranks start together or not at all, each on a worker process of its own that
    has a free thread (while fewer are free, a line says what the job waits for, and an
    adaptive cluster grows). Each rank's environment has ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` (rank 0's host) and
    ``MASTER_PORT`` (a port free there), so ``torch.distributed.init_process_group()``
    works with no arguments; `nbcluster.rank` and `nbcluster.world_size` say the same to
    code that is not torch. The worker's environment is put back, and torch's default
    process group destroyed, when the rank ends.

    When a rank fails or its worker dies, the others are stopped within seconds (their
    worker processes are ended, so none hangs in a collective), and one line names the
    rank and the cause. Ctrl-C stops every rank.

    Parameters
    ----------
    fn : callable or str
        A function called with no arguments in each rank (or cell source).
    n : int
        The number of ranks.
    needs : Needs or dict, optional
        What each rank needs of its worker, as in `distribute`: ``Needs(gpus=1)`` gives
        each rank a GPU worker (for NCCL).
    on : str, ClusterHandle or distributed.Client, optional
        Where to run, as in `distribute`; default the current cluster.
    namespace : dict, optional
        For cell source: where its free names are looked up; default the caller's.
    **options : Any
        `distribute`'s other options that a job takes: ``into``, ``wait``, ``seed``,
        ``timeout``, ``progress``.

    Returns
    -------
    Results
        One value per rank, in rank order (``results[0]`` is rank 0's); each rank's
        output in ``results.output(rank=r)``, its error in ``results.errors``.

    Raises
    ------
    nbcluster.errors.BadArgument
        For `n` larger than the cluster can ever hold, or an option that makes independent
        items (``over``, ``grid``, ``zip``, ``persist``, ...).

    Examples
    --------
    >>> def where():
    ...     import os
    ...     return os.environ["RANK"], os.environ["WORLD_SIZE"]
    >>> nbcluster.ranks(where, n=2).values()
    [('0', '2'), ('1', '2')]
    """
    return launch(fn, ranks=n, namespace=namespace, **_spell(ranks, options, needs, on, RANKS_PASS))


def notice(fn: str, old: str) -> str:
    """The one line that an old keyword of `fn` warns with.

    Parameters
    ----------
    fn : str
        The function it was given to: ``distribute`` or ``ranks``.
    old : str
        The old keyword, a key of `OLD` or `GOING`.

    Returns
    -------
    str
        ``FN(OLD=...)` is now `NEW`; the old spelling goes in the next release.``

    Examples
    --------
    >>> notice("distribute", "gpus")
    '`distribute(gpus=...)` is now `distribute(needs=nbcluster.Needs(gpus=N))`; the old spelling goes in the next release.'
    """
    if old in GOING:
        return f"`{fn}({old}=...)` goes in the next release: {GOING[old]}."
    return f"`{fn}({old}=...)` is now `{OLD[old].format(fn=fn)}`; the old spelling goes in the next release."


def _spell(fn: Callable[..., Any], given: dict[str, Any], needs: Any, on: Any,
           known: Collection[str] = ()) -> dict[str, Any]:  # fmt: skip
    """`launch`'s keywords from a public function's ``needs=``, ``on=`` and old keywords.

    Each old keyword of `distribute` in `given` warns with its `notice` (a `FutureWarning`
    pointing at the public function's caller) and means what it meant; `known` (the options
    `ranks` passes on, which has no old keywords) are passed on as they are. A keyword `fn`
    does not take is one line naming the closest one.
    """
    name = fn.__name__
    for key in (key for key in given if key not in known):
        if known or (key not in OLD and key not in GOING):
            match = difflib.get_close_matches(key, [*inspect.signature(fn).parameters, *known, *OLD], n=1)
            hint = "" if not match else f"`{OLD[match[0]].format(fn=name)}`" if match[0] in OLD else repr(match[0])
            raise BadArgument(f"{name}() has no option {key!r}" + (f"; did you mean {hint}?" if hint else ""))
        warnings.warn(notice(name, key), FutureWarning, stacklevel=3)
    out = dict(given)
    for olds, new, value in (("gpus", "cpus", "cpu_only"), "needs", needs), (("cluster", "client"), "on", on):
        if (given_old := [key for key in olds if key in out]) and value is not None:
            raise BadArgument(f"give {new}= only: {given_old[0]}= is its old spelling")
        if not given_old:
            out.update(_needs(value)._asdict() if new == "needs" else _target(value))
    return out


def _needs(needs: Any) -> Needs:
    """``needs=``: a `Needs`, a dict of its fields, or None; anything else is one line."""
    if needs is None or isinstance(needs, Needs):
        return needs or Needs()
    if not isinstance(needs, Mapping):
        raise BadArgument("needs= takes nbcluster.Needs(gpus=..., cpus=..., cpu_only=...) or a dict of them, "
                          f"got {type(needs).__name__}")  # fmt: skip
    if unknown := sorted(set(needs) - set(Needs._fields), key=str):
        match = difflib.get_close_matches(str(unknown[0]), Needs._fields, n=1)
        hint = f"; did you mean {match[0]!r}?" if match else ""
        raise BadArgument(f"needs= takes {', '.join(Needs._fields)}; {unknown[0]!r} is not one of them{hint}")
    return Needs(**needs)


def _target(on: Any) -> dict[str, Any]:
    """``on=``: a cluster's name or handle (``cluster``), or a Dask client (``client``)."""
    if on is None or isinstance(on, str | ClusterHandle):
        return {"cluster": on, "client": None}
    from distributed import Client

    if isinstance(on, Client):
        return {"cluster": None, "client": on}
    raise BadArgument(f"on= takes a cluster's name, a ClusterHandle (nbcluster.start(), nbcluster.current()) "
                      f"or a distributed.Client, got {type(on).__name__}")  # fmt: skip


def launch(body: str | Callable[..., Any], *, namespace: dict[str, Any] | None, client: Any = None,
           progress: Callable[[Results], None] | None = None, first_line: int = 1, **flags: Any) -> Results:  # fmt: skip
    """Start a run from the options as `%%distribute`'s flags name them: what the magic calls.

    The public functions (`distribute`, `everywhere`, `ranks`) spell these in Python and
    call this.

    Parameters
    ----------
    body : str or callable
        As in `distribute`.
    namespace : dict or None
        Where names are looked up and `into` is written. None for a public function's
        ``namespace=None``: the variables of that function's caller (two frames up), and
        `into` written to the caller's globals.
    client : distributed.Client, optional
        The client `distribute`'s ``on=`` gave.
    progress : callable, optional
        As in `distribute`.
    first_line : int, default 1
        The line number of the body's first line, for tracebacks (2 in a cell magic, whose
        first line is ``%%distribute``).
    **flags
        The options, by the declaration's names (`options.DistributeOptions`, each flag's
        ``dest``), with its defaults; ``cluster`` may also be a `ClusterHandle`.

    Returns
    -------
    Results
        As `distribute`.
    """
    if not isinstance(body, str) and not callable(body):
        raise BadArgument(f"distribute() needs cell source (a str) or a function, got {type(body).__name__}")
    if namespace is None:
        caller = sys._getframe(2)
        namespace, home = {**caller.f_globals, **caller.f_locals}, caller.f_globals
    elif hasattr(namespace, "__getitem__"):
        home = namespace
    else:
        raise BadArgument("namespace= needs a dict of the notebook's variables")
    o = DistributeOptions(**flags)
    run_id = "0" + secrets.token_hex(6)[1:]  # Dask's key_split drops an all-letters word: a digit keeps it
    cell = Cell.parse(body, filename=f"<distribute-{run_id}>", first_line=first_line) if isinstance(body, str) else None
    handle = None if o.cluster is None or isinstance(o.cluster, str) else o.cluster  # `on=` a handle: that cluster
    link = Link(Needs(o.gpus, o.cpus, o.cpu_only), client=client, cluster=handle.name if handle else o.cluster,
                find=_current.handle_for if handle is None else lambda _: handle)  # fmt: skip
    if o.ranks is not None:  # each item `(r,)` binds `rank`, in messages only
        items = Plan("ranks", [(r,) for r in range(o.ranks)], ("rank",))
    elif o.everywhere:
        items = Plan("everywhere", list(link.eligible_now()))
        if not items.items:
            raise BadArgument("--everywhere: the cluster has no workers right now; scale it up first")
    else:
        items = plan(over=o.over, grid=o.grid, zip=o.zip, evaluate=functools.partial(_evaluate, namespace))
    n_local = len(items) if o.local == "all" or o.local is True else min(int(o.local), len(items))
    remote = n_local < len(items)
    bound = [*items.names, *(["seed"] if o.seed is not None else [])]
    captured = capture(cell.free_names(bound), namespace, pickle_values=remote) if cell else Capture()
    given = () if isinstance(items.items, range) else items.items  # a range holds no handle
    reads = [*captured.held.values(), *(v for item in given for v in (item if type(item) is tuple else (item,))
                                        if isinstance(v, handles.Handle))]  # items' handles: one tuple level deep
    if reads and n_local:
        raise BadArgument("this cell reads persisted results, which stay on the workers: drop --local, "
                          "or .gather() them first")  # fmt: skip
    if reads:  # before connecting: a stopped cluster's handle says so, not that no cluster is current
        handles.check(reads)
    if remote:
        link.open()
    if reads and remote:  # a plain run never calls into handles.py
        handles.check(reads, link.client)
    tracker = None
    if not o.everywhere and (o.objective or o.stopper is not None or o.timeout is not None
                             or mentions_trials(cell or body)):  # fmt: skip
        tracker = Trials(run_id, o.rules(), len(items), items.params)
    if o.ranks is not None:
        rank_jobs.check(o.ranks, link)
    # Trials, and a run that reads persisted results, run one item a task (unless --batch says otherwise for trials).
    job = Job(items, cell=cell, fn=None if cell is not None else body, capture=captured, seed=o.seed, retries=o.retries,
              batch=1 if reads or (tracker and o.batch == "auto") else o.batch, sent_from=n_local if remote else None,
              persist=o.persist, reads_handles=bool(reads), trial=tracker.spec if tracker else None)  # fmt: skip
    engine = Engine(job, run_id, link, local_only=not remote)
    taken = _journal(engine, resume=o.resume, journaled=not (o.everywhere or (o.persist and reads)))
    run = Run(engine)
    results = Results(engine.state, items, run, run_id=run_id, label=o.into)
    if tracker is not None:
        if o.ranks is not None:  # a stop of any rank stops the job; rank 0's curve is drawn
            rank_jobs.attach(tracker, run_id)
        _follow_trials(tracker, run, results, link.client if remote else None, taken)
    if o.persist:
        handles.RUNS[run_id] = results
    if o.into is not None:
        home[o.into] = results
    run.start(results, n_local, o.wait, skip=taken, progress=progress)
    if o.ranks is not None and o.wait and (line := rank_jobs.summary(run_id)):
        print(f"nbcluster: {line}", file=sys.stderr)
    return results


def _journal(engine: Engine, *, resume: bool, journaled: bool) -> set[int]:
    """Open the run's journal; with `resume`, fill the state with an earlier run's items (those).

    `journaled` False (`--everywhere`, or a `--persist` run reading persisted handles): no journal.
    """
    job, link = engine.job, engine.link
    ident = fingerprint(job.plan, job.cell, job.fn, job.seed, job.capture) if journaled else None
    if job.trial is not None and ident is not None:
        try:  # a trial's checkpoints are keyed by the run's identity (`journal/runs.py`)
            attach_checkpoints(job.trial, ident, resume=resume)
        except OSError as e:
            print(f"nbcluster: checkpoints cannot be kept ({e}); the items' checkpoints stay in their workers' memory")
    # A --persist journal names its cluster by its name, else its scheduler's address.
    cluster = None if link is None or link.client is None else (
        getattr(link.handle, "name", None) or link.cluster or str(link.client.scheduler.address))  # fmt: skip
    try:
        chosen = prepare(ident, len(job.plan), label(job.cell, job.fn), resume=resume, persist=job.persist,
                         client=engine.client, cluster=cluster)  # fmt: skip
    except Exception as e:  # a journal must never stop a run
        print(f"nbcluster: the run journal could not be used ({type(e).__name__}: {e}): running without it")
        chosen = Resumption()
    if job.plan.mode == "ranks" and chosen.values and not rank_jobs.finished(chosen.values, len(job.plan)):
        # A job runs whole or not at all: its ranks start again together, from its checkpoint.
        chosen.values, chosen.outputs = {}, {}
        chosen.line = (f"nbcluster: --resume runs the job's {len(job.plan)} ranks again together (it did not "
                       "finish, and a job never runs in part); they load its last checkpoint")  # fmt: skip
    if chosen.line:
        print(chosen.line)
    if indices := sorted(chosen.values):
        engine.state.deliver(indices, [chosen.values[i] for i in indices], {}, chosen.outputs)  # it takes those of `indices`
    engine.journal_to(chosen.writer)
    engine.publish = chosen.publish
    return set(chosen.values)


def _follow_trials(tracker: Trials, run: Run, results: Results, client: Any, resumed: set[int]) -> None:
    """Listen to a trial run's reports from its start to its end (`trials.py`)."""
    state = run.engine.state

    def wake() -> None:  # a trial printed something: wake the cell waiting on the state
        with state.changed:
            state.changed.notify_all()

    tracker.items.ended = lambda i: state.status[i] != PENDING
    tracker.items.ran = lambda i: state.status[i] in (DONE, FAILED) and i not in resumed
    tracker.open(client)
    results._trials = run.trials = tracker
    tracker.printed.wake = wake
    state.on_end(tracker.settle)  # before a waiting cell sees the run end: its last reports are in
    state.add_done_callback(tracker.closer())


class Run:
    """One run's controls: start, follow, cancel, retry; `Results` hands its verbs here.

    It holds no reference to the run's `Results`, which hold it: the notebook's variable is
    what keeps a run alive, so ``del`` of it frees the run (and a ``--persist`` run's values)
    at once, not at a garbage collection. A verb that needs the view is given it.

    Parameters
    ----------
    engine : Engine
        The run's engine, which owns its state and talks to Dask.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.trials: Trials | None = None  # a trial run's reports and stops (`trials.py`)

    @property
    def persist(self) -> bool:
        """The values stay on the workers, behind handles (`--persist`): what `Results` asks."""
        return self.engine.job.persist

    def start(self, results: Results, n_local: int, wait: bool, skip: Collection[int] = (),
              progress: Callable[[Results], None] | None = None) -> None:  # fmt: skip
        """Run the first `n_local` items here, then send the rest; follow them if `wait`.

        When an item run here fails, nothing is sent: the rest count as cancelled, and the
        cell shows the failure (`--local K` is for that). Otherwise the values are shipped,
        a line says what was sent, and a driver thread submits the batches.

        Parameters
        ----------
        results : Results
            The run's view: what the cell follows, and a failure names.
        n_local : int
            How many of the first items run in the kernel (``--local K``).
        wait : bool
            Follow the run in the cell (output, summary, first failure) until it finishes.
        skip : collection of int
            Items already done (taken from a journal by ``--resume``): not run again.
        progress : callable, optional
            `distribute`'s ``progress``: called with the results once the first batches are on
            their way (its set-up, a live view's, is then not in their way), and after each
            change; before the items run here, when some do.

        Raises
        ------
        nbcluster.errors.Interrupted
            Ctrl-C while the items run here or before anything was submitted, or while
            following: the results keep what finished.
        nbcluster.errors.ClusterUnreachable
            When the cell's values cannot be sent to the workers.
        nbcluster.errors.ClusterLost, nbcluster.errors.ClusterCannotRun
            While following: the cluster went away, or cannot run the items (`follow`).
        """
        engine = self.engine
        local = [i for i in range(n_local) if i not in skip]
        rest: Sequence[int] = range(n_local, len(results))  # a range: no list of a million ints
        rest = [i for i in rest if i not in skip] if skip else rest
        if progress is not None and (local or not rest):  # it shows the items run here as they run
            results.subscribe(progress)
            progress(results)
            progress = None
        try:
            if (local and not engine.run_local(local)) or not rest:  # `rest` is empty for a run all in the kernel
                # A failure in the kernel stops the fan-out: that is what --local K is for.
                engine.finish()
                report(results)
                return
            notes = engine.ship()
        except BaseException as e:
            # Interrupted (or failed) before anything was submitted: the results end here.
            engine.finish()
            if isinstance(e, KeyboardInterrupt):
                raise interrupted(results) from None
            raise
        cap = engine.job.capture
        sent = f"sent {', '.join(cap.values)} ({human(sum(map(len, cap.values.values())))}) with the cell"
        imported = f"import {', '.join(sorted(set(cap.modules.values())))} on the workers"
        if parts := [*([sent] if cap.values else []), *([imported] if cap.modules else []), *notes]:
            print("nbcluster: " + "; ".join(parts))
        engine.start(rest)
        if progress is not None:
            try:
                results.subscribe(progress)
                progress(results)
            except BaseException as e:  # the run is going: it stops, as it would at Ctrl-C while followed
                results.cancel()
                if isinstance(e, KeyboardInterrupt):
                    raise interrupted(results) from None
                raise
        if wait:
            try:
                follow(results)
            finally:
                if self.trials is not None:  # say if the objective was never reported
                    self.trials.close()
                    if missing := self.trials.unknown_objective():
                        print(missing)

    def cancel(self) -> None:
        """Stop the run, keeping every item that finished (`Engine.cancel`).

        A trial run's running items are asked to stop, then forced after the grace
        (`Trials.stop_all`).
        """
        if self.trials is not None:
            self.trials.stop_all()
        self.engine.cancel()

    def retry(self, results: Results, wait: bool) -> None:
        """Run the failed and cancelled items again, following them if `wait`.

        Parameters
        ----------
        results : Results
            The run's view, which the cell follows.
        wait : bool
            Follow the retry in the cell until it finishes; False returns once it started.

        Raises
        ------
        nbcluster.errors.NbclusterError
            While the run is still going: wait for it or cancel it first.
        nbcluster.errors.Interrupted
            Ctrl-C while following the retry.
        """
        if not results.done:
            raise NbclusterError("the run is still going: wait for it (or cancel it) before retrying")
        if self.trials is not None:  # the retried items report too
            self.trials.reopen(self.engine.state.unfinished())
        started = self.engine.retry()
        if self.trials is not None:
            self.engine.state.add_done_callback(self.trials.closer())
        if started and wait:
            follow(results)


def wait(target: Results | str, *, namespace: dict[str, Any] | None = None) -> Results:
    """Block until a ``--no-wait`` run finishes, printing its output and failures here.

    Parameters
    ----------
    target : Results or str
        The run's `Results`, or the name of the variable holding them (what
        ``%distribute wait NAME`` passes).
    namespace : dict, optional
        Where a name is looked up; default: the caller's globals.

    Returns
    -------
    Results
        `target`, finished.

    Raises
    ------
    nbcluster.errors.BadArgument
        If the name is not defined, or does not hold `Results`.

    Examples
    --------
    >>> import time
    >>> def slow(x):
    ...     time.sleep(0.01)
    ...     return x
    >>> runs = nbcluster.distribute(slow, over=range(100), wait=False)
    >>> nbcluster.wait(runs).ok
    True
    """
    if isinstance(target, str):
        name, ns = target, namespace if namespace is not None else sys._getframe(1).f_globals
        if name not in ns:
            raise BadArgument(f"`{name}` is not defined: give the --into name of a --no-wait cell")
        if not isinstance(target := ns[name], Results):
            raise BadArgument(f"`{name}` is a {type(target).__name__}, not the results of a %%distribute cell")
    follow(target)
    return target


def _evaluate(namespace: Any, expression: str, flag: str) -> Any:
    """`--over/--grid/--zip`'s `expression` evaluated in the user's `namespace`; one line if it fails."""
    try:
        code = compile(expression, f"<--{flag}>", "eval")
    except SyntaxError as e:
        raise BadArgument(f"--{flag}: {expression!r} is not a Python expression ({e.msg})") from None
    # A copy as globals: eval would add __builtins__ to the user's dict, and
    # comprehensions in the expression need the names as globals to see them.
    try:
        return eval(code, {"__builtins__": builtins, **namespace})
    except Exception as e:
        raise BadArgument(f"--{flag}: evaluating {expression!r} failed: {type(e).__name__}: {e}") from None


__all__ = ["Interrupted", "distribute", "everywhere", "launch", "ranks", "wait"]
