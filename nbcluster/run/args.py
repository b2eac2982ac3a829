"""The `%%distribute` line -> keyword arguments of `launch()`, the engine of `distribute()`.

Values of `--over`, `--grid` and `--zip` are Python expressions, which `shlex` would
mangle (it strips the quotes inside `['a b', 'c']`). So the line is split by a small
scanner that knows Python's brackets and string quotes: whitespace splits only outside
them, and a value runs until the next `--flag`. Quoting the whole value is allowed and
usual (`--over "x in range(10)"`), and so is leaving it bare (`--over x in range(10)`).
Each flag with its whole value then goes, as one `--flag=value` word, to an argparse
parser made from the declaration (`options.DistributeOptions`), which reads the values;
`DistributeOptions` checks them.

Why not `tokenize`: the line is not Python but words with Python inside, and tokenize
does not tell its mistakes apart the way this line needs: an unterminated quote comes
back as an error token (not an error) before Python 3.12 and as a TokenError from 3.12,
a stray `)` or `$` is an error in one version and a token in another, a `#` starts a
comment, and f-strings split into several tokens from 3.12. Matching the scanner's
behaviour took as many special cases as the scanner has lines (tried: issue 17).

Nothing is evaluated here: expressions go to `launch()`, which evaluates them in the
user's namespace and reports their errors.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
from typing import Any

from nbcluster.errors import BadArgument
from nbcluster.run.options import FLAGS, DistributeOptions, Flag

_BY_NAME = {f.name: f for f in FLAGS}


@functools.cache
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="%%distribute", add_help=False, exit_on_error=False, argument_default=argparse.SUPPRESS,
        description="Run the cell on the cluster, once per item (once, without --over/--grid/--zip).",
    )  # fmt: skip
    for f in FLAGS:
        help_ = f.help.replace("%", "%%")  # argparse %-formats help
        if f.kind == "switch":
            action = "store_false" if f.default is True else "store_true"
            parser.add_argument(f"--{f.name}", dest=f.dest, action=action, help=help_)
        elif f.kind == "local":
            parser.add_argument(
                f"--{f.name}", dest=f.dest, nargs="?", const="all", metavar=f.metavar.strip("[]"),
                type=functools.partial(_read, f), help=help_,
            )  # fmt: skip
        else:
            parser.add_argument(
                f"--{f.name}", dest=f.dest, metavar=f.metavar, type=functools.partial(_read, f), help=help_
            )
    return parser


def usage() -> str:
    """The one-line usage that messages end with.

    Returns
    -------
    str
        ``%%distribute [--over ...] ...``, made by the same parser that reads the line.
    """
    return " ".join(_parser().format_usage().split()).removeprefix("usage: ")


def help_text() -> str:
    """`%%distribute?`: the usage and every flag, from the declaration.

    Returns
    -------
    str
        The parser's help: usage, then each flag with its help text.
    """
    return _parser().format_help()


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
    return dict(_parsed(line))


@functools.lru_cache(maxsize=64)
def _parsed(line: str) -> tuple[tuple[str, Any], ...]:
    # A cell is run again and again with the same line, and argparse took 0.15 ms of each
    # run: the result of a line is kept (its values are strings, numbers and flags).
    argv: list[str] = []
    seen: set[str] = set()
    for flag, words in _split_flags(_words(line)):
        if flag.name in seen:
            raise BadArgument(f"--{flag.name} is given twice")
        seen.add(flag.name)
        argv.append(_argument(flag, words))
    try:
        options = vars(_parser().parse_args(argv))
    except argparse.ArgumentError as e:
        raise BadArgument(e.message) from None
    DistributeOptions(**options)  # the rules across flags, and the ranges
    # The %%distribute line is line 1 of the notebook cell, so the body starts at line 2.
    return tuple({"first_line": 2, **options}.items())


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
    raise BadArgument(
        "%distribute as a line magic only takes `wait NAME` (the journaled runs: `%cluster runs`); to run a cell "
        "on the cluster, put %%distribute (two %) on the first line of the cell"
    )


def _words(line: str) -> list[str]:
    """Split on whitespace outside brackets and string literals."""
    words: list[str] = []
    current: list[str] = []
    depth = 0
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            current.append(ch)
            if ch == "\\" and i + 1 < len(line):
                current.append(line[i + 1])
                i += 1
            elif line.startswith(quote, i):
                current.extend(quote[1:])
                i += len(quote) - 1
                quote = ""
        elif ch in "'\"":
            quote = ch * 3 if line.startswith(ch * 3, i) else ch
            current.append(quote)
            i += len(quote) - 1
        elif ch in "([{":
            depth += 1
            current.append(ch)
        elif ch in ")]}":
            depth -= 1
            current.append(ch)
        elif ch.isspace() and depth <= 0:
            if current:
                words.append("".join(current))
                current = []
        else:
            current.append(ch)
        i += 1
    if quote:
        raise BadArgument(f"unterminated string in the %%distribute line: {line.strip()}")
    if depth > 0:
        raise BadArgument(f"unclosed bracket in the %%distribute line: {line.strip()}")
    if current:
        words.append("".join(current))
    return words


def _split_flags(words: list[str]) -> list[tuple[Flag, list[str]]]:
    groups: list[tuple[Flag, list[str]]] = []
    for word in words:
        if word.startswith("--"):
            name, eq, rest = word[2:].partition("=")
            if name not in _BY_NAME:
                raise BadArgument(_unknown(word))
            groups.append((_BY_NAME[name], [rest] if eq else []))
        elif not groups:
            raise BadArgument(f"unexpected {word!r} before any --option. Usage: {usage()}")
        else:
            groups[-1][1].append(word)
    return groups


def _unknown(word: str) -> str:
    close = difflib.get_close_matches(word[2:].partition("=")[0], list(_BY_NAME), n=1)
    hint = f"; did you mean --{close[0]}?" if close else ""
    return f"unknown option {word.partition('=')[0]}{hint} Usage: {usage()}"


def _unquote(text: str) -> str:
    """`"x in range(3)"` -> `x in range(3)`: a value that is one string literal is unwrapped."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return text


