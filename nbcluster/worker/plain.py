"""Plain values: a batch's values pickled as one list, when all are builtin data.

Tiny items are where a run's per-item cost shows, and their values are nearly always
builtin data: numbers, strings, tuples and dicts of them. Such a list pickles and unpickles
at C speed and always loads again (no class of the user's to import), so:

- a worker sends a batch's values as that one blob (`items.dump_result`);
- the kernel unpickles it in one call when the batch arrives (`run/outcome.py`);
- the run's journal pickles the values the same way (`journal/store.py`).

Anything else (a numpy array, an instance of a notebook class) stops the pickler at once,
and the values travel as before, each its own Python object.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from typing import Any


class _Mixed(Exception):
    """Raised inside the pickler at the first value that is not builtin data."""


class _BuiltinsOnly(pickle.Pickler):
    """A pickler that gives up at the first object that is not builtin data.

    CPython's pickler calls `reducer_override` for every object except None, bools and
    exact ints, floats, str, bytes, lists, tuples, dicts, sets and frozensets; so a batch of
    such values pickles at C speed with no call back here, and any other object (a class of
    the user's, a numpy array) stops it at once.
    """

    def reducer_override(self, obj: Any) -> Any:
        raise _Mixed


def plain(values: Sequence[Any], limit: int | None = None) -> bytes | None:
    """`values` pickled as one list when all are builtin data, else None.

    Parameters
    ----------
    values : sequence
        The values of a batch's items.
    limit : int, optional
        The most bytes the blob may have; a larger one gives None.

    Returns
    -------
    bytes or None
        The list pickled (protocol 5): `pickle.loads` gives it back, with nothing to import.

    Examples
    --------
    >>> import pickle
    >>> pickle.loads(plain([1, "a", (2.5, None)]))
    [1, 'a', (2.5, None)]
    >>> plain([1, object()]) is None, plain(list(range(1000)), limit=100) is None
    (True, True)
    """
    out = io.BytesIO()
    try:
        _BuiltinsOnly(out, protocol=5).dump(list(values) if not isinstance(values, list) else values)
    except (_Mixed, RecursionError):
        return None
    blob = out.getvalue()
    return blob if limit is None or len(blob) <= limit else None
