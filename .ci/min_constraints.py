"""The oldest allowed version of each nbcluster dependency, from pyproject.toml, for pip.

    python .ci/min_constraints.py constraints > min.txt   # `name==floor` lines (pip --constraint)
    python .ci/min_constraints.py requirements            # the requirements themselves, one a line

Reads `[project] dependencies` and the extras users install (`USER_EXTRAS`), so each floor is
written once, in pyproject.toml. Every requirement there must have a `>=` floor that is a real
release: a floor pip cannot install fails the minimum-versions lane (.ci/run) instead of being
skipped. Where two requirements name one package, the higher floor wins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
#: The extras a user installs (`pip install "nbcluster[lab]"`); not test, docs or bench.
USER_EXTRAS = ("lab", "jobqueue", "gateway", "ssh", "kubernetes")


def requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """nbcluster's dependencies and its users' extras, as written in `pyproject`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in USER_EXTRAS:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def floors(reqs: list[Requirement]) -> dict[str, str]:
    """Each package's `>=` floor, by canonical name; SystemExit naming one that has none."""
    found: dict[str, str] = {}
    for req in reqs:
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if not lower:
            sys.exit(f"min_constraints: {req} in pyproject.toml has no >= floor; give it one")
        name = canonicalize_name(req.name)
        if name not in found or Version(lower[0]) > Version(found[name]):
            found[name] = lower[0]
    return found


def main(argv: list[str]) -> None:
    what = argv[0] if argv else "constraints"
    reqs = requirements()
    if what == "constraints":
        print("\n".join(f"{name}=={floor}" for name, floor in sorted(floors(reqs).items())))
    elif what == "requirements":
        print("\n".join(str(r) for r in reqs))
    else:
        sys.exit("usage: min_constraints.py [constraints|requirements]")


if __name__ == "__main__":
    main(sys.argv[1:])
