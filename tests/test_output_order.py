"""In a notebook, a run's item output all goes below its live widget (issue 21, defect 6).

The widget appears `widget.delay` (0.75 s) after the start; item output printed before
that landed above it, the rest below (Notebook 7 showed items 0-3 over the widget and
item 4 under it). A real kernel runs the cell; the order of its iopub messages is the
order a notebook front end shows the outputs in.
"""

from __future__ import annotations

from typing import Any

from kernel_session import kernel

WIDGET = "application/vnd.jupyter.widget-view+json"
CELL = '%%distribute --over "x in range(8)" --batch 1\nimport time\ntime.sleep(0.3)\nprint("hello", x)\nx'


def outputs_in_order(k: Any, code: str, timeout: float = 120) -> list[str]:
    """'widget' or 'item' for each output of the cell, in the order the kernel sent them."""
    order: list[str] = []
    for kind, content in k.messages(k.submit(code), timeout):
        if kind == "stream" and "── item" in content["text"]:
            order.append("item")
        elif kind == "display_data" and WIDGET in content["data"]:
            order.append("widget")
        elif kind == "error":
            raise AssertionError(f"{content['ename']}: {content['evalue']}")
    return order


def test_item_output_comes_after_the_live_widget() -> None:
    with kernel() as k:
        k.run("%load_ext nbcluster\n%cluster start --workers 2 --threads 1").ok()
        try:
            order = outputs_in_order(k, CELL)
        finally:
            k.run("%cluster stop")
    assert "widget" in order and "item" in order, order
    assert order.index("widget") < order.index("item"), order
