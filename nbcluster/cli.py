"""The `nbcluster` console command: the `%cluster` language for terminals and scripts.

Clusters started here are kept (the command exits at once) until `nbcluster stop`.
Mistakes print one line and exit with status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nbcluster import commands
from nbcluster.errors import HelpShown, NbclusterError


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``nbcluster`` command: ``nbcluster start``, ``nbcluster status``, ...

    Parameters
    ----------
    argv : Sequence of str, optional
        The command's words; `sys.argv` after the program name when None.

    Returns
    -------
    int
        The exit status: 0 when it worked (or ``--help`` was shown), 2 for a mistake (one
        line on stderr), 130 on Ctrl-C.

    Examples
    --------
    >>> main(["list"])
    No clusters running. Start one with `%cluster start` (or `nbcluster start`).
    0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = commands.parse(args, prog="nbcluster")
        for notice in ns.notices:
            print(f"nbcluster: {notice}", file=sys.stderr)
        result = commands.Runner(in_kernel=False).run(ns)
    except HelpShown as shown:
        print(shown.text)
        return 0
    except NbclusterError as e:
        print(f"nbcluster: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nbcluster: interrupted", file=sys.stderr)
        return 130
    print(result if isinstance(result, str) else repr(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
