"""`Job`: what a run runs, made once in the kernel before anything is sent.

A job is the run's code (a parsed `Cell` or a function), its `Plan` (the items and the
names each binds), the notebook values the code captured (`Capture`), the seed, and the
policy for failures and batch sizes. Everything that can fail on the user's input fails
while the job is made, naming the culprit, before anything reaches the cluster: a function
that cannot be pickled, an item that cannot travel.

The plan travels one way: `run.distribute` builds it and hands it to the job, the engine
reads the items from `job.plan` for each batch, and `for_workers` writes how an item binds
names into the context blob each worker loads once (`worker.Context`). The code is
serialised once, here (marshal for a cell's code objects, which keeps their filename for
tracebacks; cloudpickle for a function); `for_workers` adds the keys of the large values
shipped (which depend on the cluster) and pickles the context, once per start.

A failure record coming back from an item becomes an `ItemError` here (`item_error`): the
job knows the item's parameters and where the notebook functions it shipped came from.
"""

from __future__ import annotations

import marshal
from types import FunctionType
from typing import Any

import cloudpickle

from nbcluster import worker
from nbcluster._wire import TrialSpec
from nbcluster.errors import BadArgument
from nbcluster.persist import handles
from nbcluster.persist.handles import held_slots
from nbcluster.run.capture import Capture, code_index, read_only_array, shareable
from nbcluster.run.cell import Cell
from nbcluster.run.plan import Plan
from nbcluster.run.tracebacks import ItemError


