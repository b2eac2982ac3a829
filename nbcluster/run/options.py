"""`%%distribute`'s options, declared once and checked once, and the magic's line, read into
them. The cell and its plan are `cell.py`'s.

**Options.** `DistributeOptions` is the declaration of `%%distribute`'s flags: each field is
one flag, with its kind of value (`kind`, below), its default (the field's) and its help.
The magic's parser, `%%distribute?` and the docs' option reference
(``docs/_ext/nbcluster_docs.py``, checked by ``tests/test_docs.py``) are made from it.
Constructing one checks the values, each by its kind, and the rules between flags; `launch`
does, for the magic and for `distribute()` alike, so both reject the same input with the
same message.

Each field's name is the keyword of `api.launch`, which the magic calls. Python spells most
flags the same way in `distribute()`; the rest say how (``python``): what each item needs
is one ``needs=Needs(...)``, the cluster is ``on=``, and ``--everywhere`` and ``--ranks``
are functions of their own (`api.everywhere`, `api.ranks`).

Kinds of value, as read from the magic's line: ``expr`` a Python expression, kept as text;
``text`` one word; ``switch`` no value; and those with a range (`_RANGES`): ``name`` a
variable name, ``amount`` a number above 0, ``count`` a whole number of 0 or more,
``positive`` one of 1 or more, ``int`` any whole number, ``batch`` ``auto`` or a whole
number, ``local`` a whole number, or nothing for all items.

**The line.** Values of `--over`, `--grid` and `--zip` are Python expressions, which
`shlex` would mangle (it strips the quotes inside `['a b', 'c']`). So the line is split by
a small scanner that knows Python's brackets and string quotes: whitespace splits only
outside them, and a value runs until the next `--flag`. Quoting the whole value is allowed
and usual (`--over "x in range(10)"`), and so is leaving it bare (`--over x in range(10)`).
Each flag's value is then read by its declared kind (`_read`): a number where it reads as
one, else the text, which the range check then names. `tokenize` cannot be that scanner:
the line is not Python but words with Python inside, and tokenize's errors differ between
Python versions (an unterminated quote, a stray `)`, a `#`, f-strings). Nothing is
evaluated here: expressions go to `launch()`, which evaluates them in the user's namespace
and reports their errors.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import keyword
import math
import re
import textwrap
from collections.abc import Callable
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


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


#: The kinds of value with a range: what a value must be (the message says it), and the test.
_RANGES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "name": ("a Python variable name", lambda v: isinstance(v, str) and v.isidentifier() and not keyword.iskeyword(v)),
    "amount": ("a number above 0", lambda v: (_whole(v) or isinstance(v, float)) and math.isfinite(v) and v > 0),
    "count": ("a whole number of 0 or more", lambda v: _whole(v) and v >= 0),
    "positive": ("a whole number of 1 or more", lambda v: _whole(v) and v >= 1),
    "int": ("a whole number", _whole),
    "batch": ("`auto` or a whole number of 1 or more", lambda v: v == "auto" or (_whole(v) and v >= 1)),
    "local": ("a whole number of 0 or more (or nothing, for all items)",
              lambda v: isinstance(v, bool) or v == "all" or (_whole(v) and v >= 0)),
}  # fmt: skip


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
    ranks: int | None = _option(None, "positive", "run the cell as `N` ranks of one job (data-parallel training), all "
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
        given: dict[str, bool] = {}  # a flag is given where its value is not its default (`over` may be an array)
        for flag in FLAGS:
            value = getattr(self, flag.dest)
            given[flag.name] = value is not None if flag.default is None else bool(value != flag.default)
            if given[flag.name] and flag.kind in _RANGES and not _RANGES[flag.kind][1](value):
                raise BadArgument(f"--{flag.name} needs {_RANGES[flag.kind][0]}, got {value!r}")
        given["batch"] = self.batch not in ("auto", 1)  # one a task is what `--batch 1` asks anyway
        if self.persist and not given["into"]:
            raise BadArgument("--persist keeps the results on the workers: name them with --into NAME")
        if given["objective"] or given["stop"] or given["timeout"]:
            self.rules()  # each of --objective, --stop and --timeout alone (a plain run calls no trials.py)
        if given["stop"] and not given["objective"]:
            raise BadArgument("--stop judges trials by their objective: add --objective NAME:min|max")
        # What each way of running refuses, and why: one message for every clash.
        for way, why, refused in (
            ("cpu-only", "keeps items off GPU workers", ("gpus",)),
            ("over", "makes the items", ("grid", "zip")),
            ("grid", "makes the items", ("zip",)),
            ("ranks", "{ranks} runs the cell as one job of {ranks} ranks that start and fail together",
             ("over", "grid", "zip", "everywhere", "persist", "local", "retries")),
            ("everywhere", "runs the cell once per worker, as set-up code that is not journaled",
             ("over", "grid", "zip", "local", "resume", "objective", "stop", "timeout")),
            ("persist", "keeps the results on the workers, --local runs items in the kernel", ("local",)),
            ("persist", "runs each item as a Dask task of its own, holding its value", ("batch",)),
            ("stop", "stops items one at a time (one a task)", ("batch",)),
            ("timeout", "stops items one at a time (one a task)", ("batch",)),
        ):  # fmt: skip
            if given[way] and (clashes := [flag for flag in refused if given[flag]]):
                raise BadArgument(f"--{way} {why.format(ranks=self.ranks)}: it cannot be combined with --{', --'.join(clashes)}; "
                                  f"drop {'it' if len(clashes) == 1 else 'them'}")  # fmt: skip

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
    """The options of a `%%distribute` line, as keyword arguments of `launch()` (and of
    `DistributeOptions`, which `launch()` checks them with).

    Parameters
    ----------
    line : str
        The magic's line, without ``%%distribute``. Values may hold spaces inside brackets or
        quotes (``--over "x in range(3)"``).

    Returns
    -------
    dict
        The flags given, by their declared names, each value read by its kind; ranges and
        the rules between flags are `DistributeOptions`' to check.

    Raises
    ------
    nbcluster.errors.BadArgument
        For an unknown or repeated flag, or a missing or extra value; the message says
        which.

    Examples
    --------
    >>> parse_distribute_line('--over "x in range(3)" --into res --no-wait')
    {'over': 'x in range(3)', 'into': 'res', 'wait': False}
    """
    groups: dict[Flag, list[str]] = {}  # each flag with the words after it
    words: list[str] | None = None  # the current flag's
    for word in _words(line):
        if word.startswith("--"):
            name, eq, rest = word[2:].partition("=")
            if name not in _BY_NAME:
                close = difflib.get_close_matches(name, list(_BY_NAME), n=1)
                hint = f"; did you mean --{close[0]}?" if close else ""
                raise BadArgument(f"unknown option --{name}{hint} Usage: {usage()}")
            if _BY_NAME[name] in groups:
                raise BadArgument(f"--{name} is given twice")
            words = groups[_BY_NAME[name]] = [rest] if eq else []
        elif words is None:
            raise BadArgument(f"unexpected {word!r} before any --option. Usage: {usage()}")
        else:
            words.append(word)
    return {flag.dest: _read(flag, words) for flag, words in groups.items()}


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
    words, depth = [""], 0
    for piece in _PIECE.finditer(line):
        if piece["quote"]:
            raise BadArgument(f"unterminated string in the %%distribute line: {line.strip()}")
        if piece["space"] and depth <= 0:
            words.append("")
        else:
            depth += bool(piece["open"]) - bool(piece["close"])
            words[-1] += piece[0]
    if depth > 0:
        raise BadArgument(f"unclosed bracket in the %%distribute line: {line.strip()}")
    return [word for word in words if word]


def _read(flag: Flag, words: list[str]) -> Any:
    """The value of `--flag` from the words after it, by the flag's kind: a number where
    the kind is one and the text reads as one, else the text (`_RANGES` judges it). A value
    that is one string literal is unwrapped: `"x in range(3)"` -> `x in range(3)`."""
    if not words and flag.kind in ("switch", "local"):  # alone, a switch flips; `--local` runs every item here
        return True if flag.kind == "local" else not flag.default
    if flag.kind == "switch":
        raise BadArgument(f"--{flag.name} takes no value (got {' '.join(words)!r})")
    text = " ".join(words)
    if text.endswith(("'", '"')):  # only a literal can be one
        with contextlib.suppress(SyntaxError, ValueError):
            text = literal if isinstance(literal := ast.literal_eval(text), str) else text
    text = text.strip()
    if not text:
        raise BadArgument(f"--{flag.name} needs a value. Usage: {usage()}")
    if flag.kind == "expr":
        return text
    if len(text.split()) != 1:
        raise BadArgument(f"--{flag.name} takes one value, got {text!r}")
    with contextlib.suppress(ValueError):
        if flag.kind == "amount":  # a whole amount stays an int: `--gpus 1` asks for the resource GPU=1, not 1.0
            number = float(text)
            return int(number) if number.is_integer() else number
        if flag.kind in ("count", "positive", "int", "batch", "local"):
            return int(text)
    return text
