"""The docs site builds clean, and its generated references say what the declarations say.

The references are made at build time from the code (``docs/_ext/nbcluster_docs.py``,
`nbcluster.server.openapi`): these tests build the site once, warnings as errors, and read
the HTML a user reads, so a directive that stops rendering a flag, a setting or a route fails
here. Nothing else restates the declarations by hand: no page and no README carries an option
table of its own.
"""

from __future__ import annotations

import html
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbcluster import commands
from nbcluster.cluster.spec import START_OPTIONS, ClusterSpec
from nbcluster.config_schema import load
from nbcluster.distribute import distribute
from nbcluster.distribute.options import FLAGS
from nbcluster.server import openapi
from nbcluster.server.handlers import START_FIELDS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the docs do not build clean:\n{done.stderr[-4000:]}"
    return out


def text(site: Path, page: str) -> str:
    """The words of a built page's article, tags dropped, whitespace collapsed."""
    raw = (site / page).read_text()
    article = re.search(r"(?s)<article.*?</article>", raw)
    assert article, page
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", article.group(0))).split())


def test_site_reference_lists_every_distribute_flag_with_its_keyword_and_default(site: Path) -> None:
    page = text(site, "reference/options.html")
    for flag in FLAGS:
        assert flag.usage in page and f"{flag.dest}={flag.default!r}" in page, flag.name
        assert " ".join(flag.help.replace("`", "").split()) in page.replace(" ,", ","), flag.name


def test_site_reference_lists_every_command_and_start_option(site: Path) -> None:
    page = text(site, "reference/options.html")
    for command in commands.COMMANDS:
        assert f"%cluster {command}" in page and f"nbcluster {command}" in page, command
    for option in START_OPTIONS:
        assert f"--{option.flag}" in page, option.flag
        assert option.help.replace("`", "").split()[0] in page


def test_site_reference_lists_every_setting_with_its_default(site: Path) -> None:
    page = text(site, "reference/settings.html")
    for key, setting in load().items():
        if setting.kind == "section":
            continue
        default = setting.default if isinstance(setting.default, str) else json.dumps(setting.default)
        assert f"nbcluster.{key} {default}" in page, key


def test_site_rest_reference_shows_every_route_of_the_openapi_document(site: Path) -> None:
    raw = (site / "reference/rest-api.html").read_text()
    for path, item in openapi.document()["paths"].items():
        for method in item.keys() - {"parameters"}:
            # sphinxcontrib-httpdomain's anchors: get--api-clusters-name
            anchor = f"{method}--" + path.strip("/").replace("/", "-").replace("{", "").replace("}", "")
            assert f'id="{anchor}"' in raw, f"{method.upper()} {path}"


def test_site_front_page_reaches_each_reference_in_one_click(site: Path) -> None:
    front = (site / "index.html").read_text()
    for page in (
        "getting-started/index.html",
        "reference/options.html",
        "reference/python-api.html",
        "reference/settings.html",
        "reference/rest-api.html",
    ):
        assert f'href="{page}' in front, page
    api = text(site, "reference/python-api.html")
    for member in ("values", "to_pandas", "retry", "errors", "scale", "adapt", "stop"):
        assert f"{member}" in api


def test_no_page_restates_an_option_table_by_hand() -> None:
    # The tables are generated: a hand-written copy would drift (the README's did).
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        hand = re.findall(
            r"^\| `--[a-z-]+.*\|$|^\| `nbcluster\.[a-z-]+\.[a-z.-]+` \|", page.read_text(), re.MULTILINE
        )
        assert not hand, f"{page.relative_to(ROOT)} restates generated rows: {hand[:3]}; use the directive"


def test_rest_start_body_is_the_declared_start_fields() -> None:
    body = openapi.document()["paths"]["/api/clusters"]["post"]["requestBody"]
    assert list(body["content"]["application/json"]["schema"]["properties"]) == list(START_FIELDS)


def test_declared_defaults_are_the_api_defaults() -> None:
    # `distribute()` keeps its keyword arguments (the public API); they must agree.
    parameters = inspect.signature(distribute).parameters
    for flag in FLAGS:
        assert parameters[flag.dest].default == flag.default, flag.name
    # Every start option is an argument of the one check of a start request.
    assert {o.field for o in START_OPTIONS} <= set(inspect.signature(ClusterSpec.from_user).parameters)
