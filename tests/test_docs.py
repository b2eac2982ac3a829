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
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbcluster import commands
from nbcluster.cluster.spec import START_OPTIONS, ClusterSpec
from nbcluster.config_schema import load
from nbcluster.run.api import distribute, launch
from nbcluster.run.options import FLAGS
from nbcluster.server import openapi
from nbcluster.server.handlers import START_FIELDS
from tests.docs_helpers import NAMES, SHOTS, teaching_notebooks

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    # Nothing executed: the pages' and notebooks' own runs are checked below and in
    # test_notebooks; what is in the execution cache is shown with its outputs.
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        env={**os.environ, "NBCLUSTER_DOCS_EXECUTE": "0"},
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


def stray_table_rows(page: str) -> list[str]:
    """Lines of Markdown table syntax that reached a built page as text: a `| a | b |` row the
    parser did not take for a table (a header row with no `| --- |` line under it, as above
    a generated table), shown to the reader as pipes. Code, tables and scripts are left out."""
    article = re.search(r"(?s)<article.*?</article>", page)
    body = article.group(0) if article else page
    body = re.sub(r"(?s)<(pre|code|table|script|style)\b.*?</\1>", " ", body)
    body = re.sub(r'(?s)<span class="pre">.*?</span>', " ", body)
    words = html.unescape(re.sub(r"<[^>]+>", "\n", body))
    return [line.strip() for line in words.splitlines() if re.search(r"\|[^|\n]+\|", line)]


def test_the_stray_row_check_finds_what_a_reader_saw(tmp_path: Path) -> None:
    # What Chromium showed above distribute.md's and clusters.md's generated tables.
    seen = '<article><p>| option | meaning |</p><table><tr><td>a | b | c</td></tr></table><pre>x | y | z</pre></article>'
    assert stray_table_rows(seen) == ["| option | meaning |"]
    assert stray_table_rows("<article><p>a <code>--x auto|N</code> b</p><table><tr><td>|a|</td></tr></table></article>") == []


def test_site_pages_show_no_markdown_table_syntax(site: Path) -> None:
    found = {
        str(page.relative_to(site)): rows
        for page in sorted(site.rglob("*.html"))
        if not page.is_relative_to(site / "_static") and (rows := stray_table_rows(page.read_text()))
    }
    assert not found, f"Markdown table rows shown as text (a header with no `| --- |` under it?): {found}"


def test_site_reference_lists_every_distribute_flag_with_its_keyword_and_default(site: Path) -> None:
    page = text(site, "reference/options.html")
    for flag in FLAGS:
        assert flag.usage in page and flag.python in page.replace("“", '"').replace("”", '"'), flag.name
        assert " ".join(flag.help.replace("`", "").split()) in page.replace(" ,", ","), flag.name


def test_site_reference_lists_every_command_and_start_option(site: Path) -> None:
    page = text(site, "reference/options.html")
    for command in commands.COMMANDS:
        assert f"%cluster {command}" in page, command
        assert (f"nbcluster {command}" in page) == (command in commands.CLI_COMMANDS), command
    # Old spellings still parse for a release, but the reference shows only the new ones.
    assert "SUPPRESS" not in page and "--show" not in page and "OLD_" not in page
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
    # The tables are generated: a hand-written copy would drift (the README's did). The
    # one-line index of every name (reference/names.md) gives no defaults or flags' values,
    # and test_every_public_name_has_its_line holds it to the code.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        if page == NAMES_PAGE:
            continue
        hand = re.findall(
            r"^\| `--[a-z-]+.*\|$|^\| `nbcluster\.[a-z-]+\.[a-z.-]+` \|", page.read_text(), re.MULTILINE
        )
        assert not hand, f"{page.relative_to(ROOT)} restates generated rows: {hand[:3]}; use the directive"


NAMES_PAGE = ROOT / "docs" / "reference" / "names.md"
_NAME_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \|", re.MULTILINE)


