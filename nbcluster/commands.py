"""The `cluster` command language, shared by the `%cluster` magic and the `nbcluster` CLI.

One parser, one dispatcher: both front ends accept the same words and reject the same
mistakes with the same one-line message (`BadArgument`). Each command calls the Python API
and returns something to display (`ClusterInfo`, `ClusterList`) or a line of text.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from nbcluster import _aio, _current
from nbcluster.cluster import profiles
from nbcluster.cluster.handle import ClusterHandle, clusters, connect
from nbcluster.cluster.handle import start as start_cluster
from nbcluster.cluster.info import ClusterInfo, ClusterList
from nbcluster.cluster.kinds import KINDS
from nbcluster.cluster.spec import FORCE_HELP, START_OPTIONS, parse_bounds, parse_count
from nbcluster.errors import BadArgument, ClusterUnreachable, HelpShown, NoCluster
from nbcluster.journal import runs
from nbcluster.persist import locals as worker_locals
from nbcluster.persist.handles import holdings_lines

COMMANDS = ("start", "scale", "adapt", "status", "list", "use", "stop", "restart", "profiles", "runs")
#: The commands of the `nbcluster` CLI: `use` sets a kernel's current cluster, and a
#: terminal has none (each CLI command names its cluster, or takes the only one running).
CLI_COMMANDS = tuple(c for c in COMMANDS if c != "use")
#: `adapt`'s bounds when a front end leaves them out: the defaults of `ClusterHandle.adapt`.
ADAPT_MIN, ADAPT_MAX = 0, 4
_NAME_HELP = "cluster (default: the current one; in a terminal, the only one running)"


class _Parser(argparse.ArgumentParser):
    """argparse that raises BadArgument instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")  # argparse wraps it: one line
        raise BadArgument(f"{message}. Usage: {usage}")

    def print_help(self, file: object = None) -> NoReturn:
        # argparse's --help prints, then exits: the front end prints the text once, instead.
        raise HelpShown(self.format_help())


