"""The README's option tables say what the declarations say.

The flags of `%%distribute` (`nbcluster.distribute.options`) and the start options of
`%cluster`, the CLI and the REST body (`nbcluster.cluster.spec.START_OPTIONS`) are each
declared once; these tests fail when the README's tables drift from them, and print the
table to paste. Every key in `nbcluster.yaml` must be named in the README too.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from nbcluster.cluster.spec import START_OPTIONS, ClusterSpec
from nbcluster.distribute import distribute
from nbcluster.distribute.options import FLAGS
from nbcluster.server.handlers import START_FIELDS

README = (Path(__file__).parent.parent / "README.md").read_text()


def table(rows: list[tuple[str, str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")  # a bare | would end the table cell

    lines = [f"| `{cell(option)}` | {cell(meaning)} |" for option, meaning in rows]
    return "\n".join(["| option | meaning |", "|---|---|", *lines])


def readme_table(heading: str) -> str:
    """The first table after `heading` in the README."""
    after = README[README.index(heading) :]
    match = re.search(r"^\| option \| meaning \|\n(?:\|.*\n)+", after, re.MULTILINE)
    assert match, f"no option table after {heading!r} in README.md"
    return match.group(0).rstrip("\n")


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("## `%%distribute`", table([(f.usage, f.help) for f in FLAGS])),
        (
            "## Clusters: `%cluster`",
            table([(f"--{o.flag} {o.metavar}".strip(), o.help) for o in START_OPTIONS]),
        ),
    ],
)
def test_readme_option_table_matches_the_declaration(heading: str, expected: str) -> None:
    assert readme_table(heading) == expected, f"README.md, under {heading}, should read:\n\n{expected}\n"


def test_readme_rest_start_body_lists_the_declared_fields() -> None:
    [row] = [line for line in README.splitlines() if line.startswith("| `POST api/clusters`")]
    assert re.findall(r"`(\w+)`", row.split("|")[2]) == list(START_FIELDS)


def test_declared_defaults_are_the_api_defaults() -> None:
    # `distribute()` keeps its keyword arguments (the public API); they must agree.
    parameters = inspect.signature(distribute).parameters
    for flag in FLAGS:
        assert parameters[flag.dest].default == flag.default, flag.name
    # Every start option is an argument of the one check of a start request.
    assert {o.field for o in START_OPTIONS} <= set(inspect.signature(ClusterSpec.from_user).parameters)


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        # A mapping the user writes whole (an environment, the profiles) is one setting.
        if isinstance(value, dict) and key not in ("pre-spawn-environ", "profiles"):
            keys += _leaves(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


def test_every_setting_in_nbcluster_yaml_is_documented() -> None:
    import yaml

    shipped = yaml.safe_load((Path(__file__).parent.parent / "nbcluster" / "nbcluster.yaml").read_text())
    missing = [k for k in _leaves(shipped["nbcluster"]) if f"`{k}`" not in README and f"`nbcluster.{k}`" not in README]
    assert not missing, f"README names no row or line for these nbcluster.yaml keys: {missing}"
