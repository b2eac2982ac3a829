"""The `nbcluster` command: same language as `%cluster`, exit status 2 on mistakes."""

from __future__ import annotations

import pytest

import nbcluster
from nbcluster.cluster.gpu import SIMULATE_ENV
from nbcluster.cluster.spec import START_OPTIONS, parse_bounds
from nbcluster.errors import BadArgument


def test_cli_lifecycle(runtime_dir, cli):
    started = cli("start", "--workers", "1", "--name", "term")
    assert started.returncode == 0, started.stderr
    assert "nbcluster stop term" in started.stdout
    listed = cli("list")
    assert listed.returncode == 0 and "term" in listed.stdout and "1 (1 core)" in listed.stdout
    assert cli("scale", "2").returncode == 0  # the only running cluster needs no name
    assert "2 workers" in cli("status", "term").stdout
    assert cli("adapt", "--min", "1", "--max", "3").returncode == 0
    assert "adaptive 1-3" in cli("status").stdout
    stopped = cli("stop", "term")
    assert stopped.returncode == 0 and "Stopped 'term'" in stopped.stdout
    assert nbcluster.clusters() == []
    assert "No clusters running" in cli("list").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say what to do"),
        (["frobnicate"], "unknown command"),
        (["start", "--bogus"], "unrecognized arguments"),
        (["scale", "-3"], "at least 0"),
        (["adapt", "--min", "2", "--max", "1"], "above --max"),
        (["status", "ghost"], "no cluster named 'ghost'"),
        (["start", "--gpus", "2"], "no GPU"),
        (["use", "local"], "notebook kernel"),
        (["scale", "1", "--kind", "tpu"], "invalid choice: 'tpu'"),
        (["start", "--gpu-backend", "cuda9"], "--gpu-backend 'cuda9'"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(runtime_dir, cli, args, message):
    # The messages of a machine without GPUs, whatever this one has (a GPU CI runner, a
    # developer's NBCLUSTER_SIMULATE_GPUS): "0" is zero GPUs and stops discovery.
    result = cli(*args, env={SIMULATE_ENV: "0"})
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_cli_help(cli):
    result = cli("--help")
    assert result.returncode == 0 and "scale" in result.stdout
    result = cli("start", "--help")
    text = "".join(result.stdout.split())  # argparse wraps to the terminal's width
    assert result.returncode == 0 and text.count("usage:") == 1  # shown once, not twice
    for option in START_OPTIONS:
        assert f"--{option.flag}" in text and "".join(option.help.split()) in text, option.flag


def test_cli_shows_the_cores_message(runtime_dir, cli):
    with pytest.raises(BadArgument) as expected:
        parse_bounds(2, 1)
    result = cli("adapt", "--min", "2", "--max", "1")
    assert (result.returncode, result.stderr) == (2, f"nbcluster: error: {expected.value}\n")
