"""Generated malformed lines for `%cluster`, the `nbcluster` command and `%%distribute`: each
gives one clean line (or works), never a traceback from nbcluster's internals.

The lines are random mixes of the real words and flags with quotes, brackets, dashes and
numbers (seeded, so a failure reproduces). No cluster runs in the test's registry, so a
`%cluster` line that happens to be valid cannot change anything, except `start`, which
always gets at least one defect mixed in. `%%distribute` lines run on the shared cluster,
so that they get past "no cluster" to the planning and the run; besides the character
soup, `flag_lines` gives well-formed flags with good and bad values. A line that works
must show its result and nothing on stderr.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from typing import Any

import dask
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbcluster
from nbcluster import cli, commands
from nbcluster.errors import BadArgument
from nbcluster.run.options import FLAGS
from nbcluster.run.results import Results
from tests.shell_helpers import one_clear_line

JUNK = ['"', "'", '"""', "(", ")", "[", "]", "{", "}", "-", "--", "---", "=", ",", ":", "\\", "#", ";",
        "0", "-1", "1.5", "1e9", "99999999999999999999", "nan", "-0", "x", "in", "None", "é", "🙂"]  # fmt: skip
# What `start` always carries at least one of, so that it never starts a cluster here.
DEFECTS = ['"', "'", "--zzz", ")", "--workers -1", "--threads x", "--memory 1", "--gpu-workers -2", "((", "start"]
CLUSTER_WORDS = [*commands.COMMANDS, "--workers", "--threads", "--memory", "--gpu-workers", "--gpus", "--name", "--keep",
                 "--dashboard", "--gpu-backend", "--kind", "--min", "--max", "--all", "cpu", "gpu", "local"]  # fmt: skip
DISTRIBUTE_WORDS = [f"--{flag.name}" for flag in FLAGS] + ["x in range(3)", "x", "in", "range(3)", "a=[1]", "auto"]


def _tokens(rng: random.Random, words: list[str], n: int) -> list[str]:
    return [rng.choice(words if rng.random() < 0.5 else JUNK) for _ in range(n)]


