"""`%%distribute`'s options, declared once, and their rules, checked once.

`DistributeOptions` is the declaration: each field is one flag, with its type (the
annotation, and how the magic reads its text: `kind`), its default (the field's) and its
help. The magic's parser, `%%distribute?` and the docs' option reference
(``docs/_ext/nbcluster_docs.py``, checked by ``tests/test_docs.py``) are made from it. Constructing one checks the values;
`%%distribute` and `distribute()` both do, so both reject the same input with the same
message.

Each field's name is the keyword of `api.launch`, which the magic calls. Python spells most
flags the same way in `distribute()`; the rest say how (``python``): what each item needs
is one ``needs=Needs(...)``, the cluster is ``on=``, and ``--everywhere`` and ``--ranks``
are functions of their own (`run/spelling.py`).

Kinds of value, as read from the magic's line (see `args.py`): ``expr`` a Python
expression, kept as text; ``name`` a variable name; ``text`` one word; ``amount`` a number
above 0; ``count`` a whole number of 0 or more; ``int`` any whole number; ``batch``
``auto`` or a whole number; ``local`` a whole number, or nothing for all items;
``switch`` no value.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

from nbcluster.errors import BadArgument
from nbcluster.run.stoppers import make
from nbcluster.run.trials import Objective, parse_timeout


def _flag(kind: str, help: str, metavar: str = "", flag: str = "", python: str = "") -> dict[str, str]:
    """A field's declaration as a flag: see `Flag`."""
    return {"kind": kind, "help": help, "metavar": metavar, "flag": flag, "python": python}


@dataclass(frozen=True)
class Flag:
    """One `%%distribute` flag, as the declaration below states it."""

    name: str  # without the leading --
    dest: str  # keyword of `launch()`, which the magic calls
    kind: str
    metavar: str
    help: str
    default: Any
    python: str  # how Python spells it: `distribute()`'s keyword and default, or where it went

    @property
    def usage(self) -> str:
        """`--over "x in ITERABLE"`, `--local [K]`, `--no-wait`."""
        return f"--{self.name} {self.metavar}".strip()


