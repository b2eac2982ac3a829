"""IPython magics: they parse a line and call the API, nothing more."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

from nbcluster import commands
from nbcluster.errors import ClusterCannotRun, ClusterLost, HelpShown, NbclusterError
from nbcluster.persist.handles import Handle, forget_shown
from nbcluster.run.options import help_text, parse_distribute_line, parse_wait_line

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class NbclusterMagics(Magics):
    """The ``%cluster`` line magic and the ``%%distribute`` cell (and line) magic.

    Each parses its line with the same declarations as the Python API and the CLI, calls
    the API, and turns nbcluster's one-line errors into IPython ``UsageError``s (shown
    without a traceback). `%cluster?` and `%%distribute?` show the parsers' own help.
    """
    shell: InteractiveShell  # never None here: IPython registers the magics with its shell

    @line_magic
    def cluster(self, line: str) -> Any:
        """Start, scale, adapt, inspect and stop clusters: `%cluster --help`."""
        return _cluster_line(line)

    @line_cell_magic
    def distribute(self, line: str, cell: str | None = None) -> Any:
        from nbcluster import widgets
        from nbcluster.run.api import launch, wait

        try:
            if cell is None:
                words = line.split()
                if words[:1] in (["runs"], ["forget"]):  # the journals' old home: now `%cluster runs`
                    return _cluster_line(_journals_line(words))
                return wait(parse_wait_line(line), namespace=self.shell.user_ns)
            kwargs = parse_distribute_line(line)
            # The flags as they are declared (`launch` checks them); Python spells some otherwise (`needs=`,
            # `on=`). The cell's body starts on its line 2: the %%distribute line is line 1.
            results = launch(cell, namespace=self.shell.user_ns, progress=widgets.progress_hook(), first_line=2,
                             **kwargs)
        except (ClusterLost, ClusterCannotRun):
            raise  # one line too, and sys.last_value.results keeps what finished
        except NbclusterError as e:
            raise UsageError(str(e)) from None
        # With --into the results are in that variable: no Out, as for an assignment.
        return None if kwargs.get("into") else results

    # `%cluster?` and `%%distribute?` show the parsers' own help: made from the declarations.
    cluster.__doc__ = commands.build_parser("%cluster").format_help()
    distribute.__doc__ = (
        f"{help_text()}\n`%distribute wait NAME` waits for the results of a --no-wait cell, printing\n"
        "their output and failures (`nbcluster.wait`); `NAME.wait()` waits without printing.\n"
        "The journaled runs (for --resume): `%cluster runs [ID] [--forget]`.\n"
    )


def _cluster_line(line: str) -> Any:
    """Run one `%cluster` line: its notices and text printed, a status returned for display."""
    try:
        ns = commands.parse(line)
        for notice in ns.notices:
            print(notice)
        result = commands.Runner(in_kernel=True).run(ns)
    except HelpShown as shown:
        print(shown.text)
        return None
    except NbclusterError as e:
        raise UsageError(str(e)) from None
    if isinstance(result, str):
        print(result)
        return None
    return result


def _journals_line(words: list[str]) -> str:
    """`%distribute runs [ID]` / `forget ID...|--all` as the `%cluster runs` line, after its notice."""
    if words[0] == "runs":
        new = " ".join(["runs", *words[1:]])
        print(commands.renamed("%distribute runs [ID]", "%cluster runs [ID]"))
    else:
        new = " ".join(["runs", *words[1:], "--forget"])
        print(commands.renamed("%distribute forget ID", "%cluster runs ID --forget"))
    return new


def forget_shown_after_cells(ipython: Any) -> None:
    """After every cell, once this kernel has made a persisted handle, the output history holds
    handles weakly (`handles.forget_shown`); before that, no output can hold one.

    Registering it again (a second ``%load_ext``) replaces the earlier callback, so it runs
    once per cell.

    Parameters
    ----------
    ipython : IPython.core.interactiveshell.InteractiveShell
        The kernel's shell.
    """

    def after(_: Any) -> None:
        if Handle.made:  # until a handle exists, no output can hold one: a plain cell skips this
            forget_shown(ipython)

    callbacks = ipython.events.callbacks["post_run_cell"]
    callbacks[:] = [c for c in callbacks if getattr(c, "__qualname__", "") != after.__qualname__]
    ipython.events.register("post_run_cell", after)
