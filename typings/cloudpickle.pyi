# The part of cloudpickle that nbcluster calls: cloudpickle ships no types, and its results
# (the bytes that cross to workers) are worth checking. Found through `mypy_path`.
from collections.abc import Iterable
from typing import Any

def dumps(obj: Any, protocol: int | None = None, buffer_callback: Any = None) -> bytes: ...
def loads(
    data: bytes | bytearray | memoryview,
    /,
    *,
    fix_imports: bool = True,
    encoding: str = "ASCII",
    errors: str = "strict",
    buffers: Iterable[Any] | None = None,
) -> Any: ...

class Pickler:
    # cloudpickle's pickler: `journal/resume.py` subclasses it to hash values.
    def __init__(self, file: Any, protocol: int | None = None, buffer_callback: Any = None) -> None: ...
    def dump(self, obj: Any) -> None: ...
    def reducer_override(self, obj: Any) -> Any: ...
