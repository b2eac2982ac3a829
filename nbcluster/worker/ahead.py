"""A run's first direct batch sends its first item's result ahead when the batch goes on.

Why. A run's first result should arrive one item's time after its start, whatever the other
items do: an item that blocks, or takes an hour, right behind the first (`run/policy.py`).
Until a batch could do that, the run's first batch was one item alone, and the probes
behind it shared out the rest. That alone batch was a request, an answer and a settle of
its own on the cell's critical path, in small cells and in cells of many tiny items alike.

How. The run's first direct batch is a probe like the others, with its first item at the
front, and its request says ``first``. Its worker answers once, as any batch, when it ends
within `AHEAD_S` of its start: every small cell does. When it is still going by then, and
its first item has finished (or when that item finishes later), the worker writes the first
item's result on the request's connection, ahead of the answer (``{"first": blob}``), and
leaves that item out of the answer. The kernel reads both on that one connection, so the
first always arrives before the rest, and delivers it as a batch of its own
(`run/direct.py`). No item is sent twice or left out: whether the first went ahead
is decided once, under a lock, by whichever of the two comes first, the batch's end (in its
thread) or the deadline (in the worker's event loop).

A first item that went ahead and a worker that then dies: the kernel delivered the first,
and sends the rest again, as it would for any broken batch.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

#: A first batch still running this long after its start sends its first item ahead.
AHEAD_S = 0.005


class FirstAhead:
    """Whether, and when, one batch's first item goes ahead of its answer (module docstring).

    Made in the worker's event loop by the request handler; `ran` is called from the pool's
    thread when the first item ends, `close` from it when the batch ends, `due` from the
    loop `AHEAD_S` after the start.

    Parameters
    ----------
    encode : callable
        The message that carries the first item's result (as `run_items` returns one).
        Called once it is decided to send it: if it raises, the first item is not sent
        ahead and stays in the answer.
    write : callable
        Sends a message on the request's connection (``comm.write``); called in the event
        loop, it returns an awaitable.
    loop : asyncio.AbstractEventLoop
        The worker's event loop.
    """

    def __init__(self, encode: Any, write: Any, loop: asyncio.AbstractEventLoop):
        self._encode = encode
        self._write = write
        self._loop = loop
        self._lock = threading.Lock()
        self._first: dict[str, Any] | None = None  # the first item's result, once it ended
        self._message: Any = None  # what goes ahead, once decided
        self._due = False
        self._state = "open"  # "sent": the first item goes ahead; "closed": the batch ended first
        self.written: asyncio.Future[Any] | None = None  # the ahead write, for the answer to wait on
        self.seconds = 0.0  # the first item's time, which the answer then leaves out

    def ran(self, first: dict[str, Any]) -> None:
        """The first item ended (in the pool's thread): its result, as `run_items` returns one.

        Parameters
        ----------
        first : dict
            ``values``, ``errors``, ``outputs``, ``count`` (1) and ``seconds`` of that item.
        """
        with self._lock:
            if self._state != "open":
                return
            self._first = first
            go = self._take() if self._due else False
        if go:
            self._loop.call_soon_threadsafe(self._send)

    def due(self) -> None:
        """`AHEAD_S` after the batch started (in the event loop): send the first if it ended."""
        with self._lock:
            self._due = True
            go = self._take() if self._first is not None else False
        if go:
            self._send()

    def close(self) -> bool:
        """The batch ended (in the pool's thread): whether its first item went ahead.

        Returns
        -------
        bool
            True when the answer must leave the first item out.
        """
        with self._lock:
            if self._state == "open":
                self._state = "closed"
            return self._state == "sent"

    def _take(self) -> bool:
        # Under the lock: the first item goes ahead unless the batch already ended. Encoded
        # here, so that one that cannot be is simply left in the answer.
        if self._state != "open":
            return False
        assert self._first is not None
        try:
            self._message = self._encode(self._first)
        except Exception:
            self._state = "closed"
            return False
        self._state = "sent"
        self.seconds = float(self._first["seconds"])
        return True

    def _send(self) -> None:
        self.written = asyncio.ensure_future(self._write(self._message))


def first_of(
    values: list[Any], errors: dict[int, Any], outputs: dict[Any, Any], first_index: Any, seconds: float
) -> dict[str, Any]:
    """The first item's part of a batch's running result, as a result of its own.

    Parameters
    ----------
    values, errors, outputs
        The batch's so far, as `run_items` fills them (``values`` holds at least one).
    first_index : int
        The run's index of the batch's first item (its key in ``outputs``).
    seconds : float
        The first item's time.

    Returns
    -------
    dict
        A result of one item, ``count`` 1.

    Examples
    --------
    >>> first_of([5, 6], {1: "e"}, {7: [["stdout", "hi"]]}, 7, 0.25)
    {'values': [5], 'errors': {}, 'outputs': {7: [['stdout', 'hi']]}, 'count': 1, 'seconds': 0.25, 'stopped': False}
    """
    return {
        "values": values[:1],
        "errors": {0: errors[0]} if 0 in errors else {},
        "outputs": {first_index: list(outputs[first_index])} if first_index in outputs else {},
        "count": 1,
        "seconds": seconds,
        "stopped": False,
    }


def without_first(result: dict[str, Any], first_index: Any, seconds: float) -> dict[str, Any]:
    """A batch's result with its first item left out: that item went ahead.

    Parameters
    ----------
    result : dict
        What `run_items` returned, with at least the first item run.
    first_index : int
        The run's index of that item.
    seconds : float
        Its time, taken off the batch's.

    Returns
    -------
    dict
        The same result for the items after the first: positions in ``errors`` one less.

    Examples
    --------
    >>> r = {"values": [5, 6, 7], "errors": {2: "e"}, "outputs": {0: ["a"], 1: ["b"]},
    ...      "count": 3, "seconds": 0.3, "stopped": False}
    >>> out = without_first(r, 0, 0.1)
    >>> out["values"], out["errors"], out["outputs"], out["count"], round(out["seconds"], 3)
    ([6, 7], {1: 'e'}, {1: ['b']}, 2, 0.2)
    """
    return {
        **result,
        "values": result["values"][1:],
        "errors": {j - 1: record for j, record in result["errors"].items() if j > 0},
        "outputs": {i: chunks for i, chunks in result["outputs"].items() if i != first_index},
        "count": result["count"] - 1,
        "seconds": max(0.0, result["seconds"] - seconds),
    }
