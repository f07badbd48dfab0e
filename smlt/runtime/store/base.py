"""The interface every store implements. Keys are strings, values are bytes."""

from __future__ import annotations

from typing import Protocol


class NotFound(KeyError):
    """No object at that key."""


class ObjectStore(Protocol):
    def get(self, key: str) -> bytes:
        """The object's bytes; raises NotFound."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object; raises NotFound."""

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Store data. With if_absent, only the first writer wins; returns False if the key existed."""

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...
