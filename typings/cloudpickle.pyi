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
