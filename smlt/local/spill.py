"""Memory patch: a finished execution's history events leave moto's memory for a file.

moto keeps every execution's history events (the input and output of every state) for as long
as the server lives; a long run chains executions, so they add up round after round in the
engine's process (on AWS they live in the service). When an execution ends, its events are
pickled into one unlinked temporary file per process (appended, so one file handle however many
executions) and the in-memory list is emptied; GetExecutionHistory of that execution reads them
back from the file, the same events moto would have answered (moto deep-copies them per call
too). A running execution's history stays in memory (the history limit counts it; the console
reads it live). The file goes when the server stops (moto is reset then) or the process ends.
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
