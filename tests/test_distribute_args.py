"""The %%distribute line parser: every flag, quoting, and one clear message per mistake."""

from __future__ import annotations

import pytest

from nbcluster.errors import BadArgument
from nbcluster.run.api import distribute
from nbcluster.run.options import FLAGS, DistributeOptions, parse_distribute_line, parse_wait_line
from nbcluster.run.transport import Needs


def test_every_flag() -> None:
    line = (
        '--over "x in range(10)" --into res --gpus 1 --cpus 2.5 --retries 3 --batch 50 '
        "--no-wait --seed 7 --local 2 --cluster big"
    )
    assert parse_distribute_line(line) == {
        "over": "x in range(10)",
        "into": "res",
        "gpus": 1,
        "cpus": 2.5,
        "retries": 3,
        "batch": 50,
        "wait": False,
        "seed": 7,
        "local": 2,
        "cluster": "big",
    }
    assert parse_distribute_line("--everywhere --cpu-only") == {"everywhere": True, "cpu_only": True}


def test_empty_line_runs_once_with_defaults() -> None:
    assert parse_distribute_line("") == {}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('--over "x in range(3)"', "x in range(3)"),
        ("--over 'a, b in pairs'", "a, b in pairs"),
        ("--over x in range(3)", "x in range(3)"),  # bare words up to the next flag
        ("--over x in ['a b', \"c\"]", "x in ['a b', \"c\"]"),  # quotes inside survive
        ("--over=x in xs", "x in xs"),
        ("--over \"s in ['--into', 'x']\"", "s in ['--into', 'x']"),
        ("--over x in f(1, --2)", "x in f(1, --2)"),  # no flag inside brackets
    ],
)
def test_over_expressions_keep_python_syntax(line: str, expected: str) -> None:
    assert parse_distribute_line(line)["over"] == expected


def test_grid_and_zip_values() -> None:
    kwargs = parse_distribute_line('--grid "lr=[0.1, 0.01], depth=[3, 5]"')
    assert kwargs["grid"] == "lr=[0.1, 0.01], depth=[3, 5]"
    assert parse_distribute_line("--zip a=[1, 2], b=xs")["zip"] == "a=[1, 2], b=xs"


def test_batch_auto_and_local_without_count() -> None:
    assert parse_distribute_line("--batch auto --local")["batch"] == "auto"
    assert parse_distribute_line("--local")["local"] is True  # every item, as `distribute(local=True)`
    assert parse_distribute_line("--local 0")["local"] == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--ovr x in y", "unknown option --ovr; did you mean --over?"),
        ("--gpus", "--gpus needs a value"),
        ("--gpus 0", "--gpus needs a number above 0"),
        ("--gpus many", "--gpus needs a number above 0, got 'many'"),
        ("--gpus nan", "--gpus needs a number above 0, got nan"),
        ("--retries -1", "--retries needs a whole number of 0 or more"),
        ("--retries 1.5", "--retries needs a whole number of 0 or more, got '1.5'"),
        ("--batch 0", "--batch needs `auto` or a whole number of 1 or more"),
        ("--batch big", "--batch needs `auto` or a whole number"),
        ("--seed x", "--seed needs a whole number"),
        ("--into 3x", "--into needs a Python variable name"),
        ("--into class", "--into needs a Python variable name"),
        ("--into a b", "--into takes one value"),
        ("--no-wait now", "--no-wait takes no value"),
        ("--into r --into s", "--into is given twice"),
        ('--over "x in range(3)', "unterminated string"),
        ("--over x in range(3", "unclosed bracket"),
        ("x in range(3)", "unexpected 'x' before any --option"),
        ("--local -2", "--local needs a whole number of 0 or more"),
        ("--gpus 1 --cpu-only", "--cpu-only keeps items off GPU workers: it cannot be combined with --gpus; drop it"),
        ("--everywhere --over x in y", "--everywhere runs the cell once per worker"),
        ("--everywhere --resume", "cannot be combined with --resume; drop it"),
        ("--over x in y --grid a=[1]", "--over makes the items: it cannot be combined with --grid; drop it"),
        ("--persist --into r --batch 5", "--persist runs each item as a Dask task of its own, holding its value: it "
                                         "cannot be combined with --batch; drop it"),
        ("--persist --batch 5", "--persist keeps the results on the workers: name them with --into NAME"),
        ("--objective loss:min --stop asha --batch 4", "--stop stops items one at a time"),
        ("--stop asha", "--stop judges trials by their objective"),
        ("--ranks 0", "--ranks needs a whole number of 1 or more, got 0"),
        ("--ranks 2 --over x in y --retries 1", "cannot be combined with --over, --retries; drop them"),
        ("--seed=-", "--seed needs a whole number, got '-'"),
    ],
)
def test_mistakes_get_one_clear_message(line: str, message: str) -> None:
    # The line is read, then checked as `launch` checks it, by the declaration's kinds and rules.
    with pytest.raises(BadArgument) as info:
        DistributeOptions(**parse_distribute_line(line))
    assert message in str(info.value)


def test_wait_line() -> None:
    assert parse_wait_line("wait res") == "res"
    with pytest.raises(BadArgument, match="usage: %distribute wait NAME"):
        parse_wait_line("wait")
    with pytest.raises(BadArgument, match=r"put %%distribute \(two %\)"):
        parse_wait_line('--over "x in xs"')


@pytest.mark.parametrize(
    ("line", "kwargs"),
    [
        ("--gpus 0", {"needs": Needs(gpus=0)}),
        ("--retries -1", {"retries": -1}),
        ("--batch 0", {"batch": 0}),
        ("--into class", {"into": "class"}),
        ("--local -2", {"local": -2}),
        ("--cpu-only --gpus 2", {"needs": Needs(gpus=2, cpu_only=True)}),
    ],
)
def test_the_magic_and_the_api_give_the_same_message(line: str, kwargs: dict[str, object]) -> None:
    # One rule, in DistributeOptions: the line's values, read by their kinds, meet the check
    # that the keyword arguments meet.
    with pytest.raises(BadArgument) as from_line:
        DistributeOptions(**parse_distribute_line(line))
    with pytest.raises(BadArgument) as from_api:
        distribute("x", namespace={}, **kwargs)  # type: ignore[arg-type]
    assert str(from_line.value) == str(from_api.value)


def test_help_lists_every_declared_flag_with_its_help() -> None:
    from nbcluster.magics import NbclusterMagics

    def bare(text: str) -> str:  # argparse wraps to the terminal's width, even inside words
        return "".join(text.split())

    doc = bare(NbclusterMagics.distribute.__doc__ or "")
    for flag in FLAGS:
        assert bare(flag.usage) in doc and bare(flag.help) in doc, flag.name
