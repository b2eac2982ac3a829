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
    assert cli("adapt", "term", "--min", "1", "--max", "3").returncode == 0
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
        (["start", "--gpu-workers", "2"], "no GPU"),
        (["use", "local"], "a terminal has none"),
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


@pytest.mark.parametrize(
    ("args", "notice", "error"),
    [
        (["start", "--gpus", "2"], "`nbcluster start --gpus` is now `nbcluster start --gpu-workers`", "no GPU"),
        (["scale", "1", "--name", "ghost"], "`nbcluster scale --name NAME` is now `nbcluster scale N NAME`", "no cluster named 'ghost'"),
        (["adapt", "--name", "ghost"], "`nbcluster adapt --name NAME` is now `nbcluster adapt NAME`", "no cluster named 'ghost'"),
        (["runs", "--show", "abcdef12"], "`nbcluster runs --show ID` is now `nbcluster runs ID`", "no journaled run 'abcdef12'"),
    ],
)
def test_cli_old_spellings_still_work_after_one_line_naming_the_new(runtime_dir, cli, args, notice, error):
    # Each old spelling reaches the same command as the new one (here: the same mistake),
    # after exactly one line that names the new spelling.
    result = cli(*args, env={SIMULATE_ENV: "0"})
    assert result.returncode == 2
    first, second = result.stderr.splitlines()
    assert first == f"nbcluster: note: {notice}; the old spelling goes in the next release."
    assert second.startswith("nbcluster: error: ") and error in second, second


def test_cli_names_a_cluster_in_the_same_place_for_every_command(runtime_dir, cli):
    # Positional everywhere: `status NAME`, `scale N NAME`, `adapt NAME`, `stop NAME`, `restart NAME`.
    for args in (["status", "ghost"], ["scale", "1", "ghost"], ["adapt", "ghost"], ["stop", "ghost"], ["restart", "ghost"]):
        result = cli(*args)
        assert result.returncode == 2, args
        assert result.stderr.startswith("nbcluster: error: no cluster named 'ghost'.") and result.stderr.count("\n") == 1


def test_cli_has_no_use_and_says_what_to_do_instead(cli):
    result = cli("--help")
    assert "use" not in result.stdout.split("positional arguments:")[0], result.stdout
    assert " use " not in result.stdout
    refused = cli("use", "local")
    assert refused.returncode == 2 and "`%cluster use NAME`" in refused.stderr and "nbcluster status NAME" in refused.stderr


def test_adapt_bounds_default_as_the_python_api_does():
    import inspect

    from nbcluster import commands
    from nbcluster.cluster.handle import ClusterHandle

    defaults = inspect.signature(ClusterHandle.adapt).parameters
    ns = commands.parse("adapt", prog="nbcluster")
    assert (int(ns.minimum), int(ns.maximum)) == (defaults["minimum"].default, defaults["maximum"].default)
    assert (commands.ADAPT_MIN, commands.ADAPT_MAX) == (0, 4)


def test_start_gpus_keyword_still_works_with_a_future_warning(runtime_dir, monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "0")
    with (
        pytest.warns(FutureWarning, match=r"`gpus` of a cluster start is now `gpu_workers`"),
        pytest.raises(BadArgument, match="no GPU"),
    ):
        nbcluster.start(gpus=2)
    with pytest.raises(BadArgument, match="give gpu_workers only"):
        nbcluster.start(gpus=1, gpu_workers=1)
