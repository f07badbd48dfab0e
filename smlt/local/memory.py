"""Memory patches: what moto would keep in the engine's process for good, on disk instead.

*Histories* (``spilled-history``): a finished execution's history events leave moto's memory for a file.

moto keeps every execution's history events (the input and output of every state) for as long
as the server lives; a long run chains executions, so they add up round after round in the
engine's process (on AWS they live in the service). When an execution ends, its events are
pickled into one unlinked temporary file per process (appended, so one file handle however many
executions) and the in-memory list is emptied; GetExecutionHistory of that execution reads them
back from the file, the same events moto would have answered (moto deep-copies them per call
too). A running execution's history stays in memory (the history limit counts it; the console
reads it live). The file goes when the server stops (moto is reset then) or the process ends.

*S3 bodies* (``spilled-s3-bodies``): moto keeps an object's body in memory up to
``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE`` (5 MB by default), past it in a temporary file of its own (one
open file per object). Every body goes to one append-only spill file instead (one open file in
all); the object's metadata stays in moto. An overwritten or deleted body's bytes stay in the
file until the server stops. (A copy moto makes by pickling a key, rare, keeps its body in
memory. The files are per process and never shared with a fork: the handler processes start from
a fork server, which never holds one.)
"""

from __future__ import annotations

import functools
import os
import pickle
import tempfile
import threading
from typing import IO, Any

_ATTR = "_smlt_spilled_history"  # (offset, length) in the spill file, on a finished Execution


class SpillFile:
    """Append-only bytes in one unlinked temporary file: ``put`` returns where, ``get`` reads it."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._end = 0
        self._lock = threading.Lock()

    def put(self, data: bytes) -> tuple[int, int]:
        with self._lock:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="smlt-spill-")
                self._end = 0
            os.pwrite(self._file.fileno(), data, self._end)
            where = (self._end, len(data))
            self._end += len(data)
            return where

    def get(self, where: tuple[int, int]) -> bytes:
        offset, length = where
        with self._lock:
            if self._file is None:
                raise LookupError("the spill file was reset: the data it held is gone")
            return os.pread(self._file.fileno(), length, offset)

    @property
    def size(self) -> int:
        """Bytes written since the last reset."""
        return self._end

    def reset(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file, self._end = None, 0


HISTORIES = SpillFile()
BODIES = SpillFile()


def reset() -> None:
    """Forget everything spilled (moto was reset: nothing refers to it any more)."""
    HISTORIES.reset()
    BODIES.reset()


def spill_history(execution: Any) -> None:
    """Move a finished execution's events from moto's memory to :data:`HISTORIES`."""
    worker = getattr(execution, "exec_worker", None)
    manager = getattr(getattr(worker, "env", None), "event_manager", None)
    if manager is None or getattr(execution, _ATTR, None) is not None:
        return
    with manager._mutex:  # no event is added after the end; the mutex orders us after the last one
        events = manager._history_event_list
        setattr(execution, _ATTR, HISTORIES.put(pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL)))
        events.clear()  # in place: moto's list is Final and held by the manager


def patch_spilled_history() -> None:
    from moto.stepfunctions.parser.api import GetExecutionHistoryOutput
    from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication, Execution

    orig_terminated = BaseExecutionWorkerCommunication.terminated
    orig_history = Execution.to_history_output

    @functools.wraps(orig_terminated)
    def terminated(self: Any) -> None:
        orig_terminated(self)  # status, output, error first: what describe_execution answers
        spill_history(self.execution)

    @functools.wraps(orig_history)
    def to_history_output(self: Any) -> Any:
        where = getattr(self, _ATTR, None)
        if where is None:
            return orig_history(self)
        return GetExecutionHistoryOutput(events=pickle.loads(HISTORIES.get(where)))  # noqa: S301 - our own file

    BaseExecutionWorkerCommunication.terminated = terminated  # type: ignore[method-assign]
    Execution.to_history_output = to_history_output  # type: ignore[method-assign]


class SpilledBody:
    """A FakeKey's body in :data:`BODIES`, as the file-like object moto reads and writes it
    through (``seek``, ``tell``, ``read``, ``write``, ``truncate``, ``close``). moto writes a body
    whole, at position 0 after ``truncate()``; any other write rewrites the body."""

    __slots__ = ("_closed", "_pos", "_where")

    def __init__(self) -> None:
        self._where = BODIES.put(b"")
        self._pos = 0
        self._closed = False

    def _open(self) -> tuple[int, int]:
        if self._closed:
            raise ValueError("I/O operation on closed file.")  # what moto's SpooledTemporaryFile raises
        return self._where

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        size = self._open()[1]
        self._pos = max(0, pos if whence == os.SEEK_SET else (self._pos if whence == os.SEEK_CUR else size) + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        offset, size = self._open()
        end = size if n is None or n < 0 else min(size, self._pos + n)
        if end <= self._pos:
            return b""
        data = BODIES.get((offset + self._pos, end - self._pos))
        self._pos = end
        return data

    def write(self, data: Any) -> int:
        offset, size = self._open()
        data = bytes(data)
        if self._pos == 0 and size == 0:
            body = data
        else:  # not moto's way of writing: rewrite the whole body
            old = BODIES.get((offset, size))
            body = old[: self._pos].ljust(self._pos, b"\0") + data + old[self._pos + len(data) :]
        self._where = BODIES.put(body)
        self._pos += len(data)
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        offset, current = self._open()
        size = self._pos if size is None else size
        self._where = (offset, min(current, size))
        return size

    def close(self) -> None:
        self._closed = True


def patch_spilled_s3_bodies() -> None:
    from moto.s3.models import FakeKey

    orig_init = FakeKey.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)  # the body into moto's buffer (and its size), then moved
        buffer, body = self._value_buffer, SpilledBody()
        buffer.seek(0)
        body.write(buffer.read())
        buffer.close()
        self._value_buffer = body

    FakeKey.__init__ = __init__  # type: ignore[method-assign]
