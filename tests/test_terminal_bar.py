"""A terminal's progress bar ends its line before item output (issue 21, defect 5).

Terminal IPython draws the bar in place with carriage returns; item output printed while
the cursor is still on the bar's line was glued onto it (`... ETA 3.0 s── item 2 (x=2) ──`).
Here the bar and the cell's output share one terminal-like stream, as on a real terminal.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from nbcluster.run.api import distribute
from nbcluster.widgets import TextBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def visible_lines(text: str) -> list[str]:
    """What a terminal shows: each line as its last carriage return left it."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_item_output_never_shares_the_bars_line(cluster: Any) -> None:
    term = Terminal()
    bar = TextBar(term)
    with contextlib.redirect_stdout(term), contextlib.redirect_stderr(term):
        res = distribute(
            "import time\ntime.sleep(0.05)\nprint('hello', x)\nx",
            namespace={},
            over="x in range(6)",
            batch=1,
            progress=lambda r: bar.update(r.counts()),
        )
        bar.finish(res.counts())
    lines = visible_lines(term.getvalue())
    assert any("── item" in line for line in lines)
    glued = [line for line in lines if "done (" in line and "──" in line]
    assert glued == [], lines