@dataclass(frozen=True)
class DistributeOptions:
    """The options of one run, checked."""

    # fmt: off
    over: Any = field(default=None, metadata=_flag(
        "expr", "run once per item, with `x` bound; `\"a, b in pairs\"` unpacks each item", '"x in ITERABLE"'))
    grid: Any = field(default=None, metadata=_flag(
        "expr", "every combination of the named lists (first name varies slowest)", '"lr=[...], depth=[...]"'))
    zip: Any = field(default=None, metadata=_flag(
        "expr", "the named lists walked in step (they must have the same length)", '"a=[...], b=[...]"'))
    into: str | None = field(default=None, metadata=_flag(
        "name", "put the results in the variable `NAME` (the cell then shows no output)", "NAME"))
    gpus: float | None = field(default=None, metadata=_flag(
        "amount", "each item needs `N` GPUs: it runs only on GPU workers", "N",
        python="needs=Needs(gpus=N)"))
    cpus: float | None = field(default=None, metadata=_flag(
        "amount", "each item needs `N` CPU cores of a CPU worker", "N", python="needs=Needs(cpus=N)"))
    cpu_only: bool = field(default=False, metadata=_flag(
        "switch", "keep items off GPU workers", python="needs=Needs(cpu_only=True)"))
    retries: int = field(default=0, metadata=_flag(
        "count", "run a failing item again, up to `N` more times", "N"))
    batch: int | str = field(default="auto", metadata=_flag(
        "batch", "items per task; `auto` (default) measures the items and batches small ones", "auto|N"))
    wait: bool = field(default=True, metadata=_flag(
        "switch", "return at once; the results fill in while you work; `%distribute wait NAME` waits",
        flag="no-wait"))
    seed: int | None = field(default=None, metadata=_flag(
        "int", "each item gets its own reproducible `seed` variable, derived from `S` and its index", "S"))
    everywhere: bool = field(default=False, metadata=_flag(
        "switch", "run the cell once on every worker (set-up code); results are keyed by worker",
        python="nbcluster.everywhere(body)"))
    ranks: int | None = field(default=None, metadata=_flag(
        "count", "run the cell as `N` ranks of one job (data-parallel training), all started together, each "
        "on a worker process of its own with the environment torchrun sets: `RANK`, `WORLD_SIZE`, "
        "`MASTER_ADDR`, `MASTER_PORT`, and one failing stops them all", "N", python="nbcluster.ranks(body, n=N)"))
    local: int | str | bool = field(default=0, metadata=_flag(
        "local", "run the first `K` items here in the kernel first, to debug quickly; `--local` alone "
        "runs everything here (no cluster needed)", "[K]"))
    persist: bool = field(default=False, metadata=_flag(
        "switch", "keep each result in the memory of the worker that made it, with `--into` naming "
        "them: `NAME[i]` is a handle and `NAME.gather()` brings the values here"))
    resume: bool = field(default=False, metadata=_flag(
        "switch", "pick up the last run of this same cell (same items and inputs), from its journal: "
        "only the items it did not finish run (a new kernel finds it too)"))
    cluster: str | None = field(default=None, metadata=_flag(
        "text", "use the named cluster instead of the current one", "NAME", python='on="NAME"'))
    objective: str | None = field(default=None, metadata=_flag(
        "text", "the metric (from `nbcluster.report` or the result) that ranks the trials, and which "
        "way: the live table and `best()` use it; without it the table claims no order", "NAME:min|max"))
    stopper: Any = field(default=None, metadata=_flag(
        "expr", "stop losing trials early from their reports of the objective: `asha` or `median`, "
        "each with parameters such as `asha(grace=1, eta=3, max_t=27)` (the defaults) or "
        "`median(grace=3, min_trials=3)`", "POLICY", flag="stop"))
    timeout: str | float | None = field(default=None, metadata=_flag(
        "text", "stop an item that runs longer than this, such as `90s`, `10m` or `2h` (seconds in "
        "Python): it ends timed out", "DURATION"))
    # fmt: on

    def __post_init__(self) -> None:
        if self.into is not None and (
            not isinstance(self.into, str) or not self.into.isidentifier() or keyword.iskeyword(self.into)
        ):
            raise BadArgument(f"--into needs a Python variable name, got {self.into!r}")
        for name in ("gpus", "cpus"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise BadArgument(f"--{name} needs a number above 0, got {value!r}")
        if self.cpu_only and self.gpus:
            raise BadArgument("--cpu-only and --gpus contradict each other: pick one")
        if not _whole(self.retries) or self.retries < 0:
            raise BadArgument(f"--retries needs a whole number of 0 or more, got {self.retries!r}")
        if self.batch != "auto" and (not _whole(self.batch) or self.batch < 1):
            raise BadArgument(f"--batch needs `auto` or a whole number of 1 or more, got {self.batch!r}")
        if self.seed is not None and not _whole(self.seed):
            raise BadArgument(f"--seed needs a whole number, got {self.seed!r}")
        if self.local not in ("all", True, False) and (not _whole(self.local) or self.local < 0):
            raise BadArgument(
                f"--local needs a whole number of 0 or more (or nothing, for all items), got {self.local!r}"
            )
        if self.everywhere and any(v is not None for v in (self.over, self.grid, self.zip)):
            raise BadArgument(
                "--everywhere runs the cell once per worker: it cannot be combined with --over/--grid/--zip"
            )
        if self.persist and self.into is None:
            raise BadArgument("--persist keeps the results on the workers: name them with --into NAME")
        if self.persist and self.batch not in ("auto", 1):
            raise BadArgument(f"--persist runs each item as a Dask task of its own, holding its value: drop --batch {self.batch}")
        if self.persist and self.local not in (0, False):
            raise BadArgument(
                "--persist keeps the results on the workers, --local runs items in the kernel: drop one of them"
            )
        if self.ranks is not None:
            self._check_ranks()
        if self.everywhere and self.resume:
            raise BadArgument("--everywhere runs are not journaled (their items are the workers of now): drop --resume")
        self._check_trials()
        if self.everywhere and self.local not in (0, False):
            raise BadArgument("--everywhere runs on the workers; it cannot be combined with --local")

    def _check_ranks(self) -> None:
        """`--ranks N` is one job: nothing that makes or keeps several independent items."""
        if not _whole(self.ranks) or self.ranks < 1:
            raise BadArgument(f"--ranks needs a whole number of 1 or more, got {self.ranks!r}")
        clashes = [
            flag for flag, on in (
                ("--over", self.over is not None), ("--grid", self.grid is not None), ("--zip", self.zip is not None),
                ("--everywhere", self.everywhere), ("--persist", self.persist),
                ("--local", self.local not in (0, False)), ("--retries", bool(self.retries)),
            ) if on
        ]  # fmt: skip
        if clashes:
            raise BadArgument(
                f"--ranks {self.ranks} runs the cell as one job of {self.ranks} ranks that start and fail together: "
                f"it cannot be combined with {', '.join(clashes)}; drop {'it' if len(clashes) == 1 else 'them'}"
            )


    def _check_trials(self) -> None:
        Objective.parse(self.objective)
        make(self.stopper)
        parse_timeout(self.timeout)
        if self.stopper is not None and self.objective is None:
            raise BadArgument("--stop judges trials by their objective: add --objective NAME:min|max")
        if (self.stopper is not None or self.timeout is not None) and self.batch not in ("auto", 1):
            raise BadArgument(f"--stop and --timeout stop items one at a time (one a task): drop --batch {self.batch}")
        if self.everywhere and (self.stopper is not None or self.timeout is not None or self.objective is not None):
            raise BadArgument("--everywhere runs set-up code once per worker: drop --stop/--timeout/--objective")


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


FLAGS: tuple[Flag, ...] = tuple(
    Flag(
        name=f.metadata["flag"] or f.name.replace("_", "-"),
        dest=f.name,
        kind=f.metadata["kind"],
        metavar=f.metadata["metavar"],
        help=f.metadata["help"],
        default=f.default,
        python=f.metadata["python"] or f"{f.name}={f.default!r}",
    )
    for f in fields(DistributeOptions)
)
