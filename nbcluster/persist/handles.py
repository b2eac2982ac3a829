"""`Handle`: one `--persist` result, left in the memory of the worker that made it.

A handle is a Dask future (the key `persist-<run id>-<n>` of the item's own task,
`worker/held.py`) and the worker's description of the value (`_wire.HeldValue`: type,
shape, size), made where the value is, so that showing a handle moves nothing. Which
worker holds it is asked of the scheduler when it is shown (it changes: Dask moves and
recomputes keys), never cached.

Lifetime is Dask's: the value lives while some future for its key does. A handle holds
the only future the kernel has; so `del`, rebinding, or `release()` of the last handle to a
value lets Dask free it. A handle whose cluster was stopped (its client closed) or whose
value was released says so in one line (`HandleGone`) when it is used.

`check(values, client)` is what a run calls before it sends anything: every handle it
reads (`--over "x in NAME"`, `--zip`, captured by name) must belong to the run's cluster.
The engine reads a finished persisted item's report (`held_report`: its output, error and
the value's description; the value stays on its worker) and makes its handle (`handle_of`).

Journaled runs (`journal.py`): a journaled `--persist` run also *publishes* each handle's key
on the scheduler as a Dask dataset of its own (`publish`, named ``nbcluster-<journal>-<item>``),
so the workers keep the value when the kernel dies and its client with it. Lifetime in the
kernel that holds the handle is unchanged: releasing the handle (`del`, rebinding,
`release()`) unpublishes its dataset too (a finalizer; the calls are queued, in order,
and sent from the client's event loop: `_send`). A kernel that dies runs no finalizer
(nor does one that exits: a restarted kernel can resume too), so its datasets stay until a new kernel's
``--resume`` adopts them (`adopt`: it takes the keys some worker still holds, as handles
that own the datasets from then on), ``%cluster runs ID --forget`` drops them (`unpublish`), or
the cluster stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypedDict

from nbcluster import _compat
from nbcluster._wire import HeldValue
from nbcluster.errors import BadArgument, HandleGone
from nbcluster.run.cell import human
from nbcluster.worker import Slot
from nbcluster.worker.held import holdings, report_for, report_of

#: The `--into` name of each --persist run still alive in this kernel, by run id (for status).
RUNS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

GONE = "the cluster that held it was stopped; run the cell that made it again (on a running cluster)"


class Recipe(TypedDict):
    """What a journal keeps of a persisted item: where its value is, never the value."""

    key: str  # the Dask key holding the value
    dataset: str  # the dataset that keeps the key on the scheduler without a client
    held: HeldValue  # the worker's description of the value, for the handle's repr
    params: str  # the item's parameters, "x=3" (`plan.describe`), for people reading the journal


class Handle:
    """A value held on a worker; see the module docstring."""

    __slots__ = ("__weakref__", "_dataset", "_future", "_published", "held", "index", "made_on")
    #: Whether this kernel ever made a handle: until then no cell's output can hold one.
    made: ClassVar[bool] = False

    def __init__(self, future: Any, held: HeldValue, index: int, made_on: str | None = None):
        # `index`: the item of the run that made it; `made_on`: the address of the worker that made
        # it, where known (a placement hint); `_published` unpublishes `_dataset` (`publish`).
        self._future, self.held, self.index, self.made_on = future, held, index, made_on
        Handle.made = True
        self._published: weakref.finalize[Any, Any] | None = None
        self._dataset = ""

    def recipe(self, params: str = "") -> Recipe | None:
        """What a journal keeps of this handle: its key, dataset, description and parameters.

        Parameters
        ----------
        params : str
            The item's parameters as messages show them (`plan.describe`).

        Returns
        -------
        Recipe or None
            The recipe; None when the handle is not published (journaling off) or released.
        """
        if self._published is None or not self._published.alive:  # not published, or released
            return None
        return {"key": self.key, "dataset": self._dataset, "held": self.held, "params": params}

    @property
    def future(self) -> Any:
        """The Dask future of the value (for hand-written Dask work); one line if it is gone."""
        if self.gone is not None:
            raise HandleGone(f"item {self.index}'s value is gone: {self.gone}")
        return self._future

    @property
    def key(self) -> str:
        """The value's Dask key, ``persist-<run id>-<n>``; "" once released."""
        return str(self._future.key) if self._future is not None else ""

    @property
    def nbytes(self) -> int:
        """Bytes the worker holds for it (Dask's `sizeof`, measured on the worker)."""
        return 0 if self._future is None else self.held["nbytes"]

    @property
    def gone(self) -> str | None:
        """Why the value cannot be used any more, or None."""
        if self._future is None:
            return "it was released"
        if self._future.client.status != "running":
            return GONE
        # Not "lost": Dask's client says that from a worker's death until its lineage has made
        # the value again, and `result()` waits for that; "error": that recompute failed.
        if self._future.status in ("cancelled", "error"):
            return "no worker holds it any more and Dask could not recompute it; run the cell that made it again"
        return None

    def where(self) -> str | None:
        """The name of the worker holding the value now (asked of the scheduler), else None.

        Returns
        -------
        str or None
            The worker's name (its address when it has none); None when the value is gone, no
            worker holds it at the moment (Dask is recomputing it), or the scheduler cannot be
            asked.
        """
        with contextlib.suppress(Exception):  # gone, or the scheduler going away as we ask: no worker to name
            client = self.future.client
            holders = client.who_has([self._future]).get(self._future.key)
            return str(_compat.workers(client).get(holders[0], {}).get("name", holders[0])) if holders else None
        return None

    def gather(self) -> Any:
        """Bring the value to the kernel.

        Returns
        -------
        Any
            The value, copied from its worker.

        Raises
        ------
        nbcluster.errors.HandleGone
            When the value is gone (released, its cluster stopped, lost for good) or cannot be
            brought back; the message says which.

        Examples
        --------
        >>> shards = nbcluster.distribute(lambda i: [i] * 3, over=range(4), persist=True, into="shards")
        >>> shards[2].gather()
        [2, 2, 2]
        """
        future = self.future  # one line if it is gone
        try:
            return future.result()
        except Exception as e:
            raise HandleGone(f"item {self.index} could not be brought back: {type(e).__name__}: {e}") from None

    def release(self) -> None:
        """Let Dask free the value (if no other handle to it is left)."""
        future, self._future = self._future, None
        if self._published is not None:
            self._published()  # runs once: unpublishes the dataset
        if future is not None and future.client.status == "running":
            future.release()

    def describe(self) -> str:
        """`ndarray (12500000,) float64, 100.0 MB`: what the worker said of the value.

        Returns
        -------
        str
            The type, shape (or length) and size the worker measured, as in the handle's repr.
        """
        what = " ".join(part for part in (self.held["type"], self.held["shape"]) if part)
        return f"{what}, {human(self.held['nbytes'])}"

    def __repr__(self) -> str:
        if self.gone is not None:
            return f"<gone: {self.gone}>"
        where = self.where()
        return f"<{f'on worker {where}' if where else 'not held by any worker now'}: {self.describe()}>"

    def __reduce__(self) -> Any:
        # A handle crossing to a worker inside a blob would hide its key from Dask: runs pass
        # its future as a task dependency instead (`worker/held.py`), so this is a mistake.
        raise TypeError("a persisted handle cannot be pickled; %%distribute passes it to the workers itself")


