"""`%%distribute`'s options, declared once, their rules, checked once, and the magic's line.

`DistributeOptions` is the declaration: each field is one flag, with its type (the
annotation, and how the magic reads its text: `kind`), its default (the field's) and its
help. The magic's parser, `%%distribute?` and the docs' option reference
(``docs/_ext/nbcluster_docs.py``, checked by ``tests/test_docs.py``) are made from it.
Constructing one checks the values; `%%distribute` and `distribute()` both do, so both
reject the same input with the same message.

Each field's name is the keyword of `api.launch`, which the magic calls. Python spells most
flags the same way in `distribute()`; the rest say how (``python``): what each item needs
is one ``needs=Needs(...)``, the cluster is ``on=``, and ``--everywhere`` and ``--ranks``
are functions of their own (`api.everywhere`, `api.ranks`).

Kinds of value, as read from the magic's line: ``expr`` a Python expression, kept as text;
``name`` a variable name; ``text`` one word; ``amount`` a number above 0; ``count`` a
whole number of 0 or more; ``int`` any whole number; ``batch`` ``auto`` or a whole number;
``local`` a whole number, or nothing for all items; ``switch`` no value.

The line: values of `--over`, `--grid` and `--zip` are Python expressions, which `shlex`
would mangle (it strips the quotes inside `['a b', 'c']`). So the line is split by a small
scanner that knows Python's brackets and string quotes: whitespace splits only outside
them, and a value runs until the next `--flag`. Quoting the whole value is allowed and
usual (`--over "x in range(10)"`), and so is leaving it bare (`--over x in range(10)`).
Each flag's value is then read by its declared kind (`_read`), and `DistributeOptions`
checks the values together.
`tokenize` cannot be that scanner: the line is not Python but words with Python inside,
and tokenize's errors differ between Python versions (an unterminated quote, a stray `)`,
a `#`, f-strings). Nothing is evaluated here: expressions go to `launch()`, which
evaluates them in the user's namespace and reports their errors.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import keyword
import math
import re
import textwrap
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

from nbcluster.errors import BadArgument
from nbcluster.run.stoppers import make
from nbcluster.run.trials import Objective, Rules, parse_timeout


def _option(default: Any, kind: str, help: str, metavar: str = "", flag: str = "", python: str = "") -> Any:
    """A field of `DistributeOptions` with its declaration as a flag (see `Flag`) as metadata."""
    metadata = {"kind": kind, "help": help, "metavar": metavar, "flag": flag, "python": python}
    return field(default=default, metadata=metadata)


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
    """The options of one run, checked: each wrong value or clash is one line naming the fix."""

    # fmt: off
    # `_option` makes a dataclasses.Field, as `field` does (RUF009 knows only `field` itself).
    over: Any = _option(None, "expr", "run once per item, with `x` bound; `\"a, b in pairs\"` unpacks each item",  # noqa: RUF009
                        '"x in ITERABLE"')
    grid: Any = _option(None, "expr", "every combination of the named lists (first name varies slowest)",  # noqa: RUF009
                        '"lr=[...], depth=[...]"')
    zip: Any = _option(None, "expr", "the named lists walked in step (they must have the same length)",  # noqa: RUF009
                       '"a=[...], b=[...]"')
    into: str | None = _option(None, "name", "put the results in the variable `NAME` (the cell then shows no output)",
                               "NAME")
    gpus: float | None = _option(None, "amount", "each item needs `N` GPUs: it runs only on GPU workers", "N",
                                 python="needs=Needs(gpus=N)")
    cpus: float | None = _option(None, "amount", "each item needs `N` CPU cores of a CPU worker", "N",
                                 python="needs=Needs(cpus=N)")
    cpu_only: bool = _option(False, "switch", "keep items off GPU workers", python="needs=Needs(cpu_only=True)")
    retries: int = _option(0, "count", "run a failing item again, up to `N` more times", "N")
    batch: int | str = _option("auto", "batch", "items per task; `auto` (default) measures the items and batches "
                               "small ones", "auto|N")
    wait: bool = _option(True, "switch", "return at once; the results fill in while you work; `%distribute wait "
                         "NAME` waits", flag="no-wait")
    seed: int | None = _option(None, "int", "each item gets its own reproducible `seed` variable, derived from `S` "
                               "and its index", "S")
    everywhere: bool = _option(False, "switch", "run the cell once on every worker (set-up code); results are keyed "
                               "by worker", python="nbcluster.everywhere(body)")
    ranks: int | None = _option(None, "count", "run the cell as `N` ranks of one job (data-parallel training), all "
                                "started together, each on a worker process of its own with the environment "
                                "torchrun sets: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and one failing "
                                "stops them all", "N", python="nbcluster.ranks(body, n=N)")
    local: int | str | bool = _option(0, "local", "run the first `K` items here in the kernel first, to debug "
                                      "quickly; `--local` alone runs everything here (no cluster needed)", "[K]")
    persist: bool = _option(False, "switch", "keep each result in the memory of the worker that made it, with "
                            "`--into` naming them: `NAME[i]` is a handle and `NAME.gather()` brings the values here")
    resume: bool = _option(False, "switch", "pick up the last run of this same cell (same items and inputs), from "
                           "its journal: only the items it did not finish run (a new kernel finds it too)")
    cluster: str | None = _option(None, "text", "use the named cluster instead of the current one", "NAME",
                                  python='on="NAME"')
    objective: str | None = _option(None, "text", "the metric (from `nbcluster.report` or the result) that ranks "
                                    "the trials, and which way: the live table and `best()` use it; without it the "
                                    "table claims no order", "NAME:min|max")
    stopper: Any = _option(None, "expr", "stop losing trials early from their reports of the objective: `asha` or "  # noqa: RUF009
                           "`median`, each with parameters such as `asha(grace=1, eta=3, max_t=27)` (the defaults) "
                           "or `median(grace=3, min_trials=3)`", "POLICY", flag="stop")
    timeout: str | float | None = _option(None, "text", "stop an item that runs longer than this, such as `90s`, "
                                          "`10m` or `2h` (seconds in Python): it ends timed out", "DURATION")
    # fmt: on

    def __post_init__(self) -> None:
        into, local, batch, ranks = self.into, self.local, self.batch, self.ranks
        if into is not None and (not isinstance(into, str) or not into.isidentifier() or keyword.iskeyword(into)):
            raise BadArgument(f"--into needs a Python variable name, got {into!r}")
        for name, value in (("gpus", self.gpus), ("cpus", self.cpus)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
                raise BadArgument(f"--{name} needs a number above 0, got {value!r}")
        if self.cpu_only and self.gpus:
            raise BadArgument("--cpu-only and --gpus contradict each other: pick one")
        if not _whole(self.retries) or self.retries < 0:
            raise BadArgument(f"--retries needs a whole number of 0 or more, got {self.retries!r}")
        if batch != "auto" and (not _whole(batch) or batch < 1):
            raise BadArgument(f"--batch needs `auto` or a whole number of 1 or more, got {batch!r}")
        if self.seed is not None and not _whole(self.seed):
            raise BadArgument(f"--seed needs a whole number, got {self.seed!r}")
        if local not in ("all", True, False) and (not _whole(local) or local < 0):
            raise BadArgument(f"--local needs a whole number of 0 or more (or nothing, for all items), got {local!r}")
        if self.everywhere and any(v is not None for v in (self.over, self.grid, self.zip)):
            raise BadArgument("--everywhere runs the cell once per worker: it cannot be combined with --over/--grid/--zip")
        if self.persist and into is None:
            raise BadArgument("--persist keeps the results on the workers: name them with --into NAME")
        if self.persist and batch not in ("auto", 1):
            raise BadArgument(f"--persist runs each item as a Dask task of its own, holding its value: drop --batch {batch}")
        if self.persist and local not in (0, False):
            raise BadArgument("--persist keeps the results on the workers, --local runs items in the kernel: drop one of them")
        if ranks is not None and (not _whole(ranks) or ranks < 1):
            raise BadArgument(f"--ranks needs a whole number of 1 or more, got {ranks!r}")
        # `--ranks N` is one job: nothing that makes or keeps several independent items.
        clashes = [flag for flag, on in (
            ("--over", self.over is not None), ("--grid", self.grid is not None), ("--zip", self.zip is not None),
            ("--everywhere", self.everywhere), ("--persist", self.persist),
            ("--local", local not in (0, False)), ("--retries", bool(self.retries)),
        ) if on and ranks is not None]  # fmt: skip
        if clashes:
            raise BadArgument(f"--ranks {ranks} runs the cell as one job of {ranks} ranks that start and fail together: "
                              f"it cannot be combined with {', '.join(clashes)}; drop {'it' if len(clashes) == 1 else 'them'}")  # fmt: skip
        if self.everywhere and self.resume:
            raise BadArgument("--everywhere runs are not journaled (their items are the workers of now): drop --resume")
        stops = self.stopper is not None or self.timeout is not None
        if stops or self.objective is not None:  # (a plain run loads none of trials.py and stoppers.py)
            self.rules()  # each of --objective, --stop and --timeout alone
        if self.stopper is not None and self.objective is None:
            raise BadArgument("--stop judges trials by their objective: add --objective NAME:min|max")
        if stops and batch not in ("auto", 1):
            raise BadArgument(f"--stop and --timeout stop items one at a time (one a task): drop --batch {batch}")
        if self.everywhere and (stops or self.objective is not None):
            raise BadArgument("--everywhere runs set-up code once per worker: drop --stop/--timeout/--objective")
        if self.everywhere and local not in (0, False):
            raise BadArgument("--everywhere runs on the workers; it cannot be combined with --local")

    def rules(self) -> Rules:
        """What judges the run's trials: ``--objective``, ``--stop`` and ``--timeout``, each parsed.

        Returns
        -------
        Rules
            The parsed rules; each is None when its flag is not given.

        Raises
        ------
        nbcluster.errors.BadArgument
            For a malformed value, naming the flag.
        """
        return Rules(Objective.parse(self.objective), make(self.stopper), parse_timeout(self.timeout))


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


FLAGS: tuple[Flag, ...] = tuple(
    Flag(f.metadata["flag"] or f.name.replace("_", "-"), f.name, f.metadata["kind"], f.metadata["metavar"],
         f.metadata["help"], f.default, f.metadata["python"] or f"{f.name}={f.default!r}")
    for f in fields(DistributeOptions)
)
_BY_NAME = {f.name: f for f in FLAGS}
_WHAT = "Run the cell on the cluster, once per item (once, without --over/--grid/--zip)."


def usage() -> str:
    """The one-line usage that messages end with: ``%%distribute [--over ...] ...``.

    Returns
    -------
    str
        The usage, made from the declaration.
    """
    return "%%distribute " + " ".join(f"[{f.usage}]" for f in FLAGS)


def help_text() -> str:
    """`%%distribute?`: the usage and every flag, with its help, from the declaration.

    Returns
    -------
    str
        The usage, what the magic does, then each flag's usage and help.
    """
    flags = [f"  {f.usage}\n{textwrap.fill(f.help, 88, initial_indent=' ' * 8, subsequent_indent=' ' * 8)}"
             for f in FLAGS]  # fmt: skip
    return "\n".join([f"usage: {usage()}", "", _WHAT, "", "options:", *flags, ""])


def parse_distribute_line(line: str) -> dict[str, Any]:
    """Keyword arguments for `launch()` (what `distribute()` calls) from a `%%distribute` line.

    Parameters
    ----------
    line : str
        The magic's line, without ``%%distribute``. Values may hold spaces inside brackets or
        quotes (``--over "x in range(3)"``).

    Returns
    -------
    dict
        The arguments `launch()` takes, with ``first_line`` 2 (the cell's body starts on
        the notebook cell's second line).

    Raises
    ------
    nbcluster.errors.BadArgument
        For an unknown or repeated flag, a missing or bad value, or flags that do not go
        together; the message says which.

    Examples
    --------
    >>> parse_distribute_line('--over "x in range(3)" --into res --no-wait')
    {'first_line': 2, 'over': 'x in range(3)', 'into': 'res', 'wait': False}
    """
    groups: list[tuple[Flag, list[str]]] = []  # each flag with the words after it
    for word in _words(line):
        if word.startswith("--"):
            name, eq, rest = word[2:].partition("=")
            if name not in _BY_NAME:
                close = difflib.get_close_matches(name, list(_BY_NAME), n=1)
                hint = f"; did you mean --{close[0]}?" if close else ""
                raise BadArgument(f"unknown option --{name}{hint} Usage: {usage()}")
            groups.append((_BY_NAME[name], [rest] if eq else []))
        elif not groups:
            raise BadArgument(f"unexpected {word!r} before any --option. Usage: {usage()}")
        else:
            groups[-1][1].append(word)
    options: dict[str, Any] = {}
    for flag, words in groups:
        if flag.dest in options:
            raise BadArgument(f"--{flag.name} is given twice")
        options[flag.dest] = _read(flag, words)
    DistributeOptions(**options)  # the rules across flags, and the ranges
    return {"first_line": 2, **options}  # the %%distribute line is the cell's line 1


def parse_wait_line(line: str) -> str:
    """The NAME of `%distribute wait NAME`; any other line magic use is a mistake.

    Parameters
    ----------
    line : str
        The line magic's line, such as ``wait res``.

    Returns
    -------
    str
        NAME, the variable holding the results of a ``--no-wait`` cell.

    Raises
    ------
    nbcluster.errors.BadArgument
        For anything but ``wait NAME``: the message gives the usage, or says to write
        ``%%distribute`` (two %) to run a cell.
    """
    words = _words(line)
    if len(words) == 2 and words[0] == "wait" and words[1].isidentifier():
        return words[1]
    if words[:1] == ["wait"]:
        raise BadArgument("usage: %distribute wait NAME, where NAME holds the results of a --no-wait cell")
    raise BadArgument("%distribute as a line magic only takes `wait NAME` (the journaled runs: `%cluster runs`); to "
                      "run a cell on the cluster, put %%distribute (two %) on the first line of the cell")  # fmt: skip


# A string literal (a quote, then escaped or other characters up to the same quote), a
# bracket, a run of whitespace, a quote that opens no literal (unterminated), anything else.
_PIECE = re.compile(r"""('{3}|"{3}|'(?!'')|"(?!""))(?:\\.|(?!\1)[^\\])*\1|(?P<open>[([{])|(?P<close>[)\]}])|(?P<space>\s+)"""
                    r"""|(?P<quote>['"])|[^\s'"()[\]{}]+""", re.S)  # fmt: skip


def _words(line: str) -> list[str]:
    """Split on whitespace outside brackets and string literals."""
    words: list[str] = []
    current, depth = "", 0
    for piece in _PIECE.finditer(line):
        if piece["quote"]:
            raise BadArgument(f"unterminated string in the %%distribute line: {line.strip()}")
        if piece["space"] and depth <= 0:
            words, current = [*words, current] if current else words, ""
        else:
            depth += bool(piece["open"]) - bool(piece["close"])
            current += piece[0]
    if depth > 0:
        raise BadArgument(f"unclosed bracket in the %%distribute line: {line.strip()}")
    return [*words, current] if current else words


_EXPECTED = {"amount": "a number", "count": "a whole number", "int": "a whole number",
             "batch": "`auto` or a whole number", "local": "a whole number (or nothing, for all items)"}  # fmt: skip


def _read(flag: Flag, words: list[str]) -> Any:
    """The value of `--flag` from the words after it, by the flag's kind; ranges are
    `DistributeOptions`' job. A value that is one string literal is unwrapped:
    `"x in range(3)"` -> `x in range(3)`."""
    if flag.kind == "switch":
        if words:
            raise BadArgument(f"--{flag.name} takes no value (got {' '.join(words)!r})")
        return not flag.default
    if flag.kind == "local" and not words:
        return "all"
    text = " ".join(words)
    with contextlib.suppress(SyntaxError, ValueError):
        node = ast.parse(text, mode="eval").body
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else text
    text = text.strip()
    if not text:
        raise BadArgument(f"--{flag.name} needs a value. Usage: {usage()}")
    if flag.kind == "expr":
        return text
    if len(text.split()) != 1:
        raise BadArgument(f"--{flag.name} takes one value, got {text!r}")
    if flag.kind in ("name", "text") or (flag.kind, text) in (("batch", "auto"), ("local", "all")):
        return text
    try:
        number = float(text) if flag.kind == "amount" else int(text)
        if not math.isfinite(number):
            raise ValueError(text)
    except ValueError:
        raise BadArgument(f"--{flag.name} needs {_EXPECTED[flag.kind]}, got {text!r}") from None
    # A whole amount stays an int: `--gpus 1` asks for the resource GPU=1, not 1.0.
    return int(number) if number == int(number) else number
