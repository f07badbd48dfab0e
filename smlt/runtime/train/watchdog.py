"""The worker's watchdog on the user's code: a call into the user's model (a training step's
transform, forward and backward; a validation batch's forward) that runs far past what the job's
own steps measured is stopped in the main thread (SIGALRM) and named where it was, so the run
ends with the user's error (UserCodeError) instead of a worker hung until its Lambda's timeout.

The limit of a call of `rows` rows is STALL_MARGIN times the slowest seconds per row measured of a
training step (the previous round's workers, scaled to this worker's memory tier, and this
invocation's own calls), and at least MIN_STALL_S: a step that is slow but progressing (a slow
host, a noisy neighbour, a cold first call) is far inside it. With nothing measured yet (round
0's first step), the only limit is the invocation's own end, less RECORD_RESERVE_S to record the
error. A call whose margin reaches past the invocation's end is not stopped (it ends as it did:
Lambda's timeout, a straggler the round goes on without).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STALL_MARGIN = 20.0  # times the slowest measured seconds per row of a training step
MIN_STALL_S = 10.0  # a call is never stopped sooner (a GC pause, a page-in, a busy machine)
RECORD_RESERVE_S = 5.0  # left before the invocation's end to record the error (two DynamoDB writes)


class Stalled(BaseException):
    """Raised into the user's code when its time is up (a BaseException: an `except Exception` in
    their loop does not swallow it)."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Stalled raised in the main thread after `seconds` (SIGALRM; nothing elsewhere, or without a
    limit). A loop in Python is stopped between two of its steps, a sleep at once, a single long
    torch call when it returns. A timer already set (a caller's own, pytest-timeout's) is left to
    fire first when it is due first, and set again, less the time spent, afterwards."""
    if seconds is None or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    due, interval = signal.getitimer(signal.ITIMER_REAL)
    if 0 < due <= seconds:
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise Stalled

    before = signal.signal(signal.SIGALRM, fire)
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if due > 0:
            signal.setitimer(signal.ITIMER_REAL, max(due - (time.monotonic() - t0), 1e-3), interval)


class Watchdog:
    """The limits of one invocation's calls into the user's model.

    `deadline`: the time.monotonic() at which the invocation ends (Lambda's context), None when
    unknown; `per_row_s`: the slowest seconds per row of a training step measured before this
    invocation (None: none)."""

    def __init__(self, deadline: float | None, per_row_s: float | None, enabled: bool = True) -> None:
        self.deadline, self.per_row_s, self.enabled = deadline, per_row_s, enabled

    def limit_s(self, rows: int) -> float | None:
        """How long a call on `rows` rows may run from now; None: it is not stopped."""
        if not self.enabled:
            return None
        left = self.deadline - RECORD_RESERVE_S - time.monotonic() if self.deadline is not None else None
        if self.per_row_s is None:
            return max(left, 1e-3) if left is not None else None
        margin = max(MIN_STALL_S, STALL_MARGIN * self.per_row_s * max(rows, 1))
        if left is not None and margin > left:
            return None  # inside its margin until the end: never called a hang
        return margin

    @contextmanager
    def call(self, rows: int, train: bool) -> Iterator[float | None]:
        """Around one call into the user's model on `rows` rows; yields its limit (None: none).
        A training step that finishes is measured: the next calls' limits follow the slowest."""
        limit = self.limit_s(rows)
        t0 = time.monotonic()
        with time_limit(limit):
            yield limit
        if train and rows > 0:
            took = (time.monotonic() - t0) / rows
            self.per_row_s = took if self.per_row_s is None else max(self.per_row_s, took)
