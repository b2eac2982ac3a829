"""A trial run's stop buttons at the kernel's end, with a real kernel and a real subshell.

What JupyterLab >= 4.4 does for a widget's comm (``_controls.py``), done by hand over
jupyter_client: ask the kernel (ipykernel 7) for a subshell, and send the view's messages
on it while the cell blocks. The kernel answers the hello during the run, and a stop ends
its trial *stopped* while the other goes on. The same messages on the main shell wait
behind the cell. The browser test (``test_trial_controls_browser.py``) clicks the buttons.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest

from nbcluster.cluster.handle import ClusterHandle
from tests.kernel_session import Kernel, kernel
from tests.waiting import until

CELL = """\
%%distribute --over "x in range(2)" --objective loss:min --into runs
import time
import nbcluster
for step in range(600 if x == 0 else 60):
    nbcluster.report(step=step, loss=1.0 / (step + 1))
    time.sleep(0.05)
x
"""


def _subshell(k: Kernel) -> str:
    k.kc.control_channel.send(k.kc.session.msg("create_subshell_request", {}))
    reply = k.kc.control_channel.get_msg(timeout=30)
    return str(reply["content"]["subshell_id"])


def _send(k: Kernel, comm_id: str, content: dict[str, Any], subshell: str | None) -> None:
    msg = k.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": content}})
    msg["header"]["subshell_id"] = subshell
    k.kc.shell_channel.send(msg)


@pytest.mark.parametrize("on_subshell", [True, False])
def test_the_views_messages_are_answered_during_the_cell_only_on_a_subshell(
    cluster: ClusterHandle, on_subshell: bool
) -> None:
    with kernel() as k:
        k.run(f"%load_ext nbcluster\n%cluster use {cluster.name}").ok()
        subshell = _subshell(k) if on_subshell else None
        cell = k.submit(CELL if on_subshell else CELL.replace("600", "60"))
        comm_id = answered = None
        started = time.monotonic()
        hellos: list[float] = []
        while True:
            try:
                msg = k.kc.get_iopub_msg(timeout=60)
            except queue.Empty:
                raise AssertionError("the cell went quiet for 60 s") from None
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and content["data"]["state"].get("controls"):
                comm_id = content["comm_id"]  # the live view of a trial run: it has stop controls
            # As widget.js does: hello on the view's updates, 1 s apart, five times at most.
            due = len(hellos) < 5 and (not hellos or time.monotonic() - hellos[-1] >= 1)
            if kind.startswith("comm_") and content.get("comm_id") == comm_id and answered is None and due:
                assert comm_id is not None
                hellos.append(time.monotonic())
                _send(k, comm_id, {"kind": "hello"}, subshell)
            if kind == "comm_msg" and content["data"].get("content") == {"kind": "controls"}:
                answered = time.monotonic() - started
                assert comm_id is not None
                _send(k, comm_id, {"kind": "stop", "item": 0}, subshell)
            elif kind == "status" and msg["parent_header"].get("msg_id") == cell and content["execution_state"] == "idle":
                break
        assert comm_id is not None, "the trial run showed no live view with controls"
        states = k.value("runs.states")
        if on_subshell:
            assert answered is not None, "the hello on a subshell was not answered while the cell ran"
            assert states == ["stopped", "done"]  # trial 0 would have run 30 s
        else:
            assert answered is None  # it waited behind the cell; the view says to press Ctrl-C
            assert states == ["done", "done"]


def test_the_views_verbs_stop_all_and_ignore_what_they_do_not_know(cluster: ClusterHandle) -> None:
    import nbcluster
    from nbcluster.widgets._controls import controls_for

    def item(x: int) -> int:
        import time

        import nbcluster

        for step in range(600):  # 30 s unless stopped
            nbcluster.report(step=step, loss=1.0 / (step + 1))
            time.sleep(0.05)
        return x

    assert controls_for(nbcluster.distribute(lambda x: x, over=range(2))) is None  # not a trial run: no buttons
    runs = nbcluster.distribute(item, over=range(2), objective="loss:min", wait=False)
    controls = controls_for(runs)
    assert controls is not None
    sent: list[Any] = []
    controls.handle({"kind": "hello"}, sent.append)
    assert sent == [{"kind": "controls"}]
    assert until(lambda: len(controls.state()["running"]) == 2), controls.state()  # both have reported
    assert controls.state()["running"] == [{"item": 0, "label": "0: item=0"}, {"item": 1, "label": "1: item=1"}]
    for junk in ({"kind": "stop", "item": 7}, {"kind": "stop", "item": "0"}, {"kind": "reboot"}, ["stop"]):
        controls.handle(junk, sent.append)  # logged and ignored
    controls.handle({"kind": "stop_all"}, sent.append)
    runs.wait()
    assert runs.states == ["stopped", "stopped"] and len(sent) == 1
    assert controls.state() == {"running": [], "more": 0}