# -- datasets: values that outlive the kernel (journaled runs) ---------------------------------
_ORDER: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()  # per client, in its loop


def _send(client: Any, put: bool, named: dict[str, Any]) -> None:
    """Queue one dataset call (publish `named`, or delete its names) from `client`'s event loop; never wait.

    A run's driver thread queues a batch's names (`publish`); a finalizer, running wherever
    the last reference went (the main thread, a GC in any thread, the event loop itself),
    queues the name it frees. Either only hands the call to the client's event loop, so a
    finalizer run by a garbage collection anywhere takes no lock and cannot deadlock. The
    loop starts the calls in the order given, and each waits there for the one before (an
    asyncio lock wakes its waiters in order): so a value released at once after it was made
    is unpublished after it was published, never before. A put still queued when the kernel
    dies is lost with it: that item simply runs again on resume (`adopt` finds no dataset).
    """

    async def call() -> None:
        async with _ORDER.setdefault(client, asyncio.Lock()):
            with contextlib.suppress(Exception):  # the scheduler going away: its datasets go with it
                if put:  # override: an item run again after its value was lost
                    await client.publish_dataset(**named, override=True, asynchronous=True)
                else:
                    await client.unpublish_dataset(list(named), asynchronous=True)

    with contextlib.suppress(Exception):  # the loop is closing: the datasets stay (a dead kernel's do too)
        client.loop.add_callback(call)


