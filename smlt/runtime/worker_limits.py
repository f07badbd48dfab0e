"""What a Lambda worker lacks, imposed on the user's code where it runs elsewhere.

A Lambda's file system is read-only but for /tmp (its code folder, /var/task, is the current folder;
$HOME, where torch.hub, torchvision's `weights=` and Hugging Face cache downloads, is not writable),
and it has no /dev/shm, so multiprocessing's semaphores (Pool, Queue, Lock, torch.multiprocessing,
DataLoader(num_workers>0)) fail with ENOSYS. The pre-check and the local engine's handler processes
impose the same on the user's code (and what it calls: torch.hub, a DataLoader), so it fails there
as it would on a worker, with the same OSError; what smlt itself does is left alone (the limits
apply while a frame of the user's files is on the stack).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

LIMITS_ENV = "SMLT_LAMBDA_LIMITS"  # "1": this process imposes them (the local engine's handlers)
_limits: tuple[str, ...] | None = None  # the user's code folders while the limits apply
_may_write: tuple[str, ...] = ()  # ... and the folders a worker may write (`_writable`), then
_start_cwd = ""  # the current folder then: a worker's is its code folder, read-only
_limits_hooked = False
_OPEN_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# audit event -> which argument is the path it writes
_WRITE_EVENTS = {"open": 0, "os.mkdir": 0, "os.rename": 1, "os.remove": 0, "os.rmdir": 0, "os.truncate": 0}


def code_root() -> Path:
    """Where a worker unpacks the user's code (`--code`): under the temp folder unless SMLT_CODE_DIR says."""
    return Path(os.environ.get("SMLT_CODE_DIR", Path(tempfile.gettempdir()) / "smlt-code"))


def _writable() -> tuple[str, ...]:
    """The folders a worker may write: /tmp (where its code is unpacked) and the system's temp folder."""
    return tuple(os.path.realpath(p) for p in ("/tmp", tempfile.gettempdir(), str(code_root()), "/dev"))


def within(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _users_frame(roots: Sequence[str]) -> bool:
    """Whether a frame of the user's files is on the calling stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if within(frame.f_code.co_filename, roots):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _audit_limits(event: str, args: tuple[Any, ...]) -> None:
    roots = _limits
    if roots is None or event not in _WRITE_EVENTS:
        return
    path = args[_WRITE_EVENTS[event]]
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        return  # a file descriptor
    if event == "open":
        mode, flags = (*args[1:], None, None)[:2]
        if not (any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _OPEN_WRITES)):
            return
    name = os.fsdecode(path)
    full = os.path.realpath(name)
    relative = not os.path.isabs(name) and os.getcwd() == _start_cwd  # the worker's /var/task, not this folder
    if (not relative and within(full, (*_may_write, *roots))) or not _users_frame(roots):
        return
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), name)


class _LambdaSemLock:
    """multiprocessing's semaphore, refused to the user's code as a worker refuses it (no /dev/shm)."""

    _original: Any = None
    SEM_VALUE_MAX: int = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        roots = _limits
        if roots is not None and _users_frame(roots):
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
        return cls._original(*args, **kwargs)

    @staticmethod
    def _rebuild(*args: Any) -> Any:
        return _LambdaSemLock._original._rebuild(*args)


def _hook() -> None:
    """The audit hook and the semaphore's stand-in, once per process (neither can be removed:
    both do nothing while no limits apply)."""
    global _limits_hooked
    if _limits_hooked:
        return
    sys.addaudithook(_audit_limits)
    try:
        import _multiprocessing
    except ImportError:  # a Python without it: multiprocessing's locks fail anyway
        pass
    else:
        if getattr(_multiprocessing, "SemLock", None) is not None:
            _LambdaSemLock._original = _multiprocessing.SemLock
            _LambdaSemLock.SEM_VALUE_MAX = _multiprocessing.SemLock.SEM_VALUE_MAX
            _multiprocessing.SemLock = _LambdaSemLock
    _limits_hooked = True


def impose(roots: Sequence[str]) -> None:
    global _limits, _may_write, _start_cwd
    _hook()
    _may_write = _writable()  # here, not in the hook: the temp folder's first lookup opens files
    _start_cwd = os.getcwd()
    _limits = tuple(dict.fromkeys([*map(str, roots), *(os.path.realpath(r) for r in roots)]))


@contextlib.contextmanager
def lambda_limits(roots: Sequence[str | Path]) -> Iterator[None]:
    """While it lasts, the user's code (files under `roots`) meets a worker's limits: a write
    outside /tmp and the temp folder raises OSError EROFS ("Read-only file system"), and a
    multiprocessing semaphore OSError ENOSYS ("Function not implemented")."""
    global _limits
    before = _limits
    impose([str(r) for r in roots])
    try:
        yield
    finally:
        _limits = before
