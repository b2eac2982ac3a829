"""The `%%distribute` line -> keyword arguments of `distribute()`.

Values of `--over`, `--grid` and `--zip` are Python expressions, which `shlex` would
mangle (it strips the quotes inside `['a b', 'c']`). So the line is split by a small
scanner that knows Python's brackets and string quotes: whitespace splits only outside
them, and a value runs until the next `--flag`. Quoting the whole value is allowed and
usual (`--over "x in range(10)"`), and so is leaving it bare (`--over x in range(10)`).

Nothing is evaluated here: expressions go to `distribute()`, which evaluates them in the
user's namespace and reports their errors. This module only says which flags exist and
whether their literal values (counts, names, seeds) are well formed.
"""

from __future__ import annotations

import ast
import difflib
import keyword
from typing import Any

from nbcluster.errors import BadArgument

USAGE = (
    '%%distribute [--over "x in ITERABLE"] [--grid "a=[...], b=[...]"] [--zip "a=[...], b=[...]"] '
    "[--into NAME] [--gpus N] [--cpus N] [--cpu-only] [--retries N] [--batch auto|N] [--no-wait] "
    "[--seed S] [--everywhere] [--local [K]] [--cluster NAME]"
)

# flag -> (keyword of distribute(), kind); kind "switch" takes no value.
_FLAGS: dict[str, tuple[str, str]] = {
    "over": ("over", "expr"),
    "grid": ("grid", "expr"),
    "zip": ("zip", "expr"),
    "into": ("into", "name"),
    "gpus": ("gpus", "amount"),
    "cpus": ("cpus", "amount"),
    "cpu-only": ("cpu_only", "switch"),
    "retries": ("retries", "count"),
    "batch": ("batch", "batch"),
    "no-wait": ("wait", "switch"),
    "seed": ("seed", "int"),
    "everywhere": ("everywhere", "switch"),
    "local": ("local", "local"),
    "cluster": ("cluster", "text"),
}


def parse_distribute_line(line: str) -> dict[str, Any]:
    """Keyword arguments for `distribute()` from a `%%distribute` line.

    >>> parse_distribute_line('--over "x in range(3)" --into res --no-wait')
    {'first_line': 2, 'over': 'x in range(3)', 'into': 'res', 'wait': False}
    """
    # The %%distribute line is line 1 of the notebook cell, so the body starts at line 2.
    kwargs: dict[str, Any] = {"first_line": 2}
    seen: set[str] = set()
    for flag, words in _split_flags(_words(line)):
        keyword_, kind = _FLAGS[flag]
        if flag in seen:
            raise BadArgument(f"--{flag} is given twice")
        seen.add(flag)
        kwargs[keyword_] = _value(flag, kind, words)
    return kwargs


def parse_wait_line(line: str) -> str:
    """The NAME of `%distribute wait NAME`; any other line magic use is a mistake."""
    words = _words(line)
    if len(words) == 2 and words[0] == "wait" and words[1].isidentifier():
        return words[1]
    if words[:1] == ["wait"]:
        raise BadArgument("usage: %distribute wait NAME, where NAME holds the results of a --no-wait cell")
    raise BadArgument(
        "%distribute as a line magic only takes `wait NAME`; to run a cell on the cluster, "
        "put %%distribute (two %) on the first line of the cell"
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


def _split_flags(words: list[str]) -> list[tuple[str, list[str]]]:
    groups: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--"):
            name, eq, rest = word[2:].partition("=")
            if name not in _FLAGS:
                raise BadArgument(_unknown(word))
            groups.append((name, [rest] if eq else []))
        elif not groups:
            raise BadArgument(f"unexpected {word!r} before any --option. Usage: {USAGE}")
        else:
            groups[-1][1].append(word)
    return groups


def _unknown(word: str) -> str:
    close = difflib.get_close_matches(word[2:].partition("=")[0], list(_FLAGS), n=1)
    hint = f"; did you mean --{close[0]}?" if close else ""
    return f"unknown option {word.partition('=')[0]}{hint} Usage: {USAGE}"


def _unquote(text: str) -> str:
    """`"x in range(3)"` -> `x in range(3)`: a value that is one string literal is unwrapped."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return text


def _value(flag: str, kind: str, words: list[str]) -> Any:
    if kind == "switch":
        if words:
            raise BadArgument(f"--{flag} takes no value (got {' '.join(words)!r})")
        return flag != "no-wait"
    if kind == "local" and not words:
        return "all"
    if not words:
        raise BadArgument(f"--{flag} needs a value. Usage: {USAGE}")
    text = _unquote(" ".join(words)).strip()
    if kind == "expr":
        if not text:
            raise BadArgument(f"--{flag} needs a value. Usage: {USAGE}")
        return text
    if len(text.split()) != 1:
        raise BadArgument(f"--{flag} takes one value, got {text!r}")
    if kind == "name":
        if not text.isidentifier() or keyword.iskeyword(text):
            raise BadArgument(f"--{flag} needs a Python variable name, got {text!r}")
        return text
    if kind == "text":
        return text
    if kind == "batch" and text == "auto":
        return "auto"
    if kind == "local" and text == "all":
        return "all"
    try:
        number = float(text) if kind == "amount" else int(text)
    except ValueError:
        expected = {
            "amount": "a number",
            "count": "a whole number",
            "int": "a whole number",
            "batch": "`auto` or a whole number",
            "local": "a whole number (or nothing, for all items)",
        }[kind]
        raise BadArgument(f"--{flag} needs {expected}, got {text!r}") from None
    if kind == "amount":
        if number <= 0:
            raise BadArgument(f"--{flag} needs a number above 0, got {text}")
        return int(number) if number == int(number) else number
    if kind in ("count", "local") and number < 0:
        raise BadArgument(f"--{flag} needs a whole number of 0 or more, got {text}")
    if kind == "batch" and number < 1:
        raise BadArgument(f"--{flag} needs `auto` or a whole number of 1 or more, got {text}")
    return number