def renamed(old: str, new: str) -> str:
    """The one line an old spelling prints: it works for one release more.

    Parameters
    ----------
    old, new : str
        The old spelling and the one to use instead.

    Returns
    -------
    str
        ``note: `OLD` is now `NEW`; the old spelling goes in the next release.``
    """
    return f"note: `{old}` is now `{new}`; the old spelling goes in the next release."


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The parser of the ``cluster`` language: every command and its options.

    The ``start`` options come from `cluster.spec.START_OPTIONS`, the declarations the
    Python API's `start()` takes too, so the three front ends cannot drift apart.

    Old spellings (``start --gpus``, ``scale --name``, ``adapt --name``, ``runs --show``)
    are parsed too, hidden from the help; `parse` turns them into the new ones with a
    notice.

    Parameters
    ----------
    prog : str
        The program name usage lines show: ``"%cluster"`` or ``"nbcluster"`` (which has no
        ``use``: `CLI_COMMANDS`).

    Returns
    -------
    argparse.ArgumentParser
        A parser whose errors raise `BadArgument` and whose ``--help`` raises `HelpShown`,
        rather than printing and exiting.
    """
    names = CLI_COMMANDS if prog == "nbcluster" else COMMANDS
    p = _Parser(prog=prog, description="Start, scale, adapt and stop Dask clusters.")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}", parser_class=_Parser)
    sub.required = True

    s = sub.add_parser("start", help="start a cluster (or reuse the running one of that name)")
    for option in START_OPTIONS:
        if option.switch:
            s.add_argument(f"--{option.flag}", action="store_true", help=option.help.replace("%", "%%"))
        else:
            s.add_argument(f"--{option.flag}", metavar=option.metavar, help=option.help.replace("%", "%%"))
    s.add_argument("--gpus", dest="old_gpus", help=argparse.SUPPRESS)  # now --gpu-workers

    s = sub.add_parser("scale", help="set the number of workers of a kind")
    s.add_argument("n", help="number of workers")
    s.add_argument("name", nargs="?", help=_NAME_HELP)
    s.add_argument("--kind", default="cpu", choices=KINDS, help="worker kind (default: cpu)")
    s.add_argument("--force", action="store_true", help=FORCE_HELP)
    s.add_argument("--name", dest="old_name", help=argparse.SUPPRESS)  # now positional

    s = sub.add_parser("adapt", help="scale CPU workers automatically between --min and --max")
    s.add_argument("name", nargs="?", help=_NAME_HELP)
    s.add_argument("--min", default=str(ADAPT_MIN), dest="minimum", help=f"fewest workers (default: {ADAPT_MIN})")
    s.add_argument("--max", default=str(ADAPT_MAX), dest="maximum", help=f"most workers (default: {ADAPT_MAX})")
    s.add_argument("--force", action="store_true", help=FORCE_HELP)
    s.add_argument("--name", dest="old_name", help=argparse.SUPPRESS)  # now positional

    s = sub.add_parser("status", help="workers, cores, memory, GPUs and tasks of a cluster")
    s.add_argument("name", nargs="?", help=_NAME_HELP)

    sub.add_parser("list", help="the running clusters nbcluster started (its registry), and the one `use` attached")

    if "use" in names:
        s = sub.add_parser("use", help="make a cluster the kernel's current one (by name or tls:// address)")
        s.add_argument("target", help="a cluster name, or a scheduler address such as tls://host:8786")
        s.add_argument(
            "--security", metavar="CA,CERT,KEY", help="PEM files for a tls:// scheduler run by someone else"
        )

    s = sub.add_parser("stop", help="stop a cluster and its workers")
    s.add_argument("name", nargs="?", help=_NAME_HELP)
    s.add_argument("--all", action="store_true", help="stop every running cluster")

    s = sub.add_parser("restart", help="restart the workers (the cluster stays)")
    s.add_argument("name", nargs="?", help=_NAME_HELP)

    sub.add_parser("profiles", help="where clusters can run: the profiles in Dask config")

    s = sub.add_parser("runs", help="the journaled runs of distribute cells, which --resume picks up")
    s.add_argument(
        "ids", nargs="*", metavar="ID",
        help="show these runs' journals (where items ran, the failed items and their errors); none: list every run",
    )  # fmt: skip
    s.add_argument("--forget", action="store_true", help="delete the journals of the IDs given")
    s.add_argument("--all", action="store_true", help="with --forget: delete every journal not in use")
    s.add_argument("--show", dest="old_show", help=argparse.SUPPRESS)  # now `runs ID`
    return p


def parse(argv: str | Sequence[str], prog: str = "%cluster") -> argparse.Namespace:
    """Parse a ``%cluster`` line or the CLI's words into a command.

    Parameters
    ----------
    argv : str or Sequence of str
        A magic's line (split as a shell would) or the CLI's arguments.
    prog : str
        The program name for messages.

    Returns
    -------
    argparse.Namespace
        ``command`` (one of `COMMANDS`) and its options, and ``notices``: one line per old
        spelling used, for the front end to show.

    Raises
    ------
    nbcluster.errors.BadArgument
        For an empty line, an unknown command, an unclosed quote or a bad option, with the
        usage.
    nbcluster.errors.HelpShown
        For ``--help``: it carries the help text, which the front end prints.

    Examples
    --------
    >>> parse("scale 4 --kind gpu").kind
    'gpu'
    """
    if isinstance(argv, str):
        try:
            args = shlex.split(argv)
        except ValueError as e:  # shlex's only error: an unclosed quote or a trailing backslash
            raise BadArgument(f"cannot read `{argv.strip()}`: {e}; close the quote or drop it") from None
    else:
        args = list(argv)
    names = CLI_COMMANDS if prog == "nbcluster" else COMMANDS
    if not args:
        raise BadArgument(f"say what to do: {prog} {{{','.join(names)}}} (e.g. `{prog} start`)")
    if args[0] == "use" and prog == "nbcluster":
        raise BadArgument(
            "`use` sets a notebook kernel's current cluster (`%cluster use NAME`); a terminal has none: "
            "name the cluster in the command instead (`nbcluster status NAME`)"
        )
    if args[0] not in names and not args[0].startswith("-"):
        raise BadArgument(f"unknown command {args[0]!r}: use one of {', '.join(names)}")
    return _modern(build_parser(prog).parse_args(args), prog)


def _modern(ns: argparse.Namespace, prog: str) -> argparse.Namespace:
    """Turn an old spelling into the new one, with its one-line notice in ``ns.notices``."""
    ns.notices = []
    old = {"start": "old_gpus", "scale": "old_name", "adapt": "old_name", "runs": "old_show"}.get(ns.command)
    value = getattr(ns, old, None) if old else None
    if value is None:
        return ns
    if ns.command == "start":
        if ns.gpu_workers is not None:
            raise BadArgument("give --gpu-workers only: --gpus is its old name on `start`")
        ns.gpu_workers = value
        ns.notices.append(renamed(f"{prog} start --gpus", f"{prog} start --gpu-workers"))
    elif ns.command == "runs":
        if ns.ids or ns.forget:
            raise BadArgument(f"--show is the old spelling of `{prog} runs ID`: give the ID alone")
        ns.ids = [value]
        ns.notices.append(renamed(f"{prog} runs --show ID", f"{prog} runs ID"))
    else:
        if ns.name is not None:
            raise BadArgument(f"name the cluster once: `{prog} {ns.command} ... NAME` (--name is its old spelling)")
        ns.name = value
        new = f"{prog} scale N NAME" if ns.command == "scale" else f"{prog} adapt NAME"
        ns.notices.append(renamed(f"{prog} {ns.command} --name NAME", new))
    return ns


class LiveClusterInfo(ClusterInfo):
    """`%cluster status` in a notebook: the table, then the cluster's live graphs under it."""

    def __init__(self, info: ClusterInfo, handle: ClusterHandle):
        super().__init__(info.data, note=info.note)
        self.handle = handle

    def _ipython_display_(self) -> None:
        from IPython.display import display

        from nbcluster import widgets

        # what the kernel's --persist runs keep on the workers, and what worker_local built there
        held = holdings_lines(self.handle.client) + worker_locals.status_lines(self.handle.client)
        text, page = repr(self), self._repr_html_()
        if held:
            text += "\n" + "\n".join(held)
            page += "<pre>" + html.escape("\n".join(held)) + "</pre>"
        display({"text/plain": text, "text/html": page}, raw=True)
        widgets.status(self.handle)