class Job:
    """One run's code, items and captured names; see the module docstring.

    `sent_from` is the index of the first item that runs on the workers (after the
    `--local K` items), or None when every item runs in the kernel.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        cell: Cell | None = None,
        fn: Any = None,
        capture: Capture | None = None,
        seed: int | None = None,
        retries: int = 0,
        batch: int | str = "auto",
        sent_from: int | None = None,
        persist: bool = False,
        reads_handles: bool = False,
        trial: TrialSpec | None = None,
    ):
        self.plan, self.cell, self.fn, self.seed = plan, cell, fn, seed
        self.capture = capture if capture is not None else Capture()
        self.retries = retries
        self.persist = persist  # the values stay on the workers, behind handles
        self.reads_handles = reads_handles  # items or captured names are handles: Dask dependencies
        self.trial = trial  # a trial run's spec: its items report, and may be stopped (`trials.py`)
        self.fixed_batch = None if batch == "auto" else int(batch)
        self.code_index = code_index([*self.capture.direct.values(), *([fn] if fn is not None else [])])
        self._wire: dict[str, Any] | None = None
        if sent_from is not None:
            self._check_item(sent_from)
            self._wire = self._serialised_code()

    def forget_handles(self) -> None:
        """The run is over: hold the handles it read weakly (see `handles.Read`)."""
        if self.reads_handles:
            # A range holds no handle: then only a name the cell captured does.
            if isinstance(self.plan.items, list):
                self.plan.items[:] = [handles.forget(item) for item in self.plan.items]
            self.capture.held = {n: handles.forget(h) for n, h in self.capture.held.items()}

    def recall_handles(self) -> None:
        """A retry: the handles it reads again, strongly; one line if one is gone."""
        if self.reads_handles:
            if isinstance(self.plan.items, list):
                self.plan.items[:] = [handles.recall(item) for item in self.plan.items]
            self.capture.held = {n: handles.recall(h) for n, h in self.capture.held.items()}

    def for_kernel(self) -> worker.Context:
        """The context `--local` items run in: the code and the captured values as they are.

        Returns
        -------
        worker.Context
            A context built in the kernel, with nothing pickled.
        """
        captured = self.capture
        code: dict[str, Any] = {"fn": self.fn}
        if self.cell is not None:
            code = {"filename": self.cell.filename, "source": self.cell.source}
            code.update(body=self.cell.body, last=self.cell.last)
        elif not shareable(self.fn):
            code["fn_blob"] = self._copyable("the function", self.fn)
        namespace = {"__name__": "__main__", **captured.direct}
        arrays = [n for n in captured.read_only if read_only_array(namespace[n])]
        for name in arrays:  # a view: the notebook's own array stays writeable
            namespace[name] = namespace[name].view()
            namespace[name].flags.writeable = False
        # A function that reads a large array reads the notebook's own here: copied instead.
        readers = [n for n in captured.read_only if isinstance(namespace[n], FunctionType)]
        copied = [*captured.copied, *readers]
        fresh = captured.fresh if copied == captured.copied else None
        if fresh is None and copied:
            fresh = self._copyable(", ".join(f"`{n}`" for n in copied), {n: captured.direct[n] for n in copied})
        spec = {**self._binding(), **code, "large": [], "read_only": arrays, "arrays": arrays, "fresh": fresh}
        return worker.Context(spec, namespace)

    @staticmethod
    def _copyable(what: str, value: Any) -> bytes | None:
        """`value` pickled, for items in the kernel to load a copy each; None, with a line, if it cannot be."""
        try:
            return cloudpickle.dumps(value, protocol=5)
        except Exception as e:
            print(f"nbcluster: --local: {what} cannot be copied for each item ({type(e).__name__}: {e}); "
                  "the items in the kernel share the notebook's own object")  # fmt: skip
            return None

    def for_workers(self, large: list[tuple[str, str, int]]) -> bytes:
        """The context blob the workers load: code, binding, captured names, large values' keys.

        Parameters
        ----------
        large : list of (str, str, int)
            (name, Dask key, size) of the large values shipped to this cluster
            (`capture.Shipments.ship`).

        Returns
        -------
        bytes
            The cloudpickled context spec, which `worker.Context.from_payload` loads.
        """
        assert self._wire is not None, "a job made for the kernel only sends nothing"
        captured = self.capture
        spec = {**self._binding(), **self._wire, "large": large}
        values = {n: b for n, b in captured.values.items() if n not in captured.copied}
        spec.update(modules=captured.modules, values=values, fresh=captured.fresh, copied=captured.copied,
                    read_only=captured.read_only)  # fmt: skip
        return cloudpickle.dumps(spec)

    def item_error(self, index: int, record: worker.ErrorRecord, where: str) -> ItemError:
        """A failure record from item `index`, run on `where` ("the cluster" or "the kernel").

        Parameters
        ----------
        index : int
            The item's index in the run.
        record : worker.ErrorRecord
            The failure record the item's exception became.
        where : str
            Where it ran: ``"the cluster"`` or ``"the kernel"``.

        Returns
        -------
        ItemError
            The error with the item's parameters, its traceback mapped to the notebook cells the
            shipped functions came from.
        """
        return ItemError(index, self.plan.params(index), record, where, self.code_index)

    def _binding(self) -> dict[str, Any]:
        """How an item binds names, for `worker.Context`."""
        plan = self.plan
        return {
            "kind": "cell" if self.cell is not None else "function",
            "mode": plan.mode,
            "names": plan.names,
            "target": plan.target,
            "unpacks": plan.unpacks,
            "positional": plan.positional,
            "seed": self.seed,
            "trial": self.trial,
        }

    def _serialised_code(self) -> dict[str, Any]:
        if self.cell is not None:
            last = self.cell.last
            return {
                "filename": self.cell.filename,
                "source": self.cell.source,
                "body": None if self.cell.body is None else marshal.dumps(self.cell.body),
                "last": None if last is None else marshal.dumps(last),
            }
        try:
            # A function that reads what an item could change is unpickled again per item.
            return {"fn": cloudpickle.dumps(self.fn), "fresh_fn": not shareable(self.fn, arrays=True)}
        except Exception as e:
            name = getattr(self.fn, "__name__", repr(self.fn))
            raise BadArgument(
                f"the function {name} cannot be sent to the workers: {type(e).__name__}: {e}"
            ) from None

    def _check_item(self, first: int) -> None:
        """Fail early, naming the item, when item values cannot travel."""
        if self.plan.mode == "everywhere":
            return
        item = self.plan.items[first]
        if self.reads_handles:  # its handles travel as Dask dependencies, not in the blob
            item = held_slots([item], 0)[0][0]
        try:
            cloudpickle.dumps(item)
        except Exception as e:
            raise BadArgument(
                f"item {first} ({self.plan.describe(first)}) cannot be sent to the workers: "
                f"{type(e).__name__}: {e}"
            ) from None
