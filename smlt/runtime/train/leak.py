"""A user's code that keeps memory from one call to the next (a module-level list that tensors
are appended to, a cache that never empties): in a warm Lambda container, which serves the
run's later invocations, the process grows call after call until it runs out of memory, and the
planner, told only "OutOfMemory", would take it for a tier too small and move the run to a
larger, dearer one. A worker notes its process's resident memory after each call with the user's
model; memory that grew by more than MIN_GROWTH in each of the last GROWING_CALLS calls, and by
more than LEAK_SHARE of the tier since the run's first call in this process, is named as the
user's leak (UserCodeError) before it runs out."""

from __future__ import annotations

import os

from smlt.runtime.errors import FIX_AND_START_AGAIN, UserCodeError

GROWING_CALLS = 3  # calls in a row that each grew the process
MIN_GROWTH_MB = 8.0  # ... by at least this much (and 1 % of the tier): not an allocator's noise
LEAK_SHARE = 0.25  # ... and together by this share of the tier since the run's first call here

_history: list[tuple[str, float]] = []  # (run id, resident MB after a call), this process's


def resident_mb() -> float | None:
    """The process's resident memory (Linux: Lambda, the local engine's handlers); None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def check_growth(run_id: str, name: str, memory_mb: int, now: float | None = None) -> None:
    """Note this call's resident memory for `run_id`; UserCodeError when the calls of this run in
    this process grew it as a leak does (see the module's rule)."""
    now = resident_mb() if now is None else now
    if now is None:
        return
    if _history and _history[-1][0] != run_id:
        _history.clear()  # another run: its code, its own baseline
    _history.append((run_id, now))
    if len(_history) <= GROWING_CALLS:
        return
    recent = [mb for _, mb in _history[-GROWING_CALLS - 1 :]]
    steps = [b - a for a, b in zip(recent, recent[1:])]
    least = max(MIN_GROWTH_MB, 0.01 * memory_mb)
    grown = now - _history[0][1]
    if min(steps) < least or grown < LEAK_SHARE * memory_mb:
        return
    per_call = sum(steps) / len(steps)
    left = max(0, int((memory_mb - now) // per_call))
    raise UserCodeError(
        f"model.name {name!r}: this worker's process grew by {grown:,.0f} MB over {len(_history) - 1} calls of the "
        f"run (by about {per_call:,.0f} MB each of the last {GROWING_CALLS}; {now:,.0f} of the tier's {memory_mb:,} MB "
        f"now): at this rate it runs out of memory in about {left} more calls, which would look like a tier too small. "
        "Your code keeps memory from one call to the next: a module-level list or dict that tensors are appended to "
        "(keep .item() values or clear it), a cache that never empties, or outputs stored without .detach() (each "
        f"keeps its autograd graph)\n{FIX_AND_START_AGAIN}"
    )