class Runner:
    """Carries out parsed commands for one front end.

    In a kernel (`in_kernel=True`) the kernel owns what it starts and commands default to
    the current cluster; in a terminal clusters are kept (the CLI exits at once) and
    commands default to the only running cluster.
    """

    def __init__(self, *, in_kernel: bool):
        self.in_kernel = in_kernel

    def run(self, ns: argparse.Namespace) -> Any:
        """Carry out one parsed command.

        Parameters
        ----------
        ns : argparse.Namespace
            The command, from `parse`.

        Returns
        -------
        Any
            What to show: a `ClusterInfo`, a `ClusterList`, or a line of text.

        Raises
        ------
        nbcluster.errors.NbclusterError
            Each command's one-line mistakes (`BadArgument`, `NoCluster`,
            `ClusterUnreachable`, ...), which the front end shows as one line.
        """
        return getattr(self, "do_" + ns.command)(ns)

    def _target(self, name: str | None) -> ClusterHandle:
        if name:
            return _current.remember(connect(name)) if self.in_kernel else connect(name)
        if self.in_kernel:
            return _current.handle_for(None)
        running = clusters()
        if len(running) == 1:
            return running[0]
        if not running:
            raise NoCluster("no cluster is running: start one with `nbcluster start`")
        names = ", ".join(h.name for h in running)
        raise BadArgument(f"several clusters are running ({names}): name one")

    def do_start(self, ns: argparse.Namespace) -> ClusterInfo:
        """``start``: start a cluster, or reuse the running one of that name.

        In a kernel the kernel owns it (stopped with the kernel unless ``--keep``); from a
        terminal it is always kept.

        Parameters
        ----------
        ns : argparse.Namespace
            The ``start`` options (`cluster.spec.START_OPTIONS`).

        Returns
        -------
        ClusterInfo
            The cluster's status, with a note: started, or already running and reused.
        """
        options = {o.field: getattr(ns, o.field) for o in START_OPTIONS if o.field != "keep"}
        if self.in_kernel:
            handle = _current.start(keep=ns.keep, **options)
        else:
            handle = start_cluster(keep=True, **options)
        info = handle.info()
        if handle.reused:
            note = f"Cluster {handle.name!r} is already running: using it (`%cluster scale N` to resize)."
        else:
            note = f"Started cluster {handle.name!r}."
            if not self.in_kernel:
                note += f" It keeps running until `nbcluster stop {handle.name}`; in a notebook: `%cluster use {handle.name}`."
        if info.data.get("notice"):
            note += f"\n{info.data['notice']}"
        info.note = note
        return info

    def do_scale(self, ns: argparse.Namespace) -> ClusterInfo:
        """``scale N [NAME]``: set the number of workers of a kind.

        Parameters
        ----------
        ns : argparse.Namespace
            ``n``, ``kind``, ``name`` (the cluster; default the current one) and ``force``.

        Returns
        -------
        ClusterInfo
            The cluster's status after the request.

        Raises
        ------
        nbcluster.errors.BadArgument
            For a count that is not a whole number, or one over the limits (without ``--force``).
        """
        n = parse_count(ns.n, "the number of workers")  # a typo is reported before anything else
        handle = self._target(ns.name)
        handle.scale(n, kind=ns.kind, force=ns.force)
        return handle.info()

    def do_adapt(self, ns: argparse.Namespace) -> ClusterInfo:
        """``adapt [NAME] [--min A] [--max B]``: scale CPU workers automatically between A and B.

        Parameters
        ----------
        ns : argparse.Namespace
            ``name``, ``minimum`` and ``maximum`` (default `ADAPT_MIN` and `ADAPT_MAX`, those
            of `ClusterHandle.adapt`) and ``force``.

        Returns
        -------
        ClusterInfo
            The cluster's status.

        Raises
        ------
        nbcluster.errors.BadArgument
            For bounds that are not whole numbers or not in order, or over the limits.
        """
        lo, hi = parse_bounds(ns.minimum, ns.maximum)  # a typo is reported before anything else
        handle = self._target(ns.name)
        handle.adapt(lo, hi, force=ns.force)
        return handle.info()

    def do_status(self, ns: argparse.Namespace) -> ClusterInfo:
        """``status [NAME]``: a cluster's workers, cores, memory, GPUs and tasks.

        Parameters
        ----------
        ns : argparse.Namespace
            ``name``: the cluster; the current (or only running) one when None.

        Returns
        -------
        ClusterInfo
            In a kernel a `LiveClusterInfo` (the table, what ``--persist`` runs hold, the live
            graphs); in a terminal the table.
        """
        handle = self._target(ns.name)
        return LiveClusterInfo(handle.info(), handle) if self.in_kernel else handle.info()

    def do_list(self, ns: argparse.Namespace) -> ClusterList:
        """``list``: the running clusters of the user's registry, whoever started them.

        These are the clusters nbcluster started: from a notebook, a terminal or the
        sidebar, by this user. A cluster attached with ``use`` (in no registry) is listed
        too; other Dask clusters (a plain ``LocalCluster``, one made with dask-jobqueue by
        hand) are not. Clusters are asked for
        their status at once; one that does not answer is shown from its registry entry.

        Parameters
        ----------
        ns : argparse.Namespace
            No options.

        Returns
        -------
        ClusterList
            The clusters, with the current one marked.
        """
        handles = clusters()
        current = _current.current() if self.in_kernel else None
        if current is not None and not current.managed:
            handles.append(current)  # attached with `use`: in no registry, yet where work runs

        async def one(h: ClusterHandle) -> Mapping[str, Any]:
            try:
                return await h.ainfo()
            except ClusterUnreachable:
                return h.entry

        async def every() -> list[Mapping[str, Any]]:
            return list(await asyncio.gather(*(one(h) for h in handles)))

        return ClusterList(_aio.run(every()), current.name if current else None)

    def do_use(self, ns: argparse.Namespace) -> ClusterInfo:
        """``use NAME|tls://ADDRESS``: make a cluster the kernel's current one.

        Parameters
        ----------
        ns : argparse.Namespace
            ``target`` (a name or scheduler address) and ``security`` (``CA,CERT,KEY`` files
            for a TLS scheduler run by someone else).

        Returns
        -------
        ClusterInfo
            The cluster's status, with a note that work now runs there.

        The CLI has no ``use`` (`CLI_COMMANDS`): `parse` refuses it there with the fix.
        """
        handle = _current.attach(ns.target, security=ns.security)
        info = handle.info()
        info.note = f"Using cluster {handle.name!r}: %%distribute and Dask's default client now run there."
        if not handle.managed:
            info.note += " It is external: scale, adapt and stop belong to whoever runs it."
        return info

    def do_profiles(self, ns: argparse.Namespace) -> str:
        """``profiles``: where clusters can run, from the profiles in Dask config.

        Parameters
        ----------
        ns : argparse.Namespace
            No options.

        Returns
        -------
        str
            One line per usable profile (name, backend, description), one per profile that is
            not usable and why, then how to use and add them.
        """
        usable, mistakes = profiles.checked()
        rows = [(p.name, p.backend, p.description) for p in usable]
        widths = [max(len(r[i]) for r in [("name", "backend", ""), *rows]) for i in range(2)]
        lines = [f"{n:<{widths[0]}}  {b:<{widths[1]}}  {d}".rstrip() for n, b, d in rows]
        lines += [f"Not usable: {m}" for m in mistakes]
        return "\n".join(
            [*lines, "Start one with `--profile NAME`; add profiles under nbcluster.profiles in Dask config."]
        )

    def do_runs(self, ns: argparse.Namespace) -> str:
        """``runs [ID...] [--forget] [--all]``: list, show or delete the journaled runs.

        ``runs`` lists them, ``runs ID`` shows one (several IDs: each in turn), ``runs ID...
        --forget`` deletes those, and ``runs --forget --all`` every journal not in use.

        Parameters
        ----------
        ns : argparse.Namespace
            ``ids``, ``forget`` and ``all``.

        Returns
        -------
        str
            The table of runs (`journal.runs.table`), the runs' journals
            (`journal.runs.show`), or what was forgotten.

        Raises
        ------
        nbcluster.errors.BadArgument
            For ``--all`` without ``--forget``, ``--forget`` with neither IDs nor ``--all``,
            or IDs `journal.runs.forget` or `journal.runs.show` cannot take.
        """
        if ns.forget:
            return runs.forget(ns.ids, ns.all, _current.client_of)
        if ns.all:
            raise BadArgument("--all goes with --forget: `runs --forget --all` deletes every journal")
        if not ns.ids:
            return runs.table(_current.client_of)
        return "\n\n".join(runs.show(ident) for ident in ns.ids)

    def do_stop(self, ns: argparse.Namespace) -> str:
        """``stop [NAME | --all]``: stop a cluster (or every one) and its workers.

        Parameters
        ----------
        ns : argparse.Namespace
            ``name`` and ``all``.

        Returns
        -------
        str
            Which clusters were stopped, or that none were running.

        Raises
        ------
        nbcluster.errors.BadArgument
            For both a name and ``--all``.
        """
        if ns.all and ns.name:
            raise BadArgument("give a cluster name or --all, not both")
        targets = clusters() if ns.all else [self._target(ns.name)]
        for handle in targets:
            # This process's clients go first: a client whose scheduler vanishes under it
            # tries to reconnect and logs a traceback into the cell or terminal.
            _current.forget(handle.name)
            handle.stop()
        if not targets:
            return "No clusters were running."
        return "Stopped " + ", ".join(repr(h.name) for h in targets) + "."

    def do_restart(self, ns: argparse.Namespace) -> ClusterInfo:
        """``restart [NAME]``: restart a cluster's workers; the cluster stays.

        Parameters
        ----------
        ns : argparse.Namespace
            ``name``: the cluster; the current (or only running) one when None.

        Returns
        -------
        ClusterInfo
            The cluster's status, with a note that its workers restarted.
        """
        handle = self._target(ns.name)
        handle.restart()
        info = handle.info()
        info.note = f"Restarted the workers of {handle.name!r}."
        return info
