"""What the widget tests share: the display seam that records, and the tasks they run."""

from __future__ import annotations

import threading
import time
from typing import Any


class Recorder:
    """The display seam: keeps what would have been shown in a notebook output."""

    def __init__(self) -> None:
        self.shown: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.first_shown = threading.Event()

    def show(self, bundle: dict[str, Any]) -> None:
        self.shown.append(bundle)
        self.first_shown.set()

    def update(self, bundle: dict[str, Any]) -> None:
        self.updates.append(bundle)


def _task_functions():
    # Local functions are shipped by value: the cluster cannot import this test module.
    def square(x: int) -> int:
        time.sleep(0.05)
        return x * x

    def broken(x: int) -> int:
        raise ZeroDivisionError(x)

    return square, broken


square, broken = _task_functions()
