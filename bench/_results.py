"""One section of bench/RESULTS.md, replaced in place by a benchmark's `--write`."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().with_name("RESULTS.md")


def write_section(name: str, command: str, body: str) -> None:
    """Replace `## name` (or append it) with the command that produced `body`, then `body`."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    section = f"## {name}\n\nCommand: `{command.strip()}`\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)
