"""A real IPython kernel for tests that drive nbcluster the way a notebook does.

`Kernel` starts an ipykernel in its own process (with the environment a test gives it, e.g.
``DASK_CONFIG`` for profiles), runs cells and returns what a front end would show: the text
of stream and display outputs, and the error line of a failed cell. `submit` sends a cell
without waiting, so a test can act while it runs (cancel a batch job, cut a link) and then
`collect` its outputs. The kernel is always shut down by the context manager.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager


@dataclass
class Reply:
    text: str = ""
    error: str | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)

    def ok(self) -> Reply:
        assert self.error is None, f"the cell failed: {self.error}\n{self.text}"
        return self


class Kernel:
    def __init__(self, km: KernelManager):
        self.km = km
        self.kc = km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def submit(self, code: str) -> str:
        return self.kc.execute(code, store_history=True)

    def messages(self, msg_id: str, timeout: float = 120) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, content) of each iopub message of cell `msg_id`, in the order a front end
        shows them, until the kernel is idle again."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"the cell gave no output for {timeout} s") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return
            yield kind, content

    def collect(self, msg_id: str, timeout: float = 120) -> Reply:
        reply = Reply()
        try:
            for kind, content in self.messages(msg_id, timeout):
                if kind == "stream":
                    reply.text += content["text"]
                elif kind in ("execute_result", "display_data"):
                    reply.outputs.append(content["data"])
                    reply.text += content["data"].get("text/plain", "") + "\n"
                elif kind == "error":
                    reply.error = f"{content['ename']}: {content['evalue']}"
        except AssertionError as silent:
            raise AssertionError(f"{silent}; so far: {reply.text}") from None
        return reply

    def so_far(self, msg_id: str) -> str:
        """The text cell `msg_id` has shown until now, without waiting: for a failing test's message."""
        text = ""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                return text
            if msg["parent_header"].get("msg_id") == msg_id:
                content = msg["content"]
                text += content.get("text", "") or content.get("data", {}).get("text/plain", "")
                if msg["msg_type"] == "error":
                    text += f"{content['ename']}: {content['evalue']}"

    def run(self, code: str, timeout: float = 120) -> Reply:
        return self.collect(self.submit(code), timeout)

    def value(self, expression: str, timeout: float = 60) -> Any:
        """A Python literal the kernel computes (its repr, read back)."""
        import ast

        reply = self.run(f"print(repr({expression}))", timeout).ok()
        return ast.literal_eval(reply.text.strip())


@contextmanager
def kernel(env: dict[str, str] | None = None, cwd: str | None = None) -> Iterator[Kernel]:
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, **(env or {})}, cwd=cwd or os.getcwd())
    try:
        k = Kernel(km)
        try:
            yield k
        finally:
            k.kc.stop_channels()
    finally:
        km.shutdown_kernel(now=False)
