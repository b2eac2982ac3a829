"""How Python spells a run's options: ``needs=``, ``on=``, and the old keywords for one release.

`distribute()` groups what belongs together. What each item needs of a worker is one
`Needs` (``needs=``); where the run goes is one ``on=`` (a cluster's name, its
`ClusterHandle`, or a Dask ``Client``); the two runs that are not "once per item" have
functions of their own (`nbcluster.everywhere`, `nbcluster.ranks`); and what only the magic
needs (the line its cell's body starts on) is an argument of `launch`, which the magic
calls, not of `distribute`. The magic's flags stay as they are (``--gpus``, ``--cluster``,
``--everywhere``...): each flag's declaration (`options.py`) says how Python spells it.

The keywords of the release before still work for one release, each with a
`FutureWarning` of one line that names the new spelling (`OLD`); giving an old keyword and
its new one together is refused, as the two could disagree.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

from nbcluster.cluster.handle import ClusterHandle
from nbcluster.errors import BadArgument
from nbcluster.run.target import Needs

#: The keywords of the release before -> how to spell them now (`{fn}` is the function's name).
OLD = {
    "gpus": "{fn}(needs=nbcluster.Needs(gpus=N))",
    "cpus": "{fn}(needs=nbcluster.Needs(cpus=N))",
    "cpu_only": "{fn}(needs=nbcluster.Needs(cpu_only=True))",
    "cluster": '{fn}(on="NAME")',
    "client": "{fn}(on=client)",
    "everywhere": "nbcluster.everywhere(body)",
    "ranks": "nbcluster.ranks(body, n=N)",
}
#: Old keywords with no new spelling: they go, and what replaces them is said instead.
GOING = {
    "first_line": "only the magic needs it (a cell's body starts on the cell's line 2); drop it",
}
_NEEDS = ("gpus", "cpus", "cpu_only")
#: What `ranks(**options)` passes on to `launch` as it is: its options, and those a job
#: refuses (`--ranks 2 ... cannot be combined with --over`), for that one-line message.
RANKS_PASS = (
    "into", "wait", "seed", "timeout", "progress", "over", "grid", "zip", "retries", "batch", "local",
    "persist", "resume", "objective", "stopper",
)  # fmt: skip


def notice(fn: str, old: str) -> str:
    """The one line that an old keyword of `fn` warns with.

    Parameters
    ----------
    fn : str
        The function it was given to: ``distribute`` or ``ranks``.
    old : str
        The old keyword, a key of `OLD` or `GOING`.

    Returns
    -------
    str
        ``FN(OLD=...)` is now `NEW`; the old spelling goes in the next release.``

    Examples
    --------
    >>> notice("distribute", "gpus")
    '`distribute(gpus=...)` is now `distribute(needs=nbcluster.Needs(gpus=N))`; the old spelling goes in the next release.'
    """
    if old in GOING:
        return f"`{fn}({old}=...)` goes in the next release: {GOING[old]}."
    return f"`{fn}({old}=...)` is now `{OLD[old].format(fn=fn)}`; the old spelling goes in the next release."


def needs_of(needs: Any) -> Needs:
    """What each item needs, from ``needs=``: a `Needs`, a dict of its fields, or None.

    Parameters
    ----------
    needs : Needs, dict or None
        ``Needs(gpus=1)``, ``{"gpus": 1}``, or None for nothing in particular.

    Returns
    -------
    Needs
        The needs; the values are checked with the run's other options.

    Raises
    ------
    nbcluster.errors.BadArgument
        For another type, or a key that `Needs` has not.

    Examples
    --------
    >>> needs_of({"cpus": 2})
    Needs(gpus=None, cpus=2, cpu_only=False)
    """
    if needs is None:
        return Needs()
    if isinstance(needs, Needs):
        return needs
    if isinstance(needs, Mapping):
        unknown = sorted(set(needs) - set(Needs._fields), key=str)
        if unknown:
            match = difflib.get_close_matches(str(unknown[0]), Needs._fields, n=1)
            hint = f"; did you mean {match[0]!r}?" if match else ""
            raise BadArgument(f"needs= takes {', '.join(Needs._fields)}; {unknown[0]!r} is not one of them{hint}")
        return Needs(**needs)
    raise BadArgument(f"needs= takes nbcluster.Needs(gpus=..., cpus=..., cpu_only=...) or a dict of them, got {type(needs).__name__}")


def target_of(on: Any) -> tuple[Any, Any]:
    """Where a run goes, from ``on=``: ``(cluster, client)`` as `launch` takes them.

    Parameters
    ----------
    on : str, ClusterHandle, distributed.Client or None
        A cluster's name (or its ``tls://`` address), a cluster's handle, a Dask client, or
        None for the current cluster.

    Returns
    -------
    tuple
        ``(cluster, client)``: a name or a handle, and a client; at most one of them set.

    Raises
    ------
    nbcluster.errors.BadArgument
        For anything else.
    """
    if on is None or isinstance(on, str):
        return on, None
    from distributed import Client

    if isinstance(on, ClusterHandle):
        return on, None
    if isinstance(on, Client):
        return None, on
    raise BadArgument(
        f"on= takes a cluster's name, a ClusterHandle (nbcluster.start(), nbcluster.current()) "
        f"or a distributed.Client, got {type(on).__name__}"
    )


def spell(
    fn: Callable[..., Any],
    given: dict[str, Any],
    *,
    needs: Any,
    on: Any,
    known: Collection[str] = (),
    stacklevel: int,
) -> dict[str, Any]:
    """`launch`'s keywords from a public function's: ``needs``, ``on``, and the old keywords.

    Each old keyword in `given` warns with its `notice` (a `FutureWarning`, attributed to
    the caller `stacklevel` frames up) and means what it meant.

    Parameters
    ----------
    fn : callable
        The public function (`distribute`, `everywhere`, `ranks`), for messages.
    given : dict
        Its other keywords: the old ones, and any of `known` (passed on as they are).
    needs, on : Any
        Its ``needs=`` and ``on=``.
    known : collection of str
        The keywords in `given` that `fn` takes (for ``ranks(fn, n, **options)``).
    stacklevel : int
        Where the warning points, as `warnings.warn` counts from this function.

    Returns
    -------
    dict
        ``gpus``, ``cpus``, ``cpu_only``, ``cluster``, ``client`` and whatever else was given.

    Raises
    ------
    nbcluster.errors.BadArgument
        For a keyword `fn` does not take (naming the closest one), or an old keyword given
        with its new one.
    """
    name_of = fn.__name__
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name in known:
            out[name] = value
            continue
        if name not in OLD and name not in GOING:
            raise BadArgument(f"{name_of}() has no option {name!r}{_close(name_of, name, (*_takes(fn), *known))}")
        warnings.warn(notice(name_of, name), FutureWarning, stacklevel=stacklevel + 1)
        out[name] = value
    old_needs = [name for name in _NEEDS if name in out]
    if old_needs and needs is not None:
        raise BadArgument(f"give needs= only: {old_needs[0]}= is its old spelling")
    old_on = [name for name in ("cluster", "client") if name in out]
    if old_on and on is not None:
        raise BadArgument(f"give on= only: {old_on[0]}= is its old spelling")
    if not old_needs:
        out.update(needs_of(needs)._asdict())
    if not old_on:
        out["cluster"], out["client"] = target_of(on)
    return out


def namespaces(namespace: dict[str, Any] | None, depth: int = 2) -> tuple[dict[str, Any], dict[str, Any]]:
    """Where a run looks names up, and where ``into`` goes.

    Parameters
    ----------
    namespace : dict or None
        The public function's ``namespace=``: both, when given.
    depth : int, default 2
        Else the variables of the frame this many up (the public function's caller: 2 from
        here), and its globals for ``into``.

    Returns
    -------
    tuple of dict
        ``(names, home)``.
    """
    if namespace is not None:
        return namespace, namespace
    caller = sys._getframe(depth)
    return {**caller.f_globals, **caller.f_locals}, caller.f_globals


@functools.cache
def _takes(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The keywords `fn` takes by name, for the closest to a misspelt one."""
    return tuple(inspect.signature(fn).parameters)


def _close(fn: str, name: str, takes: Collection[str]) -> str:
    """``; did you mean ...?`` for the keyword closest to `name`, in its new spelling."""
    match = difflib.get_close_matches(name, [*takes, *OLD], n=1)
    if not match:
        return ""
    return f"; did you mean `{OLD[match[0]].format(fn=fn)}`?" if match[0] in OLD else f"; did you mean {match[0]!r}?"