def _own(handle: Handle, client: Any, name: str) -> None:
    """Make `handle` unpublish `name` when it is released or collected (not at the kernel's exit)."""
    finalizer = weakref.finalize(handle, _send, client, False, {name: None})
    finalizer.atexit = False  # a kernel that exits (a restart) leaves its values for --resume
    handle._published, handle._dataset = finalizer, name


def publish(client: Any, handles: Sequence[Handle | None], prefix: str | None) -> None:
    """Publish each handle's key as the dataset ``<prefix>-<item>``, owned by the handle.

    The call is queued, not waited for (see `_send`): a delivered batch does not wait
    for the scheduler.

    Parameters
    ----------
    client : distributed.Client
        The run's client.
    handles : Sequence of Handle or None
        A delivered batch's new handles (None: an item without a value).
    prefix : str or None
        The run's dataset prefix (`dataset_prefix`); None publishes nothing (no journal).

    """
    made = [h for h in handles if h is not None]
    if prefix is None or not made:
        return
    _send(client, True, {f"{prefix}-{h.index}": h._future for h in made})
    for h in made:
        _own(h, client, f"{prefix}-{h.index}")


def dataset_prefix(journal_name: str) -> str:
    """The dataset prefix of a journaled `--persist` run: ``nbcluster-<journal file's stem>``.

    Parameters
    ----------
    journal_name : str
        The journal's file name (``<identity>-<start µs>-<pid>.journal``).

    Returns
    -------
    str
        The prefix; each item's dataset is ``<prefix>-<item>``.
    """
    return f"nbcluster-{journal_name.rsplit('.', 1)[0]}"


def adopt(client: Any, recipes: dict[int, Recipe]) -> tuple[dict[int, Handle], int]:
    """Take the published values a dead kernel's run left, as handles of this kernel.

    One scheduler call gets the datasets and one asks who holds their keys. A value no
    worker holds any more (its worker died, the cluster restarted, another cluster) is not
    adopted: its dataset is unpublished and the item runs again.

    Parameters
    ----------
    client : distributed.Client
        The new run's client.
    recipes : dict of int to Recipe
        Item index -> recipe, from the journal.

    Returns
    -------
    handles : dict of int to Handle
        The adopted items' handles, each owning its dataset now.
    lost : int
        How many recipes named values the cluster no longer holds.
    """
    if not recipes:
        return {}, 0
    futures = client.get_dataset([recipes[i]["dataset"] for i in sorted(recipes)], default=None)
    found = {i: f for i, f in zip(sorted(recipes), futures, strict=True) if f is not None and hasattr(f, "key")}
    holders = client.who_has(list(found.values())) if found else {}
    handles: dict[int, Handle] = {}
    for i, future in found.items():
        if holders.get(future.key) and str(future.key) == recipes[i]["key"]:
            handle = handles[i] = Handle(future, recipes[i]["held"], i)
            _own(handle, client, recipes[i]["dataset"])
        else:
            future.release()
    if stale := [recipes[i]["dataset"] for i in found if i not in handles]:
        client.unpublish_dataset(stale)
    return handles, len(recipes) - len(handles)