def public_names() -> dict[str, list[str]]:
    """Every name a user can type, by the heading of reference/names.md it goes under,
    generated from the code: `nbcluster.__all__` and the public members of `Results` and
    `ClusterHandle`, the `%%distribute` declarations, the `%cluster` parser (old spellings,
    hidden from its help, are not names), and the settings of ``nbcluster.yaml``."""
    import argparse

    import nbcluster
    from nbcluster.cluster.handle import ClusterHandle
    from nbcluster.run.results import Results

    python = [f"nbcluster.{name}" for name in nbcluster.__all__]
    python += [f"{cls.__name__}.{m}" for cls in (Results, ClusterHandle) for m in dir(cls) if not m.startswith("_")]
    distribute_ = [f"%%distribute --{flag.name}" for flag in FLAGS] + ["%distribute wait"]
    parser = commands.build_parser("%cluster")
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    cluster = []
    for name, command in sub.choices.items():
        cluster.append(f"%cluster {name}")
        cluster += [
            f"%cluster {name} {action.option_strings[0]}"
            for action in command._actions
            if action.option_strings and action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        ]
    settings = [f"nbcluster.{key}" for key, setting in load().items() if setting.kind != "section"]
    return {
        "Python API": python,
        "`%%distribute` options": distribute_,
        "`%cluster` and `nbcluster` subcommands": cluster,
        "Settings": settings,
    }


def test_every_public_name_has_its_line_in_the_reference() -> None:
    listed = _NAME_ROW.findall(NAMES_PAGE.read_text())
    expected = public_names()
    known = {name for names in expected.values() for name in names}
    missing = [
        f"under '## {heading}': | `{name}` | <what it is, in one line> |"
        for heading, names in expected.items()
        for name in names
        if name not in listed
    ]
    assert not missing, f"docs/reference/names.md lacks {len(missing)} name(s); add these lines:\n" + "\n".join(missing)
    gone = [name for name in listed if name not in known]
    assert not gone, f"docs/reference/names.md lists names the code no longer has; remove: {gone}"
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert not twice, f"docs/reference/names.md lists these twice: {twice}"


def test_the_names_check_refuses_a_missing_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check on a page made to break it: one row dropped, one stale row added.
    page = NAMES_PAGE.read_text()
    broken = tmp_path / "names.md"
    broken.write_text(page.replace("| `%%distribute --retries` |", "| dropped |"))
    monkeypatch.setattr(sys.modules[__name__], "NAMES_PAGE", broken)
    with pytest.raises(AssertionError, match=r"add these lines:\n\s*under '## `%%distribute` options': \| `%%distribute --retries` \|"):
        test_every_public_name_has_its_line_in_the_reference()
    broken.write_text(page + "| `nbcluster.gone` | a name the code does not have |\n")
    with pytest.raises(AssertionError, match=r"remove: \['nbcluster.gone'\]"):
        test_every_public_name_has_its_line_in_the_reference()


def test_rest_start_body_is_the_declared_start_fields() -> None:
    body = openapi.document()["paths"]["/api/clusters"]["post"]["requestBody"]
    assert list(body["content"]["application/json"]["schema"]["properties"]) == list(START_FIELDS)


def test_declared_defaults_are_the_api_defaults() -> None:
    # The magic calls `launch` with the declared names; `distribute()` spells a flag the same
    # way unless the declaration says otherwise (`needs=`, `on=`, a function of its own).
    # `launch` takes the flags as keywords into `DistributeOptions`, whose defaults they are.
    assert inspect.signature(launch).parameters["flags"].kind is inspect.Parameter.VAR_KEYWORD
    public = inspect.signature(distribute).parameters
    for flag in FLAGS:
        keyword, _, default = flag.python.partition("=")
        if keyword == flag.dest:
            assert public[flag.dest].default == flag.default and default == repr(flag.default), flag.name
        else:
            assert flag.dest not in public, f"{flag.name}: distribute() spells it {flag.python}"
            assert keyword in public or keyword.startswith("nbcluster."), flag.name
    # Every start option is an argument of the one check of a start request.
    assert {o.field for o in START_OPTIONS} <= set(inspect.signature(ClusterSpec.from_user).parameters)


