"""The live widget through a real Jupyter kernel: comm messages, saved notebook, nbconvert.

A notebook is executed by nbclient in a real ipykernel against the session's cluster. Every
iopub message of the cell is recorded, so the test sees what a front end would receive:
the widget's comm_open, its progress updates, the display, and the final display update
that replaces the widget with the static picture. The executed notebook is then saved,
read back and converted to HTML, as a user would share it.

Two runs: one through the widget's generic API (`widgets.live` + `close()`), one through
a `%%distribute --grid` cell, whose widget appears after the default delay (0.75 s: the
cell's items sleep long enough to outlast it) and freezes by itself at the end of the cell.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from nbcluster.cluster.handle import ClusterHandle

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

SETUP = """\
%load_ext nbcluster
%cluster use {name}
import time
import nbcluster
from nbcluster import widgets
from distributed import as_completed
h = nbcluster.current()
client = h.client
"""

RUN = """\
def square(x):
    time.sleep(0.05)
    return x * x

counts = {"done": 0, "running": 0, "failed": 0, "total": 40}
lv = widgets.live(lambda: dict(counts), h.metrics, label="squares", delay=0.3, interval=0.1)
futures = client.map(square, range(40))
for f in as_completed(futures):
    counts["done"] += 1
lv.close()
values = client.gather(futures)
len(values), sum(values)
"""

# 12 items of 0.3 s on 2 workers: the run outlasts the widget's default delay.
GRID = """\
%%distribute --grid "lr=[1, 2, 3], depth=[10, 20, 30, 40]" --batch 1 --into results
import time
time.sleep(0.3)
lr * depth
"""

VALUES = "results.values()"


def live_updates(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state updates sent to the one live widget model a cell's messages open."""
    live_models = [
        m["content"]["comm_id"]
        for m in msgs
        if m["msg_type"] == "comm_open"
        and m["content"]["data"]["state"].get("_anywidget_id") == "nbcluster.widgets.widget.LiveWidget"
    ]
    assert len(live_models) == 1
    return [
        m["content"]["data"]["state"]
        for m in msgs
        if m["msg_type"] == "comm_msg"
        and m["content"]["comm_id"] == live_models[0]
        and m["content"]["data"].get("method") == "update"
    ]