def cluster_lines(count: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        tokens = [rng.choice([*commands.COMMANDS, *JUNK]), *_tokens(rng, CLUSTER_WORDS, rng.randint(0, 5))]
        if "start" in tokens:
            tokens.insert(rng.randint(0, len(tokens)), rng.choice(DEFECTS))
        lines.append(tokens)
    return lines


def distribute_lines(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    glue = ["", " ", "  "]
    return [
        "".join(t + rng.choice(glue) for t in _tokens(rng, DISTRIBUTE_WORDS, rng.randint(1, 6)))
        for _ in range(count)
    ]


# After `%cluster stop`, within a bound or this fails: every Dask client is closed (an open
# one would reconnect and log), and every live view has stopped polling (`%cluster status`
# hands its view to no one, so they are found as the `Live` objects in the process). What
# any of them printed is then in the output.
QUIET_AFTER_STOP = """
import gc, sys, time
from distributed import Client
from nbcluster.widgets import Live
deadline = time.monotonic() + 10
while open_clients := [c for c in Client._instances if c.status != "closed"]:
    assert time.monotonic() < deadline, f"clients still open 10 s after the stop: {open_clients}"
    time.sleep(0.05)
views = [o for o in gc.get_objects() if isinstance(o, Live)]
assert all(view.ended.wait(10) for view in views), "a live view still polls 10 s after the stop"
sys.stdout.flush(); sys.stderr.flush()
"""

# Values for each kind of `%%distribute` flag (run/options.py), good ones and bad ones.
VALUES = {
    "expr": ['"x in range(3)"', '"a, b in [(1, 2), (3, 4)]"', '"a=[1, 2], b=[10, 20]"', '"x in []"',
             '"x in nope"', '"x in range(3"', '"x in 5"', '"a=[1], [2]"', '"a=[]"', '"a=[1, 2], b=[3]"'],
    "name": ["res", "out_2", "1x", "def", "é"],
    "amount": ["1", "0.5", "0", "-1", "x", "nan"],
    "count": ["0", "2", "-1", "x", "1.5"],
    "positive": ["1", "2", "0", "x"],
    "batch": ["auto", "1", "3", "0", "x"],
    "int": ["0", "7", "-1", "x"],
    "local": ["", "1", "0", "-1", "x"],
    "text": ["nope", "shared", '"a b"'],
    "switch": [""],
}  # fmt: skip


def flag_lines(count: int, seed: int) -> list[str]:
    """Lines of one to four real flags, each with a value that fits its kind or does not."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        flags = rng.sample(FLAGS, rng.randint(1, 4))
        lines.append(" ".join(f"--{f.name} {rng.choice(VALUES[f.kind])}".strip() for f in flags))
    return lines


def test_generated_cluster_lines_give_one_clean_line(shell: InteractiveShell, capsys: Any) -> None:
    bad, worked = [], []
    for tokens in cluster_lines(300, seed=1):
        line = " ".join(tokens)
        try:
            value = shell.run_line_magic("cluster", line)
        except UsageError as e:
            if not one_clear_line(str(e)):
                bad.append((line, str(e)))
        except Exception as e:  # anything else is a traceback in the notebook
            bad.append((line, f"{type(e).__name__}: {e}"))
        else:
            # A line that works shows what it did (a value, or printed lines), and only that.
            out, err = capsys.readouterr()
            worked.append(line)
            if (value is None and not out.strip()) or err:
                bad.append((line, f"showed {value!r}, printed {out!r}, stderr {err!r}"))
        capsys.readouterr()
    assert bad == []
    assert worked and nbcluster.clusters() == []


def test_generated_cli_arguments_give_one_line_and_status_2(runtime_dir: Any, capsys: Any) -> None:
    bad = []
    for argv in cluster_lines(200, seed=2):
        try:
            status = cli.main(argv)
        except BaseException as e:
            bad.append((argv, f"{type(e).__name__}: {e}"))
            continue
        out, err = capsys.readouterr()
        if status == 2 and not (err.startswith("nbcluster: error: ") and one_clear_line(err)):
            bad.append((argv, err))
        elif status == 0 and (not out.strip() or err):
            bad.append((argv, f"exit status 0 printed {out!r}, stderr {err!r}"))
        elif status not in (0, 2):
            bad.append((argv, f"exit status {status}: {err}"))
    assert bad == []


def test_generated_distribute_lines_give_one_clean_line_or_the_results(
    shell: InteractiveShell, cluster: Any, capsys: Any
) -> None:
    bad, worked = [], 0
    for line in distribute_lines(300, seed=3) + flag_lines(200, seed=4):
        for name in VALUES["name"]:
            shell.user_ns.pop(name, None)
        capsys.readouterr()
        # A run that lasts past the widget's delay shows its progress bar on stderr: on a loaded
        # machine a 2-rank job can, so the bar waits longer than any run here takes.
        with dask.config.set({"nbcluster.widget.delay": "1h"}):
            result = shell.run_cell(f"%%distribute {line}\n1\n")
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            if not (isinstance(error, UsageError) and one_clear_line(str(error))) or "no cluster is running" in str(error):
                bad.append((line, f"{type(error).__name__}: {error}"))
            continue
        # It ran: the cell's value, or the --into variable, holds every item's value, 1.
        into = next((n for n in VALUES["name"] if f"--into {n}" in line), None)
        res = shell.user_ns.get(into) if into else result.result
        if not isinstance(res, Results) or (into is not None and result.result is not None):
            bad.append((line, f"gave {result.result!r}, --into variable {res!r}"))
            continue
        res.wait(60)  # --no-wait gives it back at once
        worked += 1
        err = capsys.readouterr().err
        values = res.gather() if res.ok and "--persist" in line else res.values()  # --persist: handles
        if not (res.ok and len(res) and set(values) == {1}) or err:
            bad.append((line, f"{res.counts()}: {res.values()[:5]}, stderr {err!r}"))
    assert bad == []
    assert worked >= 20, worked  # the lines reach the run, not only the parser


def test_cluster_stop_in_terminal_ipython_prints_only_its_line(runtime_dir: Any, tmp_path: Any) -> None:
    script = tmp_path / "session.ipy"
    script.write_text(
        "%load_ext nbcluster\n%cluster start --workers 1\n"
        "from distributed import default_client\ndefault_client().submit(sum, [1, 2]).result()\n"
        f"%cluster status\n%cluster stop\n{QUIET_AFTER_STOP}\nprint('quiet')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", str(script)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "Stopped 'local'." in done.stdout and done.stdout.rstrip().endswith("quiet"), done.stdout
    assert done.stderr == ""


def test_cluster_stop_in_a_kernel_prints_only_its_line(runtime_dir: Any) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")

    def outputs(code: str) -> list[str]:
        seen: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                seen.append(f"{content['name']}: {content['text']}")
            elif kind in ("error", "display_data", "execute_result"):
                seen.append(f"{kind}: {content.get('evalue') or content.get('data', {}).get('text/plain')}")

        reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
        assert reply["content"]["status"] == "ok", (code, seen)
        return seen

    def late(code: str) -> list[str]:
        """What any cell's output got while `code` ran: a background thread's output goes
        to the cell that started it (the status view's), not to the one running now."""
        msg_id = kc.execute(code)
        seen: list[str] = []
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "status" and msg["parent_header"].get("msg_id") == msg_id and content["execution_state"] == "idle":
                break
            if kind in ("stream", "error", "display_data", "execute_result"):
                seen.append(f"{kind}: {content.get('text') or content.get('evalue') or content.get('data')}")
        while (reply := kc.get_shell_msg(timeout=120))["parent_header"].get("msg_id") != msg_id:
            pass
        assert reply["content"]["status"] == "ok", (reply["content"], seen)
        return seen

    try:
        outputs("%load_ext nbcluster\n%cluster start --workers 1\nx = 1")
        outputs("from distributed import default_client\ndefault_client().submit(sum, [1, 2]).result()")
        outputs("%cluster status")  # its live view polls the cluster until the next cell
        assert outputs("%cluster stop") == ["stdout: Stopped 'local'.\n"]
        assert late(QUIET_AFTER_STOP) == []  # nothing arrives late either
        # The status view froze into its picture (as the next cell began, or its cluster went):
        # a saved notebook holds no live widget.
        assert outputs("[view.frozen for view in views]") == ["execute_result: [True]"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


class _Unsendable:
    """An object whose pickling fails with a message of two lines."""

    def __reduce__(self) -> Any:
        raise ValueError("it holds a connection\nand a second line of detail")


def test_a_value_an_item_or_a_function_that_cannot_travel_is_one_line_naming_it(
    cluster: Any, tmp_path: Any
) -> None:
    lock = threading.Lock()

    def uses_lock(x: Any) -> Any:
        return x, lock

    fix = r"\. Create it inside the cell instead, or pass what it is made from$"
    with (tmp_path / "data.txt").open("w") as file:
        cases = [
            ({"body": "box", "over": [1], "namespace": {"box": _Unsendable()}},
             r"^`box` cannot be sent to the workers: ValueError: it holds a connection" + fix),
            ({"body": "x", "over": "x in items", "namespace": {"items": [_Unsendable()]}},
             r"^item 0 \(x=<.*_Unsendable object at.*\) cannot be sent to the workers: ValueError: it holds a connection" + fix),
            ({"body": uses_lock, "over": [1]},
             r"^the function uses_lock cannot be sent to the workers: TypeError: cannot pickle '_thread.lock' object" + fix),
            ({"body": "x", "over": "x in items", "namespace": {"items": [file]}}, r"^item 0 \(x=.*\) is an open file and cannot be sent to the workers: open it inside the cell instead$"),
        ]  # fmt: skip
        for kwargs, message in cases:
            with pytest.raises(BadArgument, match=message) as caught:
                nbcluster.distribute(**{"namespace": {}, **kwargs}, on=cluster)
            assert one_clear_line(str(caught.value)), caught.value
