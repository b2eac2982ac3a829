"""binder/ installs what pyproject.toml declares, and that is enough for every notebook.

mybinder.org builds the image from binder/: `environment.yml` (Python and Node, which the
sidebar's build from this checkout needs) and `postBuild` (pip installs the checkout with
some extras). These tests fail when the two drift apart: an extra that pyproject.toml lacks,
a Python that `requires-python` excludes, or a notebook importing a package that neither the
dependencies nor the installed extras bring (directly or through their own dependencies).
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import nbformat
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).parent.parent
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def binder_extras() -> list[str]:
    """The extras of the checkout that postBuild installs: `pip install ".[a,b]"` -> [a, b]."""
    found = re.findall(r"pip install[^\n]*?[\"']?\.\[([\w,\s-]+)\][\"']?", (BINDER / "postBuild").read_text())
    assert len(found) == 1, "postBuild must pip install this checkout with its extras, once"
    return [e.strip() for e in found[0].split(",")]


def declared(extras: list[str]) -> list[Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def installed_closure(reqs: list[Requirement]) -> set[str]:
    """Distributions these requirements install, following their own requirements (as
    installed here)."""
    seen: set[str] = set()
    todo = [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            wanted = set(req.extras) | {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(sub)
    return seen


def notebook_imports(path: Path) -> set[str]:
    """Top-level modules a notebook imports, except inside `try:` (optional ones, like cupy)."""
    names: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(
            "" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines()
        )
        tree = ast.parse(source)
        optional = {
            id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for s in t.body for n in ast.walk(s)
        }
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"nbcluster"}


def missing_dependencies(paths: list[Path], extras: list[str]) -> dict[str, str]:
    """{module: distribution} for imports that the binder install would not bring."""
    providers = metadata.packages_distributions()
    closure = installed_closure(declared(extras))
    missing = {}
    for path in paths:
        for module in sorted(notebook_imports(path)):
            dists = [canonicalize_name(d) for d in providers.get(module, [module])]
            if not any(d in closure for d in dists):
                missing[module] = ", ".join(dists) + f" (imported by {path.name})"
    return missing


def test_postbuild_installs_declared_extras() -> None:
    extras = binder_extras()
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"]), extras
    assert "jupyterlab" in {canonicalize_name(r.name) for r in declared(extras)}, "Binder must get JupyterLab"


def test_every_notebook_import_is_installed_on_binder() -> None:
    assert missing_dependencies(NOTEBOOKS, binder_extras()) == {}


def test_the_check_catches_an_undeclared_import(tmp_path: Path) -> None:
    """nbgrader is a test extra, not a lab one: a notebook importing it would break on Binder."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%load_ext nbcluster\nimport nbgrader")])
    nbformat.write(nb, tmp_path / "uses-nbgrader.ipynb")
    assert list(missing_dependencies([tmp_path / "uses-nbgrader.ipynb"], binder_extras())) == ["nbgrader"]


def test_environment_matches_pyproject() -> None:
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    pins = dict(d.split("=", 1) for d in env["dependencies"] if isinstance(d, str) and "=" in d)
    assert pins["python"] in SpecifierSet(PYPROJECT["project"]["requires-python"]), pins["python"]
    # Installing from the checkout builds the sidebar: Node.js 20 or later (see README.md).
    assert int(pins["nodejs"].split(".")[0]) >= 20, pins["nodejs"]
    assert "pip" in env["dependencies"]


def test_binder_opens_the_getting_started_notebook() -> None:
    assert "binder/jupyter_server_config.py" in (BINDER / "postBuild").read_text()
    config = (BINDER / "jupyter_server_config.py").read_text()
    url = re.search(r"default_url\s*=\s*[\"']/lab/tree/([^\"']+)[\"']", config)
    assert url and (ROOT / url.group(1)).is_file(), config
    assert url.group(1) == "notebooks/00-getting-started.ipynb"