class RecordingClient(NotebookClient):
    """nbclient, keeping every iopub message it processes (grouped by cell)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages: dict[int, list[dict[str, Any]]] = {}

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        self.messages.setdefault(cell_index, []).append(msg)
        return super().process_message(msg, cell, cell_index)


def test_kernel_sends_increasing_progress_and_saves_the_final_picture(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (SETUP.format(name=cluster.name), RUN, GRID, VALUES)]
    client = RecordingClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    msgs = client.messages[1]

    # The widget model opens, then progress updates stream in, increasing to the end.
    updates = live_updates(msgs)
    done = [s["progress"]["done"] for s in updates if "progress" in s]
    assert done == sorted(done) and len(set(done)) > 1, done
    final = [s["progress"] for s in updates if "progress" in s][-1]
    assert (final["done"], final["total"], final["state"]) == (40, 40, "done")
    # Only new task records travel, each once: together they are this run's 40 tasks.
    pushed = [t for s in updates if "delta" in s for t in s["delta"].get("tasks", [])]
    assert len(pushed) == 40 and {t["prefix"] for t in pushed} == {"square"}
    assert {t["worker"] for t in pushed} <= set(cluster.metrics()["workers"])

    # Shown once as a widget, then the same output is replaced by the static picture.
    shown = [m for m in msgs if m["msg_type"] == "display_data"]
    assert len(shown) == 1 and WIDGET_MIME in shown[0]["content"]["data"]
    display_id = shown[0]["content"]["transient"]["display_id"]
    frozen = [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert frozen and frozen[-1]["content"]["transient"]["display_id"] == display_id
    assert WIDGET_MIME not in frozen[-1]["content"]["data"]

    # The cell's result is the run's result; the saved notebook holds the final picture.
    result = nb.cells[1].outputs[-1]
    assert result["data"]["text/plain"] == str((40, sum(x * x for x in range(40))))
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    saved = nbformat.read(path, as_version=4)
    bundles = [o["data"] for o in saved.cells[1].outputs if o.get("output_type") == "display_data"]
    assert len(bundles) == 1 and WIDGET_MIME not in bundles[0]
    html = bundles[0]["text/html"]
    assert "nbc-static" in html and 'data-percent="100"' in html and 'data-state="done"' in html
    assert html.count('class="nbc-lane"') == 2
    assert html.count('class="nbc-task"') == 40
    assert "40 / 40 done (100%)" in bundles[0]["text/plain"]

    # The %%distribute run froze by itself at the end of its cell: 12 batches of one item,
    # the grid table in item order, equal to the results (read back in the next cell).
    grid_msgs = client.messages[2]
    assert [m for m in grid_msgs if m["msg_type"] == "display_data"]
    grid_updates = live_updates(grid_msgs)
    done = [s["progress"]["done"] for s in grid_updates if "progress" in s]
    assert done == sorted(done) and len(set(done)) > 1, done
    final = [s["progress"] for s in grid_updates if "progress" in s][-1]
    assert (final["done"], final["total"], final["state"]) == (12, 12, "done")
    pushed = [
        (t["worker"], t["start"], t["stop"])
        for s in grid_updates
        if "delta" in s
        for t in s["delta"].get("tasks", [])
    ]
    assert len(pushed) == len(set(pushed)) == 12
    grid_outputs = [o for o in saved.cells[2].outputs if o.get("output_type") == "display_data"]
    assert len(grid_outputs) == 1 and WIDGET_MIME not in grid_outputs[0]["data"]
    ghtml = grid_outputs[0]["data"]["text/html"]
    assert 'data-percent="100"' in ghtml and ghtml.count('class="nbc-task"') == 12
    assert ghtml.count('class="nbc-grid-row"') == 10  # the first ten of twelve
    values = ast.literal_eval(saved.cells[3].outputs[-1]["data"]["text/plain"])
    assert values == [lr * d for lr in (1, 2, 3) for d in (10, 20, 30, 40)]
    # No --objective: nothing says larger is better, so the rows keep item order and the
    # largest two (lr=3 with depth 30 and 40: 90, 120) are the ones cut.
    rows = re.findall(r'class="nbc-grid-row".*?</tr>', ghtml)
    shown = [re.findall(r">([^<>]+)</td>", row)[-1] for row in rows]
    assert shown == [str(v) for v in values[:10]], shown

    # nbconvert's HTML shows the same pictures, with no script needed to draw them.
    body, _ = HTMLExporter().from_notebook_node(saved)
    assert body.count('data-percent="100"') == 2 and body.count('class="nbc-lane"') == 4


MAGIC = """\
%load_ext nbcluster
%cluster use {name}
"""

MAGIC_CELL = """\
%%distribute --over "x in range(40)" --batch 1
import time
time.sleep(0.1)
x * x
"""


def test_distribute_magic_cell_ends_with_the_frozen_picture(cluster: ClusterHandle, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(MAGIC.format(name=cluster.name)),
        nbformat.v4.new_code_cell(MAGIC_CELL),
    ]
    client = RecordingClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    shown = [
        m
        for m in client.messages[1]
        if m["msg_type"] == "display_data" and WIDGET_MIME in m["content"]["data"]
    ]
    assert shown, "%%distribute showed no live widget"
    outputs = [o for o in nb.cells[1].outputs if o.get("output_type") == "display_data"]
    frozen = [o["data"]["text/html"] for o in outputs if "nbc-static" in o["data"].get("text/html", "")]
    assert len(frozen) == 1 and not [o for o in outputs if WIDGET_MIME in o["data"]]
    assert 'data-percent="100"' in frozen[0] and frozen[0].count('class="nbc-task"') == 40
    assert frozen[0].count('class="nbc-lane"') == 2


STATUS_CELLS = ["%load_ext nbcluster\n%cluster use {name}", "%cluster status", "1 + 1"]


def test_cluster_status_is_saved_as_a_picture_not_a_widget(cluster: ClusterHandle, tmp_path: Path) -> None:
    # Notebook 00 runs `%cluster status` and moves on: every saved copy used to hold the
    # live widget, which a reopened notebook shows as "Error displaying widget: model not
    # found". The view must freeze into the static picture once the next cell runs.
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(name=cluster.name)) for c in STATUS_CELLS]
    client = RecordingClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    shown = [m for m in client.messages[1] if m["msg_type"] == "display_data"]
    assert any(WIDGET_MIME in m["content"]["data"] for m in shown), "status showed no live view"
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    outputs = nbformat.read(path, as_version=4).cells[1].outputs
    assert not [o for o in outputs if WIDGET_MIME in o.get("data", {})], "a widget was saved"
    pictures = [
        o["data"]["text/html"] for o in outputs if "nbc-static" in o.get("data", {}).get("text/html", "")
    ]
    assert len(pictures) == 1 and 'class="nbc-resources"' in pictures[0]