def unpublish(client: Any, prefixes: Sequence[str]) -> int:
    """Drop every dataset whose name starts with one of `prefixes`.

    What ``%cluster runs ID --forget`` does, and a complete run before it deletes the
    journals it supersedes.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster the datasets are on.
    prefixes : Sequence of str
        Dataset prefixes (`dataset_prefix`), each followed by ``-<item>``.

    Returns
    -------
    int
        How many datasets were dropped.
    """
    if names := published(client, prefixes):
        client.unpublish_dataset(sorted(names))
    return len(names)


def published(client: Any, prefixes: Sequence[str]) -> set[str]:
    """The datasets of these prefixes the cluster still has (for `%cluster runs`).

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    prefixes : Sequence of str
        Dataset prefixes (`dataset_prefix`).

    Returns
    -------
    set of str
        The names of their datasets published there now.
    """
    wanted = tuple(f"{p}-" for p in prefixes)
    return {str(n) for n in client.list_datasets() if str(n).startswith(wanted)} if wanted else set()


def holdings_lines(client: Any) -> list[str]:
    """`%cluster status`'s lines on what each worker holds for persisted results (none: []).

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.

    Returns
    -------
    list of str
        One line per worker holding persisted values: per run, its ``--into`` name (else its
        run id), the count of values and their size. [] when the scheduler cannot be asked.
    """
    try:
        held = client.run_on_scheduler(holdings)
        names = {a: str(w.get("name", a)) for a, w in _compat.workers(client).items()}
    except Exception:  # not nbcluster's scheduler, or it is busy: the status shows without them
        return []
    lines = []
    for address in sorted(held, key=lambda a: names.get(a, a)):
        runs = [f"{getattr(RUNS.get(run_id), 'label', None) or f'run {run_id}'}: {count} ({human(nbytes)})"
                for run_id, (count, nbytes) in sorted(held[address].items())]  # fmt: skip
        lines.append(f"  {names.get(address, address):<8} holds persisted {', '.join(runs)}")
    return lines


def check(values: Iterable[Handle], client: Any = None) -> None:
    """Check, before anything runs, that every handle a run reads can be read.

    Parameters
    ----------
    values : Iterable of Handle
        The handles the run reads: among its items, and captured by name.
    client : distributed.Client, optional
        The run's client: when given, each handle must belong to its cluster.

    Raises
    ------
    nbcluster.errors.BadArgument
        For a handle that is gone, or that lives on another cluster (with what to do: use
        ``--cluster``, or ``.gather()`` it).
    """
    for value in values:
        if value.gone is not None:
            raise BadArgument(f"a persisted result read by this cell is gone: {value.gone}")
        theirs = value._future.client
        if client is not None and theirs is not client and theirs.scheduler.address != client.scheduler.address:
            raise BadArgument(f"a persisted result read by this cell lives on another cluster "
                              f"({theirs.scheduler.address}); use --cluster to run there, or .gather() it")  # fmt: skip


def held_slots(items: Sequence[Any], first: int) -> tuple[list[Any], list[Any]]:
    """Items with each handle replaced by a `Slot` (from `first` on), and the futures they stand for.

    Parameters
    ----------
    items : list
        The batch's items: handles, tuples of values and handles, or plain values.
    first : int
        The index of the first slot: the task's dependencies before it are the handles the
        cell captured by name.

    Returns
    -------
    items : list
        The items, each handle replaced by its `Slot` (one tuple level deep).
    futures : list of distributed.Future
        The futures of those handles, in slot order: the task's dependencies.
    """
    futures: list[Any] = []

    def slot(handle: Handle) -> Slot:
        futures.append(handle.future)
        return Slot(first + len(futures) - 1)

    return [replaced(item, Handle, slot) for item in items], futures


