"""`Job`: what a run runs, made once in the kernel before anything is sent.

A job is the run's code (a parsed `Cell` or a function), its `Plan`, the `Capture`, the
seed, and the policy for failures and batch sizes. Everything that can fail on the user's
input fails while the job is made, naming the culprit: a function that cannot be pickled,
an item that cannot travel. The code is serialised once (marshal for a cell's code
objects, which keeps their filename for tracebacks; cloudpickle for a function);
`Job.for_workers` adds the keys of the large values shipped (which depend on the cluster)
and pickles the context each worker loads once (`worker.Context`).

A failure record coming back from an item becomes an `ItemError` here (`item_error`): the
job knows the item's parameters and where the notebook functions it shipped came from.
"""

from __future__ import annotations

import marshal
from types import CodeType, FunctionType
from typing import Any

import cloudpickle

from nbcluster import worker
from nbcluster._wire import TrialSpec
from nbcluster.errors import BadArgument
from nbcluster.persist import handles
from nbcluster.run.capture import Capture, read_only_array, shareable
from nbcluster.run.cell import Cell, Plan
from nbcluster.run.tracebacks import ItemError


class Job:
    """One run's code, items and captured names; see the module docstring.

    `sent_from` is the index of the first item that runs on the workers (after the
    `--local K` items), or None when every item runs in the kernel.
    """

    def __init__(
        self, plan: Plan, *, cell: Cell | None = None, fn: Any = None, capture: Capture | None = None,
        seed: int | None = None, retries: int = 0, batch: int | str = "auto", sent_from: int | None = None,
        persist: bool = False, reads_handles: bool = False, trial: TrialSpec | None = None,
    ):  # fmt: skip
        self.plan, self.cell, self.fn, self.seed, self.retries = plan, cell, fn, seed, retries
        self.capture = capture if capture is not None else Capture()
        self.persist = persist  # the values stay on the workers, behind handles
        self.reads_handles = reads_handles  # items or captured names are handles: Dask dependencies
        self.trial = trial  # a trial run's spec: its items report, and may be stopped (`trials.py`)
        self.fixed_batch = None if batch == "auto" else int(batch)
        self.code_index = _code_index([*self.capture.direct.values(), *([fn] if fn is not None else [])])
        self._wire: dict[str, Any] | None = None
        if sent_from is not None:
            self._check_item(sent_from)
            self._wire = self._serialised_code()

    def forget_handles(self) -> None:
        """The run is over: hold the handles it read weakly (see `handles.Read`)."""
        self._rebind_handles(handles.forget)

    def recall_handles(self) -> None:
        """A retry: the handles it reads again, strongly; one line if one is gone."""
        self._rebind_handles(handles.recall)

    def _rebind_handles(self, how: Any) -> None:
        if self.reads_handles:
            if isinstance(self.plan.items, list):  # a range holds no handle
                self.plan.items[:] = [how(item) for item in self.plan.items]
            self.capture.held = {n: how(h) for n, h in self.capture.held.items()}

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
            code = {"filename": self.cell.filename, "source": self.cell.source, "body": self.cell.body,
                    "last": self.cell.last}  # fmt: skip
        elif not shareable(self.fn):
            code["fn_blob"] = _copyable("the function", self.fn)
        namespace = {"__name__": "__main__", **captured.direct}
        arrays = [n for n in captured.read_only if read_only_array(namespace[n])]
        for name in arrays:  # a view: the notebook's own array stays writeable
            namespace[name] = namespace[name].view()
            namespace[name].flags.writeable = False
        # A function that reads a large array reads the notebook's own here: copied instead.
        copied = [*captured.copied, *(n for n in captured.read_only if isinstance(namespace[n], FunctionType))]
        fresh = captured.fresh if copied == captured.copied else None
        if fresh is None and copied:
            fresh = _copyable(", ".join(f"`{n}`" for n in copied), {n: captured.direct[n] for n in copied})
        spec = {**self._binding(), **code, "large": [], "read_only": arrays, "arrays": arrays, "fresh": fresh}
        return worker.Context(spec, namespace)

    def for_workers(self, large: list[tuple[str, str, int]]) -> bytes:
        """The context blob the workers load: code, binding, captured names, large values' keys.

        Parameters
        ----------
        large : list of (str, str, int)
            (name, Dask key, size) of the large values shipped to this cluster
            (`Shipments.ship`).

        Returns
        -------
        bytes
            The cloudpickled context spec, which `worker.Context.from_payload` loads.
        """
        assert self._wire is not None, "a job made for the kernel only sends nothing"
        c = self.capture
        values = {n: b for n, b in c.values.items() if n not in c.copied}
        return cloudpickle.dumps({**self._binding(), **self._wire, "large": large, "modules": c.modules,
                                  "values": values, "fresh": c.fresh, "copied": c.copied, "read_only": c.read_only})  # fmt: skip

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
        p = self.plan
        return {"kind": "cell" if self.cell is not None else "function", "mode": p.mode, "names": p.names,
                "target": p.target, "unpacks": p.unpacks, "positional": p.positional, "seed": self.seed,
                "trial": self.trial}  # fmt: skip

    def _serialised_code(self) -> dict[str, Any]:
        if self.cell is not None:
            body, last = self.cell.body, self.cell.last
            return {"filename": self.cell.filename, "source": self.cell.source,
                    "body": None if body is None else marshal.dumps(body),
                    "last": None if last is None else marshal.dumps(last)}  # fmt: skip
        try:
            # A function that reads what an item could change is unpickled again per item.
            return {"fn": cloudpickle.dumps(self.fn), "fresh_fn": not shareable(self.fn, arrays=True)}
        except Exception as e:
            name = getattr(self.fn, "__name__", repr(self.fn))
            raise BadArgument(f"the function {name} cannot be sent to the workers: {type(e).__name__}: {e}") from None

    def _check_item(self, first: int) -> None:
        """Fail early, naming the item, when item values cannot travel."""
        if self.plan.mode == "everywhere":
            return
        item = self.plan.items[first]
        if self.reads_handles:  # its handles travel as Dask dependencies, not in the blob
            item = handles.held_slots([item], 0)[0][0]
        try:
            cloudpickle.dumps(item)
        except Exception as e:
            raise BadArgument(
                f"item {first} ({self.plan.describe(first)}) cannot be sent to the workers: {type(e).__name__}: {e}"
            ) from None


