"""One OS lock per folder, for the local run's saved state and the local console's state.

An exclusive `flock` on FOLDER/lock, held while the `with` block runs: a second process that
asks for it gets the caller's named error at once, and the lock dies with its process, so a
crash leaves nothing to clean up. The lock file is never deleted (one inode to lock)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def folder_lock(folder: Path, busy: Callable[[Path], Exception]) -> Iterator[Path]:
    """Hold FOLDER/lock (the folder is made); `busy(lock_path)` is raised when another process
    holds it. Yields the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(path) from None
        yield folder
    finally:
        os.close(fd)  # releases the lock


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file as a whole or not at all (a new file renamed over the old one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    tmp.replace(path)