def _argument(flag: Flag, words: list[str]) -> str:
    """One flag and its whole value as one argparse word: `--over=x in xs` (a value that
    starts with `-` is then never taken for a flag)."""
    if flag.kind == "switch":
        if words:
            raise BadArgument(f"--{flag.name} takes no value (got {' '.join(words)!r})")
        return f"--{flag.name}"
    if flag.kind == "local" and not words:
        return f"--{flag.name}"
    text = _unquote(" ".join(words)).strip() if words else ""
    if not text:
        raise BadArgument(f"--{flag.name} needs a value. Usage: {usage()}")
    return f"--{flag.name}={text}"


_EXPECTED = {
    "amount": "a number",
    "count": "a whole number",
    "int": "a whole number",
    "batch": "`auto` or a whole number",
    "local": "a whole number (or nothing, for all items)",
}


def _read(flag: Flag, text: str) -> Any:
    """The value of `--flag=text`, by the flag's kind; ranges are `DistributeOptions`' job."""
    if flag.kind == "expr":
        return text
    if len(text.split()) != 1:
        raise argparse.ArgumentTypeError(f"--{flag.name} takes one value, got {text!r}")
    if flag.kind in ("name", "text") or (flag.kind, text) in (("batch", "auto"), ("local", "all")):
        return text
    try:
        number = float(text) if flag.kind == "amount" else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--{flag.name} needs {_EXPECTED[flag.kind]}, got {text!r}"
        ) from None
    # A whole amount stays an int: `--gpus 1` asks for the resource GPU=1, not 1.0.
    return int(number) if number == int(number) else number