def _copyable(what: str, value: Any) -> bytes | None:
    """`value` pickled, for items in the kernel to load a copy each; None, with a line, if it cannot be."""
    try:
        return cloudpickle.dumps(value, protocol=5)
    except Exception as e:
        print(f"nbcluster: --local: {what} cannot be copied for each item ({type(e).__name__}: {e}); "
              "the items in the kernel share the notebook's own object")  # fmt: skip
        return None


def _code_index(values: Any) -> dict[str, list[tuple[str, int, int]]]:
    """co_name -> [(filename, first line, last line)] for the notebook functions in `values`.

    cloudpickle renames the file of every code object it ships by value to
    "<dynamic-code>"; names and line numbers survive, so a worker's frame can be mapped
    back to the notebook cell the function was defined in. Functions, and the methods and
    properties of classes, are indexed, with every function nested in them.
    """
    index: dict[str, list[tuple[str, int, int]]] = {}
    todo: list[Any] = []
    for value in values:
        members = vars(value).values() if isinstance(value, type) else [value]
        for member in members:
            member = getattr(member, "__func__", member)
            member = getattr(member, "fget", member)
            todo.append(getattr(member, "__code__", None))
    seen: set[int] = set()
    while todo:
        code = todo.pop()
        if not isinstance(code, CodeType) or id(code) in seen:
            continue
        seen.add(id(code))
        last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
        index.setdefault(code.co_name, []).append((code.co_filename, code.co_firstlineno, last))
        todo.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return index
