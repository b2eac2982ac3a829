"""IPython magics: they parse a line and call the API, nothing more."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from nbcluster import commands
from nbcluster.errors import NbclusterError


@magics_class
class NbclusterMagics(Magics):
    @line_magic
    def cluster(self, line: str) -> Any:
        """Start, scale, adapt, inspect and stop clusters: `%cluster --help`."""
        try:
            result = commands.Runner(in_kernel=True).run(commands.parse(line))
        except commands.HelpShown as shown:
            print(shown.text)
            return None
        except NbclusterError as e:
            raise UsageError(str(e)) from None
        if isinstance(result, str):
            print(result)
            return None
        return result
