"""Generated malformed lines for `%cluster`, the `nbcluster` command and `%%distribute`: each
gives one clean line (or works), never a traceback from nbcluster's internals.

The lines are random mixes of the real words and flags with quotes, brackets, dashes and
numbers (seeded, so a failure reproduces). No cluster runs in the test's registry, so a
line that happens to be valid cannot change anything, except `start`, which always gets
at least one defect mixed in.
"""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from nbcluster import cli, commands
from nbcluster.distribute.options import FLAGS

JUNK = ['"', "'", '"""', "(", ")", "[", "]", "{", "}", "-", "--", "---", "=", ",", ":", "\\", "#", ";",
        "0", "-1", "1.5", "1e9", "99999999999999999999", "nan", "-0", "x", "in", "None", "é", "🙂"]  # fmt: skip
# What `start` always carries at least one of, so that it never starts a cluster here.
DEFECTS = ['"', "'", "--zzz", ")", "--workers -1", "--threads x", "--memory 1", "--gpus -2", "((", "start"]
CLUSTER_WORDS = [*commands.COMMANDS, "--workers", "--threads", "--memory", "--gpus", "--name", "--keep",
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


def _clean(message: str) -> bool:
    return "\n" not in message.strip() and "Traceback" not in message and 'File "' not in message


def test_generated_cluster_lines_give_one_clean_line(shell: InteractiveShell, capsys: Any) -> None:
    bad = []
    for tokens in cluster_lines(300, seed=1):
        line = " ".join(tokens)
        try:
            shell.run_line_magic("cluster", line)
        except UsageError as e:
            if not _clean(str(e)):
                bad.append((line, str(e)))
        except Exception as e:  # anything else is a traceback in the notebook
            bad.append((line, f"{type(e).__name__}: {e}"))
    capsys.readouterr()
    assert bad == []


def test_generated_cli_arguments_give_one_line_and_status_2(runtime_dir: Any, capsys: Any) -> None:
    bad = []
    for argv in cluster_lines(200, seed=2):
        try:
            status = cli.main(argv)
        except BaseException as e:
            bad.append((argv, f"{type(e).__name__}: {e}"))
            continue
        _, err = capsys.readouterr()
        if status == 2 and not (err.startswith("nbcluster: error: ") and _clean(err)):
            bad.append((argv, err))
        elif status not in (0, 2):
            bad.append((argv, f"exit status {status}: {err}"))
    assert bad == []


def test_generated_distribute_lines_give_one_clean_line(shell: InteractiveShell, capsys: Any) -> None:
    bad = []
    for line in distribute_lines(300, seed=3):
        result = shell.run_cell(f"%%distribute {line}\n1\n")
        error = result.error_before_exec or result.error_in_exec
        if error is not None and not (isinstance(error, UsageError) and _clean(str(error))):
            bad.append((line, f"{type(error).__name__}: {error}"))
    capsys.readouterr()
    assert bad == []


def test_cluster_stop_in_terminal_ipython_prints_only_its_line(runtime_dir: Any, tmp_path: Any) -> None:
    script = tmp_path / "session.ipy"
    script.write_text(
        "%load_ext nbcluster\n%cluster start --workers 1\n"
        "from distributed import default_client\ndefault_client().submit(sum, [1, 2]).result()\n"
        "%cluster status\n%cluster stop\nimport time\ntime.sleep(3)\n"  # a reconnect would log here
    )
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", str(script)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "Stopped 'local'." in done.stdout
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

    try:
        outputs("%load_ext nbcluster\n%cluster start --workers 1\nx = 1")
        outputs("from distributed import default_client\ndefault_client().submit(sum, [1, 2]).result()")
        outputs("%cluster status")  # its live view keeps polling the cluster after the cell
        assert outputs("%cluster stop") == ["stdout: Stopped 'local'.\n"]
        assert outputs("import time\ntime.sleep(3)") == []  # nothing arrives late either
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
