"""Sphinx directives that write nbcluster's references from the declarations themselves.

Nothing in these tables is typed by hand, so they cannot drift from the code:

- ``nbcluster-command NAME``: one subcommand of the `cluster` language (`%cluster NAME` and
  ``nbcluster NAME``), from the argparse parser `nbcluster.commands.build_parser` makes
  (whose start options come from `nbcluster.cluster.spec.START_OPTIONS`);
- ``nbcluster-distribute-options``: the `%%distribute` flags, from
  `nbcluster.run.options.FLAGS`, with the Python spelling of each (`distribute()`'s keyword
  and default, or where it went);
- ``nbcluster-settings``: every key of ``nbcluster.yaml`` with its kind, default and the
  comment above it, via `nbcluster.config_schema.load`.

The build also writes the REST API's OpenAPI document (`nbcluster.server.openapi`) to
``reference/_generated/openapi.json`` for sphinxcontrib-openapi to render. A subcommand that
no page renders is a warning, so a new command fails the ``-W`` build until it is documented.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)
_CODE = re.compile(r"`([^`]+)`")


def inline(text: str) -> list[nodes.Node]:
    """`text` with its `backticked` spans as code, everything else literally (no markup)."""
    out: list[nodes.Node] = []
    for i, part in enumerate(_CODE.split(text)):
        if part:
            out.append(nodes.literal(part, part) if i % 2 else nodes.Text(part))
    return out


def table(headers: list[str], rows: list[list[list[nodes.Node]]], widths: list[int]) -> nodes.table:
    group = nodes.tgroup(cols=len(headers))
    group += [nodes.colspec(colwidth=w) for w in widths]
    head = nodes.thead()
    head += _row([[nodes.Text(h)] for h in headers])
    body = nodes.tbody()
    body += [_row(cells) for cells in rows]
    group += [head, body]
    out = nodes.table(classes=["nbcluster-reference"])
    out += group
    return out


def _row(cells: list[list[nodes.Node]]) -> nodes.row:
    row = nodes.row()
    for content in cells:
        entry = nodes.entry()
        entry += nodes.paragraph("", "", *content)
        row += entry
    return row


def code(text: str) -> list[nodes.Node]:
    return [nodes.literal(text, text)]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from nbcluster import commands

    parser = commands.build_parser("%cluster")
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


class CommandDirective(SphinxDirective):
    """``nbcluster-command NAME``: the usage line, what it does, and its arguments."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        from nbcluster import commands

        name = self.arguments[0]
        parsers = _subcommands()
        if name not in parsers:
            raise self.error(f"nbcluster has no command {name!r}; it has {', '.join(commands.COMMANDS)}")
        self.env.nbcluster_commands = getattr(self.env, "nbcluster_commands", set()) | {name}
        parser = parsers[name]
        usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
        top = _subcommands_help()[name]
        # The CLI has every command but `use` (a terminal has no current cluster).
        both = usage + "\n" + usage.replace("%cluster", "nbcluster", 1) if name in commands.CLI_COMMANDS else usage
        out: list[nodes.Node] = [
            nodes.paragraph("", "", *inline(top[0].upper() + top[1:] + ".")),
            # rawsource differs from the text: Sphinx then shows it as written, unhighlighted.
            nodes.literal_block(usage + " ", both),
        ]
        rows = []
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue  # the help, and old spellings kept working for a release
            if action.option_strings:
                flag = action.option_strings[0]
                shown = flag if action.nargs == 0 else f"{flag} {action.metavar or action.dest.upper()}"
            else:
                shown = action.metavar or action.dest.upper()
                if action.nargs == "?":
                    shown = f"[{shown}]"
            meaning = (action.help or "").replace("%%", "%")
            if action.choices:
                meaning += f" (one of: {', '.join(map(str, action.choices))})"
            if action.required and action.option_strings:
                meaning += " (required)"
            rows.append([code(shown), inline(meaning)])
        if rows:
            out.append(table(["argument", "meaning"], rows, [30, 70]))
        return out


def _subcommands_help() -> dict[str, str]:
    from nbcluster import commands

    parser = commands.build_parser("%cluster")
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {choice.dest: choice.help or "" for choice in sub._choices_actions}


class DistributeOptionsDirective(SphinxDirective):
    """``nbcluster-distribute-options``: every `%%distribute` flag, as `FLAGS` declares it."""

    def run(self) -> list[nodes.Node]:
        from nbcluster.run.options import FLAGS

        rows = [
            [code(flag.usage), code(flag.python), inline(flag.help)] for flag in FLAGS
        ]
        return [table(["flag", "in Python", "meaning"], rows, [28, 22, 50])]


class SettingsDirective(SphinxDirective):
    """``nbcluster-settings``: the settings of ``nbcluster.yaml``, or those below the sections
    ``:below:`` names (``limits timeouts``)."""

    option_spec = {"below": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from nbcluster.config_schema import KINDS, load

        below = tuple(f"{section}." for section in self.options.get("below", "").split())
        rows = []
        for key, setting in load().items():
            if setting.kind == "section" or (below and not key.startswith(below)):
                continue
            default = json.dumps(setting.default) if not isinstance(setting.default, str) else setting.default
            kind = KINDS.get(setting.kind, setting.kind)
            meaning = " ".join(setting.description.split()) or "(no description in nbcluster.yaml)"
            rows.append([code(f"nbcluster.{key}"), code(default), inline(kind), inline(meaning)])
        return [table(["setting", "default", "kind", "meaning"], rows, [24, 14, 14, 48])]


def write_openapi(app: Sphinx) -> None:
    from nbcluster.server.openapi import document

    target = Path(app.srcdir) / "reference" / "_generated" / "openapi.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document(), indent=1) + "\n"
    if not target.exists() or target.read_text() != text:  # unchanged: no rebuild of the page
        target.write_text(text)


def check_commands(app: Sphinx, env: Any) -> None:
    from nbcluster import commands

    missing = sorted(set(commands.COMMANDS) - getattr(env, "nbcluster_commands", set()))
    if missing:
        logger.warning("no page renders the command(s) %s: add a nbcluster-command directive", missing)


def purge(app: Sphinx, env: Any, docname: str) -> None:
    # Rebuilt pages add their commands again; a purged page's are recounted from scratch.
    if hasattr(env, "nbcluster_commands") and docname == "reference/options":
        env.nbcluster_commands = set()


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("nbcluster-command", CommandDirective)
    app.add_directive("nbcluster-distribute-options", DistributeOptionsDirective)
    app.add_directive("nbcluster-settings", SettingsDirective)
    app.connect("builder-inited", write_openapi)
    app.connect("env-purge-doc", purge)
    app.connect("env-check-consistency", check_commands)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
