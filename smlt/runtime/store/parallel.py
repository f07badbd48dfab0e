"""Bounded, ordered fan-out of store requests (I/O bound: threads are enough)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Concurrent GETs per reducer.
FETCH_THREADS = 16


def ordered_map(fn: Callable[[T], R], items: Sequence[T], threads: int = FETCH_THREADS) -> Iterator[R]:
    """fn over items with at most `threads` in flight, yielding results in order (bounded memory:
    `Executor.map` would submit every item at once and hold all the results)."""
    if threads <= 1 or len(items) <= 1:
        for x in items:
            yield fn(x)
        return
    with ThreadPoolExecutor(max_workers=threads) as ex:
        pending: deque[Future[R]] = deque(ex.submit(fn, x) for x in items[:threads])
        rest = iter(items[threads:])
        while pending:
            yield pending.popleft().result()
            for nxt in rest:
                pending.append(ex.submit(fn, nxt))
                break
