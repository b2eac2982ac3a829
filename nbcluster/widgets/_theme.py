"""``static/theme.json``, the one definition of how the graphs look, read from Python.

graphs.js imports the same file (the widget's ESM gets it inlined by `inline_theme`,
the sidebar's bundler resolves the import), so the frozen picture drawn by `_static` and
the live one drawn in the browser share every colour, font, size and label.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

STATIC = Path(__file__).parent / "static"
THEME: dict[str, Any] = json.loads((STATIC / "theme.json").read_text(encoding="utf-8"))
VARS: dict[str, str] = THEME["vars"]
TEXT: dict[str, str] = THEME["text"]

_IMPORT = re.compile(r'^import THEME from "\./theme\.json";\n', flags=re.M)


def _resolve(value: str) -> str:
    return re.sub(r"@(\w+)", lambda m: VARS[m.group(1)], value)


def _kebab(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "-" + m.group(0).lower(), name)


STYLES: dict[str, dict[str, str]] = {
    name: {_kebab(k): _resolve(v) for k, v in style.items()} for name, style in THEME["styles"].items()
}


def css(names: str, **extra: str) -> str:
    """The inline CSS of theme styles, as graphs.js's ``st(names, extra)`` builds it.

    Parameters
    ----------
    names : str
        Style names of theme.json, space-separated (later ones win).
    **extra : str
        More properties, snake_case (``font_size="11px"``).

    Returns
    -------
    str
        ``prop:value;...`` for a ``style`` attribute.
    """
    props: dict[str, str] = {}
    for name in names.split():
        props.update(STYLES[name])
    props.update({k.replace("_", "-"): v for k, v in extra.items()})
    return ";".join(f"{k}:{v}" for k, v in props.items())


def inline_theme(graphs_js: str) -> str:
    """graphs.js with its theme import replaced by the JSON itself (for a string-loaded module).

    Parameters
    ----------
    graphs_js : str
        The source of graphs.js.

    Returns
    -------
    str
        The same module with theme.json inlined.

    Raises
    ------
    RuntimeError
        When graphs.js does not import theme.json on exactly one line.
    """
    text, n = _IMPORT.subn(lambda _: f"const THEME = {json.dumps(THEME)};\n", graphs_js)
    if n != 1:
        raise RuntimeError("graphs.js must import theme.json on one line")
    return text