def held_report(client: Any, pushed: bytes | None, future: Any, result: Any) -> Any:
    """A persisted item's report blob, read where it ran; else its task's exception.

    The worker pushed it as an event ahead of the task's end (`run/transport.py`): no round trip,
    where a worker busy with its next item would answer late. Where it did not come, it is
    read from the worker's event loop (a task would queue behind the worker's next item),
    and failing that (the worker dropped it) made again from the value by a small task. A
    task without a value raised after its report was out (`worker/held.py`): its report,
    too large to push, is asked of the workers.

    Parameters
    ----------
    client : distributed.Client
        The run's client.
    pushed : bytes or None
        What the worker pushed for the task (`Transport.results` without a gather).
    future : distributed.Future
        The item's finished task.
    result : Any
        What the transport read for it (None: nothing).

    Returns
    -------
    Any
        The report blob, or the task's exception.
    """
    if pushed is not None:
        return pushed
    key = str(future.key)
    if future.status == "error":
        with contextlib.suppress(Exception):  # StopIteration too: no worker kept it
            return next(r for r in client.run(report_of, key, on_error="return").values() if isinstance(r, bytes))
    if future.status != "finished":
        return result if result is not None else outcome(future)
    with contextlib.suppress(Exception):
        if (report := _compat.run_on_holder(client, key, report_of, key)) is not None:
            return report
    return outcome(client.submit(report_for, future, pure=False))


def handle_of(future: Any, indices: Sequence[int], described: list[Any], errors: dict[int, Any],
              ran_on: tuple[str, str] | None) -> list[Any]:  # fmt: skip
    """The handle of a persisted item that has a value: its task's own future and key.

    Parameters
    ----------
    future : distributed.Future
        The item's task.
    indices : sequence of int
        The batch's one item.
    described : list of HeldValue or None
        The worker's description of the value.
    errors : dict of int to ErrorRecord
        The batch's failures, by position.
    ran_on : tuple of (str, str) or None
        The worker that ran it: (address, name).

    Returns
    -------
    list of Handle or None
        One entry per described value: the handle, or None where the item has no value (its
        task raised, or ran nothing; the future then goes with the caller's frame).
    """
    if not described or 0 in errors or described[0] is None:
        return [None] * len(described)
    return [Handle(future, described[0], indices[0], made_on=ran_on[0] if ran_on else None)]



class Placement:
    """Where the handles a run reads are: a hint for a batch that reads them, asked once per start.

    Dask may still run the batch elsewhere (`allow_other_workers`), and moves the value then.
    A handle made in this kernel knows the worker that made it (`Handle.made_on`), where Dask
    keeps the value until that worker goes (then the hint names no live worker, and Dask
    places the batch itself): nothing is asked, so a chained cell's first item goes out at
    once. Only the others (handles adopted from a journal) are asked of the scheduler, in
    one round trip. Making one runs no code (no ``__init__``): a run that reads no handle
    never asks it anything.
    """

    _placed: dict[str, list[str]] | None = None  # key -> holders, filled at the first `of` with deps

    def of(self, client: Any, items: Sequence[Any], deps: Sequence[Any]) -> list[str]:
        """The workers holding the first of `deps` (a batch's dependencies) with a known holder.

        Parameters
        ----------
        client : distributed.Client
            The run's client.
        items : sequence
            The plan's items (the handles among them are looked up at the first call).
        deps : sequence of distributed.Future
            The futures of the handles the batch reads.

        Returns
        -------
        list of str
            Their addresses; empty for none.
        """
        if not deps:
            return []
        if self._placed is None:
            held = [v for item in items for v in (item if type(item) is tuple else (item,)) if isinstance(v, Handle)]
            self._placed = {h.key: [h.made_on] for h in held if h.made_on and h._future is not None}
            unknown = [h._future for h in held if not h.made_on and h._future is not None]
            if unknown:
                with contextlib.suppress(Exception):  # the scheduler busy or gone: let Dask place them
                    self._placed.update({k: list(v) for k, v in client.who_has(unknown).items()})
        return next((self._placed[f.key] for f in deps if self._placed.get(f.key)), [])


