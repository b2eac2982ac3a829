"""IPython magics: they parse a line and call the API, nothing more."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

from nbcluster import _current, commands
from nbcluster.errors import ClusterCannotRun, ClusterLost, HelpShown, NbclusterError
from nbcluster.journal import runs
from nbcluster.persist.handles import forget_shown
from nbcluster.run.args import help_text, parse_distribute_line, parse_wait_line

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
        try:
            result = commands.Runner(in_kernel=True).run(commands.parse(line))
        except HelpShown as shown:
            print(shown.text)
            return None
        except NbclusterError as e:
            raise UsageError(str(e)) from None
        if isinstance(result, str):
            print(result)
            return None
        return result

    @line_cell_magic
    def distribute(self, line: str, cell: str | None = None) -> Any:
        from nbcluster import widgets
        from nbcluster.run.api import distribute, wait

        try:
            if cell is None:
                said = runs.line_magic(line.split(), _current.client_of)  # `%distribute runs [ID]`, `%distribute forget ID`
                if said is not None:
                    print(said)
                    return None
                return wait(parse_wait_line(line), namespace=self.shell.user_ns)
            kwargs = parse_distribute_line(line)
            results = distribute(
                cell, namespace=self.shell.user_ns, progress=widgets.progress_hook(), **kwargs
            )
        except (ClusterLost, ClusterCannotRun):
            raise  # one line too, and sys.last_value.results keeps what finished
        except NbclusterError as e:
            raise UsageError(str(e)) from None
        # With --into the results are in that variable: no Out, as for an assignment.
        return None if kwargs.get("into") else results

    # `%cluster?` and `%%distribute?` show the parsers' own help: made from the declarations.
    cluster.__doc__ = commands.build_parser("%cluster").format_help()
    distribute.__doc__ = (
        f"{help_text()}\n`%distribute wait NAME` waits for the results of a --no-wait cell.\n"
        "`%distribute runs` lists the journaled runs (for --resume), `%distribute runs ID` shows one (its failed\n"
        "items and their errors); `%distribute forget ID|--all` deletes them.\n"
    )


def forget_shown_after_cells(ipython: Any) -> None:
    """After every cell, the output history holds persisted handles weakly (`handles.forget_shown`).

    Registering it again (a second ``%load_ext``) replaces the earlier callback, so it runs
    once per cell.

    Parameters
    ----------
    ipython : IPython.core.interactiveshell.InteractiveShell
        The kernel's shell.
    """

    def after(_: Any) -> None:
        forget_shown(ipython)

    callbacks = ipython.events.callbacks["post_run_cell"]
    callbacks[:] = [c for c in callbacks if getattr(c, "__qualname__", "") != after.__qualname__]
    ipython.events.register("post_run_cell", after)