# A fenced code block: its fence, its info string (language or {directive}), and the line
# above it (where a "% not executed: why" mark goes).
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$", re.MULTILINE)
NOT_EXECUTED = re.compile(r"^ *% not executed: (?P<why>.{15,})$")  # indented: inside a list item
# Directives that show code without running it; {code-cell} runs, and the rest hold no code.
SHOWS_CODE = ("{code-block}", "{code}", "{sourcecode}", "{literalinclude}")


def unexecuted_blocks(page: Path) -> list[str]:
    """Code blocks of a docs page neither executed nor marked as not executable with a reason.

    Executed: a ``{code-cell}`` of a page that myst-nb runs (front matter
    ``file_format: mystnb``). Marked: the line above the fence is
    ``% not executed: WHY`` (a MyST comment), WHY saying why and where it is checked instead.
    Other directives (``{toctree}``, ``{eval-rst}``, ...) hold no code of their own.
    """
    text = page.read_text()
    lines = text.splitlines()
    executed = text.startswith("---\n") and "file_format: mystnb" in text.split("\n---", 1)[0]
    out = []
    closing: str | None = None  # the fence that ends the block we are in
    for number, line in enumerate(lines):
        match = FENCE.match(line)
        if not match:
            continue
        if closing is not None:
            if match["fence"].startswith(closing) and not match["info"].strip():
                closing = None
            continue
        closing = match["fence"]
        info = match["info"].strip()
        shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
        where = f"{shown}:{number + 1}: {match['fence']}{info}"
        if info.startswith("{code-cell}"):
            if not executed:
                out.append(f"{where} (a code-cell on a page myst-nb does not execute)")
        elif info.startswith("{") and not info.startswith(SHOWS_CODE):
            continue
        elif not NOT_EXECUTED.match(lines[number - 1] if number else ""):
            out.append(where)
    return out


def docs_pages() -> list[Path]:
    """The docs' own Markdown pages (not the build, nor the notebooks rendered into it)."""
    generated = (ROOT / "docs" / "_build", ROOT / "docs" / "teaching" / "notebooks")
    return [
        p for p in sorted((ROOT / "docs").rglob("*.md")) if not any(p.is_relative_to(g) for g in generated)
    ]


def test_every_code_block_in_the_docs_is_executed_or_says_why_not() -> None:
    pages = docs_pages()
    found = [block for page in pages for block in unexecuted_blocks(page)]
    assert not found, (
        "code blocks neither executed ({code-cell} on a `file_format: mystnb` page) nor marked with "
        "`% not executed: WHY` on the line above:\n" + "\n".join(found)
    )


def test_the_block_check_refuses_what_it_should(tmp_path: Path) -> None:
    # The rule on pages made to break it: a check that passes everything is no check.
    page = tmp_path / "check.md"
    page.write_text(
        "# A page\n\n```python\nx = 1\n```\n\n% not executed: too short\n```bash\nls\n```\n\n"
        "% not executed: it needs a SLURM cluster; tests/test_slurm.py runs it\n```bash\nsbatch\n```\n\n"
        "```{code-cell} ipython3\n1\n```\n\n```{toctree}\nx\n```\n"
    )
    assert unexecuted_blocks(page) == [
        "check.md:3: ```python",
        "check.md:8: ```bash",
        "check.md:17: ```{code-cell} ipython3 (a code-cell on a page myst-nb does not execute)",
    ]


