"""One OS lock per folder, for the local run's saved state and the local console's state.

An exclusive `flock` on FOLDER/lock, held while the `with` block runs: a second process that
asks for it gets the caller's named error at once, and the lock dies with its process, so a
crash leaves nothing to clean up. The lock file is never deleted (one inode to lock).
`holder` names the process holding it (`smlt predict` on a local run still running: wait)."""

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


def holder(folder: Path) -> int | None:
    """The pid of the live process holding FOLDER/lock, 0 when one does but its pid is unknown,
    None when none does (or the folder has no lock file). Read from Linux's /proc/locks, which
    takes no lock; elsewhere a shared lock is tried and let go at once."""
    path = folder / "lock"
    try:
        st = path.stat()
    except OSError:
        return None
    try:
        with open("/proc/locks") as table:
            lines = table.read().splitlines()
    except OSError:
        return _probe(path)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2164026 0 EOF"; "1: -> FLOCK ..." waits
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        dev = parts[5].split(":")
        try:
            if len(dev) == 3 and (int(dev[0], 16), int(dev[1], 16), int(dev[2])) == want:
                return int(parts[4])
        except ValueError:
            continue
    return None


def _probe(path: Path) -> int | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    finally:
        os.close(fd)  # releases a lock it got
    return None
