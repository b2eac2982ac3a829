"""The stop buttons of a trial run's live view, and how the view learns whether they work.

A cell that waits for its run keeps the kernel's main shell busy, and a comm message from
the front end (a button's click) normally waits behind it until the cell ends: too late to
stop anything. JupyterLab >= 4.4 with ipykernel >= 7 sends comm messages on a kernel
*subshell* (JupyterLab's ``commsOverSubshells`` setting, one subshell per comm target by
default), whose own thread handles them while the cell runs. Nothing in the kernel can tell
beforehand which front end draws the view, or how it is set, so the view asks:

    front end (first render)   {"kind": "hello"}           -> kernel, on whichever thread
    kernel (handling it)       {"kind": "controls"}        -> front end: clicks arrive now
    front end (a click)        {"kind": "stop", "item": 3} or {"kind": "stop_all"}

The first hello may leave before JupyterLab has the comm's subshell (it asks for one as the
comm opens), on the main shell, behind the cell: the view says hello again on its next
updates, a second or more apart, five times at most. The buttons show once an answer has
come. Until then, and for the whole run where the
hello waits behind the cell (Notebook 7 or JupyterLab with comms over subshells disabled,
ipykernel < 7, VS Code), the view says to press Ctrl-C, which asks every running trial to
stop the same way (`Trials.stop_all`). A stop from a button is `Results.stop`: asked at
once, forced after ``nbcluster.stop.grace``; the item ends *stopped*, the others go on.

The handler runs on the subshell's thread, beside the poller's; it only calls the run's
thread-safe stop verbs and sends one message, never a trait change.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, TypedDict

logger = logging.getLogger(__name__)

RUNNING_SHOWN = 20  # running trials with a stop button each; the rest by "stop all"


class RunningTrial(TypedDict):
    """A running trial, as the view lists it with its stop button."""

    item: int
    label: str  # "3: lr=0.1, depth=4"


class ControlsState(TypedDict):
    """The ``controls`` trait: what can be stopped now (`TrialControls.state`)."""

    running: list[RunningTrial]
    more: int  # running trials not listed


class ToKernel(TypedDict, total=False):
    """A message of the view to the kernel: ``kind`` hello, stop (with ``item``) or stop_all."""

    kind: Literal["hello", "stop", "stop_all"]
    item: int


class ToView(TypedDict):
    """The kernel's answer to a hello: the front end's messages reach it while the cell runs."""

    kind: Literal["controls"]


class TrialControls:
    """A trial run's stop verbs, as the live view's buttons use them.

    Parameters
    ----------
    results : Results
        The run; its ``_trials`` is not None.
    """

    def __init__(self, results: Any) -> None:
        self.results = results
        self.trials = results._trials

    def state(self) -> ControlsState:
        """The running trials the view offers to stop (at most `RUNNING_SHOWN`).

        Returns
        -------
        ControlsState
            ``running`` (item and label) and ``more`` (those left out).
        """
        states = self.results.states
        finals = set(self.trials.running.finals)
        running = [i for i in sorted(list(self.trials.running.begun)) if i not in finals and states[i] == "running"]
        label = self.trials.items.label
        shown: list[RunningTrial] = [{"item": i, "label": label(i)} for i in running[:RUNNING_SHOWN]]
        return {"running": shown, "more": max(0, len(running) - RUNNING_SHOWN)}

    def handle(self, message: Any, answer: Any) -> None:
        """Act on one message of the view; a malformed one is logged and ignored.

        Parameters
        ----------
        message : ToKernel
            What the view sent.
        answer : callable
            Sends a `ToView` back to the view (the widget's ``send``).
        """
        kind = message.get("kind") if isinstance(message, dict) else None
        if kind == "hello":
            reply: ToView = {"kind": "controls"}
            answer(reply)
        elif (
            kind == "stop"
            and isinstance(message.get("item"), int)
            and 0 <= message["item"] < len(self.results)
        ):
            self.results.stop(message["item"])
        elif kind == "stop_all":
            self.trials.stop_all()
        else:
            logger.info("nbcluster live view: ignored a message from the front end: %r", message)


def controls_for(results: Any) -> TrialControls | None:
    """The stop verbs of a trial run's view; None for any other run (no buttons).

    Parameters
    ----------
    results : Results
        The run the view follows.

    Returns
    -------
    TrialControls or None
    """
    return TrialControls(results) if getattr(results, "_trials", None) is not None else None