def test_teaching_notebook_is_executed_once_then_comes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("jupyter_cache", reason="the docs extra is not installed: pip install -e '.[docs]'")
    import nbformat

    tn = teaching_notebooks()
    monkeypatch.setattr(tn, "CACHE", tmp_path / "cache")
    path = tmp_path / "lesson.ipynb"
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# A lesson"),
            nbformat.v4.new_code_cell("import os; os.environ['NBCLUSTER_SMALL']"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, path)
    first, cached = tn.executed(path)
    assert not cached and first.cells[1].outputs[0].data["text/plain"] == "'1'"  # run in small mode
    again, cached = tn.executed(path)
    assert cached and again.cells[0].source == "# A lesson"  # the Markdown is merged back
    assert again.cells[1].outputs == first.cells[1].outputs
    nb.cells[1].source = "1 / 0"
    nbformat.write(nb, path)
    with pytest.raises(
        Exception, match=r"lesson.ipynb raised when executed for the docs: cell 1: ZeroDivisionError"
    ):
        tn.executed(path)  # a changed notebook runs again, and a broken one fails the build


def test_a_graded_run_of_the_notebook_tests_fills_the_docs_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What tests/test_notebooks.py stores (nbclient's timing metadata, gaps in the counts
    # where wrong answers were tried) must match the notebook as it is in the repository.
    pytest.importorskip("jupyter_cache", reason="the docs extra is not installed: pip install -e '.[docs]'")
    import nbformat

    tn = teaching_notebooks()
    monkeypatch.setattr(tn, "CACHE", tmp_path / "cache")
    path = ROOT / "notebooks" / "00-getting-started.ipynb"
    run = nbformat.read(path, as_version=4)
    for count, cell in enumerate(c for c in run.cells if c.cell_type == "code"):
        cell.execution_count = 2 * count + 5
        cell.metadata["execution"] = {"iopub.execute_input": f"2026-01-01T00:00:0{count % 10}Z"}
        cell.outputs = [nbformat.v4.new_output("stream", text=f"out {count}\n")]
    tn.store(path, run)
    shown, cached = tn.executed(path)
    assert cached
    code = [c for c in shown.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert [c.outputs[0].text for c in code] == [f"out {i}\n" for i in range(len(code))]
    # Rendered with IPython's lexer, which knows `%cluster start --workers $WORKERS`.
    assert tn.for_students(shown).metadata.language_info.pygments_lexer == "ipython3"


def test_site_teaching_pages_are_what_a_student_gets(site: Path) -> None:
    import nbformat

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page = text(site, f"teaching/notebooks/{path.stem}.html")
        nb = nbformat.read(path, as_version=4)
        answers = []
        for cell in nb.cells:
            for begin, end in (
                ("### BEGIN SOLUTION", "### END SOLUTION"),
                ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"),
            ):
                for region in re.findall(rf"(?s){begin}(.*?){end}", cell.source):
                    answers += [line.strip() for line in region.splitlines() if len(line.strip()) > 25]
        # A line that the notebook also has outside its answers (an import, a seed) gives nothing away.
        rest = " ".join(
            " ".join(re.sub(r"(?s)### BEGIN (SOLUTION|HIDDEN TESTS).*?### END \1", "", c.source).split())
            for c in nb.cells
        )
        shown = [a for a in answers if " ".join(a.split()) in page and " ".join(a.split()) not in rest]
        assert not shown, f"{path.name}: the site shows the instructor's answers: {shown[:3]}"
        if any(c.metadata.get("nbgrader", {}).get("solution") for c in nb.cells):
            assert "YOUR CODE HERE" in page, path.name


def test_each_screenshot_the_browser_test_takes_is_committed_and_shown() -> None:
    pages = "\n".join(p.read_text() for p in docs_pages())
    for name in NAMES:
        assert (SHOTS / f"{name}.png").exists(), f"{name}.png: run tests/test_docs_screenshots.py and commit it"
        assert f"_static/screenshots/{name}.png" in pages, f"no docs page shows {name}.png"
    assert "docs/_static/screenshots/live-cell-and-sidebar.png" in (ROOT / "README.md").read_text()