class Read:
    """A finished run's weak reference to a handle it read (an item, or a name it captured).

    A finished run keeps no handle alive: `del` of the notebook's variables frees the value.
    A retry takes the handle back (`recall`), or says in one line that it is gone.
    """

    __slots__ = ("_ref", "_text")

    def __init__(self, handle: Handle):
        self._ref = weakref.ref(handle)
        self._text = f"<persisted: {handle.describe()}>"  # asks no scheduler: runs in a listener

    def recall(self) -> Handle:
        """The handle back, for a retry.

        Returns
        -------
        Handle
            The handle, while the notebook still holds it.

        Raises
        ------
        nbcluster.errors.BadArgument
            When it was deleted or released since; the message says to run the cells that make it
            again.
        """
        handle = self._ref()
        if handle is None or handle.gone is not None:
            raise BadArgument("a persisted result this run read was deleted or released since: "
                              "run the cells that make it again, then this one")  # fmt: skip
        return handle

    def __repr__(self) -> str:
        return self._text if self._ref() is not None else "<released>"


def replaced(value: Any, kind: type[Any], fn: Callable[[Any], Any]) -> Any:
    """`value` with each `kind` in it (itself, or in a tuple, one level deep) replaced by ``fn(it)``.

    How a run's items trade their handles: for slots (`held_slots`), for weak `Read` objects
    once the run is over, and back for a retry (`Read.recall`).

    Parameters
    ----------
    value : Any
        One item of a run: a handle, a tuple with handles, anything.
    kind : type
        What to replace: `Handle`, or `Read`.
    fn : callable
        What each one becomes.

    Returns
    -------
    Any
        The item, with each `kind` one tuple level deep replaced.
    """
    if isinstance(value, kind):
        return fn(value)
    if type(value) is tuple and any(isinstance(v, kind) for v in value):
        return tuple(fn(v) if isinstance(v, kind) else v for v in value)
    return value


def forget_shown(shell: Any) -> None:
    """Make the output history (`Out`, `_`, `__`, `___`, `_N`) hold handles weakly.

    Run after each cell (`post_run_cell`) once this kernel has made a handle (`Handle.made`):
    showing a handle, or the `Results` that holds them, must not keep the workers' memory
    once the notebook's variables are gone.
    A weak proxy still works like the value while it lives. IPython's display hook keeps
    `_`, `__`, `___` itself and tells them from the user's own by identity: its copies
    become the same proxies; IPython also copies them into `user_ns_hidden`.

    Parameters
    ----------
    shell : IPython.core.interactiveshell.InteractiveShell
        The kernel's shell.
    """
    out, hook = shell.history_manager.output_hist, shell.displayhook
    proxies: dict[int, Any] = {}

    def weak(value: Any) -> Any:
        # By type, not isinstance: a proxy passes for what it stands for, and is weak already.
        held = type(value) is Handle or (type(value).__name__ == "Results" and getattr(value._control, "persist", False))
        return proxies.setdefault(id(value), weakref.proxy(value)) if held else value

    out.update({n: weak(value) for n, value in out.items()})
    for ns in (shell.user_ns, shell.user_ns_hidden):
        for name in [k for k in ns if k.startswith("_") and (k.strip("_") == "" or k[1:].isdigit())]:
            ns[name] = weak(ns[name])
    for name in ("_", "__", "___"):
        setattr(hook, name, weak(getattr(hook, name, None)))


def outcome(future: Any) -> Any:
    """What ``as_completed(with_results=True)`` would give: the blob, or the exception.

    Parameters
    ----------
    future : distributed.Future
        A finished task.

    Returns
    -------
    Any
        Its result, or the exception it raised.
    """
    try:
        return future.result()
    except BaseException as e:
        return e
