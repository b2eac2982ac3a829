"""`%cluster` through a real IPython shell, and kernel death through a real Jupyter kernel."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from IPython.core.error import UsageError

import nbcluster
from nbcluster.cluster.gpu import SIMULATE_ENV
from nbcluster.cluster.info import ClusterInfo, ClusterList
from nbcluster.cluster.spec import START_OPTIONS, check_name, parse_bounds, parse_count
from nbcluster.errors import BadArgument
from nbcluster.run.options import FLAGS
from tests.shell_helpers import magic, one_clear_line


def test_cluster_magic_lifecycle(shell, capsys):
    info = magic(shell, "start --workers 1 --name nb")
    assert isinstance(info, ClusterInfo) and "Started cluster 'nb'" in repr(info)
    assert len(info.workers) == 1
    again = magic(shell, "start --workers 1 --name nb")
    assert "already running" in repr(again) and again["address"] == info["address"]

    assert len(magic(shell, "scale 2 nb").workers) == 2  # the name is positional, as for status
    assert magic(shell, "adapt --min 1 --max 2")["adaptive"] == {"minimum": 1, "maximum": 2}
    status = magic(shell, "status")
    assert "2 workers" in repr(status) and "<table>" in status._repr_html_()
    listing = magic(shell, "list")
    assert isinstance(listing, ClusterList) and listing.names() == ["nb"]
    assert "Restarted the workers" in repr(magic(shell, "restart"))

    # Plain Dask code in the kernel runs on the current cluster.
    shell.run_cell("from distributed import default_client; addr = default_client().scheduler.address")
    assert shell.user_ns["addr"] == info["address"]

    assert magic(shell, "stop") is None
    assert "Stopped 'nb'" in capsys.readouterr().out
    assert nbcluster.clusters() == []


def test_use_switches_the_current_cluster(shell):
    magic(shell, "start --workers 0 --name a")
    b = magic(shell, "start --workers 0 --name b")
    assert nbcluster.current().name == "b"
    magic(shell, "use a")
    assert nbcluster.current().name == "a"
    magic(shell, f"use {b['address']}")
    assert nbcluster.current().name == "b"
    magic(shell, "stop --all")
    assert nbcluster.clusters() == [] and nbcluster.current() is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "say what to do"),
        ("launch", "unknown command 'launch'"),
        ("start --wrokers 2", "unrecognized arguments: --wrokers"),
        ("start --workers -1", "at least 0"),
        ("start --workers 1.5", "whole number"),
        ("start --gpu-workers 2", "no GPU"),
        ("scale two", "whole number"),
        ("adapt --min 3 --max 1", "above --max"),
        ("status nope", "no cluster named 'nope'"),
        ("use tcp://127.0.0.1:9", "no scheduler answers"),
        ("stop", "no cluster is running"),
    ],
)
def test_bad_input_raises_one_usage_error(shell, line, message, monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "0")  # a machine without GPUs, whatever this one has
    with pytest.raises(UsageError, match=message) as info:
        magic(shell, line)
    assert one_clear_line(str(info.value)), info.value


@pytest.mark.parametrize(
    ("line", "core"),
    [
        ("adapt --min 3 --max 1", lambda: parse_bounds(3, 1)),
        ("scale -2", lambda: parse_count(-2, "the number of workers")),
        ("start --name no/slash", lambda: check_name("no/slash")),
    ],
)
def test_mistakes_show_the_cores_own_message(shell, line, core):
    # The rule lives in nbcluster.cluster.spec; the magic shows its message unchanged.
    with pytest.raises(BadArgument) as expected:
        core()
    with pytest.raises(UsageError) as shown:
        magic(shell, line)
    assert str(shown.value) == str(expected.value)
    assert nbcluster.clusters() == []


def test_help_is_made_from_the_declarations(shell, capsys):
    magic(shell, "start --help")
    text = "".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    assert text.count("usage:") == 1  # shown once, not twice
    for option in START_OPTIONS:
        assert f"--{option.flag}" in text and "".join(option.help.split()) in text, option.flag
    # `%%distribute?` shows the magic's docstring: every declared flag, with its help.
    doc = "".join(shell.find_cell_magic("distribute").__doc__.split())
    for flag in FLAGS:
        assert "".join(flag.usage.split()) in doc and "".join(flag.help.split()) in doc, flag.name


def test_kernel_killed_leaves_no_processes(runtime_dir):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.execute_interactive(
            "%load_ext nbcluster\n%cluster start --workers 2\n"
            "import nbcluster; sup = nbcluster.current().entry['supervisor_pid']",
            timeout=120,
            user_expressions={"sup": "sup"},
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        sup = int(reply["content"]["user_expressions"]["sup"]["data"]["text/plain"])
        family = [psutil.Process(sup), *psutil.Process(sup).children(recursive=True)]
        assert len(family) >= 3
        os.kill(km.provisioner.pid, signal.SIGKILL)  # no atexit, no cleanup in the kernel
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"processes outlived the kernel by 10 s: {alive}"
        assert nbcluster.clusters() == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_old_spellings_print_one_line_then_do_the_same(shell, capsys, monkeypatch):
    monkeypatch.setenv(SIMULATE_ENV, "0")
    with pytest.raises(UsageError, match="no GPU"):
        magic(shell, "start --gpus 2")
    assert capsys.readouterr().out == (
        "note: `%cluster start --gpus` is now `%cluster start --gpu-workers`; the old spelling goes in the next release.\n"
    )
    with pytest.raises(UsageError, match="no cluster named 'ghost'"):
        magic(shell, "scale 1 --name ghost")
    assert "`%cluster scale --name NAME` is now `%cluster scale N NAME`" in capsys.readouterr().out
    # The journals moved from %distribute to %cluster runs.
    shell.run_line_magic("distribute", "runs")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "note: `%distribute runs [ID]` is now `%cluster runs [ID]`; the old spelling goes in the next release."
    magic(shell, "runs")
    assert capsys.readouterr().out.splitlines() == out[1:]  # the same table
    with pytest.raises(UsageError, match="no journaled run 'abcdef12'"):
        shell.run_line_magic("distribute", "forget abcdef12")
    assert "`%distribute forget ID` is now `%cluster runs ID --forget`" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no journaled run 'abcdef12'"):
        magic(shell, "runs abcdef12 --forget")


def test_positional_name_for_scale_and_adapt(shell):
    for line in ("scale 1 ghost", "adapt ghost --max 2", "status ghost", "restart ghost", "stop ghost"):
        with pytest.raises(UsageError, match="no cluster named 'ghost'"):
            magic(shell, line)
