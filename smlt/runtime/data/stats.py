"""Statistics of a split gathered block by block in bounded memory, as `smlt data prepare` streams
a source: per-feature moments (mean and std, merged in float64), the median of a column (in two
passes over the same numbers) and the counts of a text column's values."""

from __future__ import annotations

from typing import Any

import numpy as np

# Rows per step when accumulating moments: bounded float64 temporaries.
MOMENT_ROWS = 16_384
# A text column's values are counted for at most this many distinct values.
MAX_LEVELS = 65_536


class Moments:
    """Count, mean and sum of squared deviations of each feature of (rows, F) arrays, merged block
    by block (Chan, Golub and LeVeque's pairwise update) in float64, NaN skipped; with the
    smallest and largest value of each."""

    def __init__(self, width: int):
        self.n = np.zeros(width)
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)
        self.low = np.full(width, np.inf)
        self.high = np.full(width, -np.inf)

    def add(self, x: np.ndarray) -> None:
        for start in range(0, len(x), MOMENT_ROWS):
            chunk = x[start : start + MOMENT_ROWS]
            part = chunk.astype(np.float64)
            present = ~np.isnan(part)
            n = present.sum(axis=0).astype(np.float64)
            part[~present] = 0.0
            mean = part.sum(axis=0) / np.maximum(n, 1.0)
            dev = np.where(present, part - mean, 0.0)
            self._merge(n, mean, (dev * dev).sum(axis=0))
            self.low = np.fmin(self.low, np.fmin.reduce(chunk, axis=0))
            self.high = np.fmax(self.high, np.fmax.reduce(chunk, axis=0))

    def add_constant(self, j: int, value: float, count: int) -> None:
        """`count` more rows whose feature j is `value` (an imputed fill)."""
        if count <= 0:
            return
        n, mean, m2 = (np.zeros_like(self.n) for _ in range(3))
        n[j], mean[j] = count, value
        self._merge(n, mean, m2)
        self.low[j] = min(self.low[j], value)
        self.high[j] = max(self.high[j], value)

    def merge(self, other: Moments) -> None:
        """Add another split's moments (gathered from other rows): as if its rows had been added here."""
        self._merge(other.n, other.mean, other.m2)
        self.low = np.fmin(self.low, other.low)
        self.high = np.fmax(self.high, other.high)

    def _merge(self, n: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> None:
        total = self.n + n
        safe = np.maximum(total, 1.0)
        delta = mean - self.mean
        self.mean = self.mean + delta * n / safe
        self.m2 = self.m2 + m2 + delta * delta * self.n * n / safe
        self.n = total

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation (numpy's `std`, ddof 0)."""
        return np.sqrt(self.m2 / np.maximum(self.n, 1.0))


_SIGN = np.uint64(1 << 63)
_BINS = 1 << 16


def _keys(values: np.ndarray) -> np.ndarray:
    """float64 -> uint64 in the same order (negative numbers' bits flipped, the others' sign set)."""
    bits = np.ascontiguousarray(values, np.float64).view(np.uint64)
    return np.where(bits >> np.uint64(63), ~bits, bits | _SIGN)


def _number(key: int) -> float:
    k = np.array([key], np.uint64)
    bits = np.where(k >> np.uint64(63), k & ~_SIGN, ~k)
    return float(bits.view(np.float64)[0])


class Median:
    """np.median (for an even count the mean of the two middle values) of numbers seen twice, in
    bounded memory. The first pass keeps the numbers while there are at most `keep` of them, and
    counts all of them in 2^16 bins by their leading 16 bits (sign, exponent, 4 mantissa bits:
    the bins are in the numbers' order). The second pass (`again`) keeps only the numbers in the
    bins of the middle two: exact when a bin holds at most `keep`, else counted in 2^16 finer
    bins, the median then within 2^-21 of its magnitude (a few float32 steps)."""

    def __init__(self, keep: int):
        self.keep = keep
        self.n = 0
        self.hist = np.zeros(_BINS, np.int64)
        self.kept: list[np.ndarray] | None = []
        self._targets: list[tuple[int, int]] = []  # (bin, rank within the bin) of the middle two
        self._second: dict[int, Any] = {}  # bin -> its numbers (a list), or its finer counts

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.hist += np.bincount((_keys(values) >> np.uint64(48)).astype(np.intp), minlength=_BINS)
        self.n += len(values)
        if self.kept is not None:
            self.kept = self.kept + [values.astype(np.float64)] if self.n <= self.keep else None

    def merge(self, other: Median) -> None:
        """Add the first pass of other numbers (another file's): the same bins and kept numbers
        as if they had been added here, in this order."""
        self.hist += other.hist
        self.n += other.n
        both = self.kept is not None and other.kept is not None and self.n <= self.keep
        self.kept = self.kept + other.kept if both else None  # type: ignore[operator]

    @property
    def needs_second_pass(self) -> bool:
        return self.kept is None

    def start_second_pass(self) -> None:
        cum = np.cumsum(self.hist)
        for rank in ((self.n - 1) // 2, self.n // 2):
            b = int(np.searchsorted(cum, rank, side="right"))
            self._targets.append((b, rank - (int(cum[b - 1]) if b else 0)))
        for b, _ in self._targets:
            self._second[b] = [] if self.hist[b] <= self.keep else np.zeros(_BINS, np.int64)

    def again(self, values: np.ndarray) -> None:
        """The second pass: the same numbers as the first, in any blocks."""
        keys = _keys(values)
        top = keys >> np.uint64(48)
        for b, held in self._second.items():
            hit = top == b
            if isinstance(held, list):
                held.append(values[hit].astype(np.float64))
            else:
                held += np.bincount(((keys[hit] >> np.uint64(32)) & np.uint64(0xFFFF)).astype(np.intp), minlength=_BINS)

    def merge_again(self, other: Median) -> None:
        """Add the second pass over other numbers (another file's), both started from the same
        merged first pass (`start_second_pass` on copies of it)."""
        for b, held in other._second.items():
            mine = self._second[b]
            if isinstance(mine, list):
                mine.extend(held)
            else:
                mine += held

    def value(self) -> float:
        if self.n == 0:
            return 0.0
        if self.kept is not None:
            return float(np.median(np.concatenate(self.kept)))
        middle = []
        for b, rank in self._targets:
            held = self._second[b]
            if isinstance(held, list):
                middle.append(float(np.sort(np.concatenate(held))[rank]))
            else:
                fine = int(np.searchsorted(np.cumsum(held), rank, side="right"))
                middle.append(_number((b << 48) | (fine << 32) | (1 << 31)))  # the finer bin's middle
        return (middle[0] + middle[1]) / 2


class Levels:
    """How often each distinct value of a text column occurs, counting at most MAX_LEVELS distinct
    values (later new ones are not counted: only the most frequent value of such a column, its
    imputed fill, then rests on the values seen first)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, text: Any) -> None:
        """Count a pyarrow string array's values (nulls are not values)."""
        import pyarrow.compute as pc

        found = pc.value_counts(text.drop_null())
        counts = self.counts
        for value, count in zip(found.field(0).to_pylist(), found.field(1).to_pylist()):
            if value in counts:
                counts[value] += count
            elif len(counts) < MAX_LEVELS:
                counts[value] = count

    def merge(self, other: Levels) -> None:
        """Add another file's counts, as if its values had come after these."""
        counts = self.counts
        for value, count in other.counts.items():
            if value in counts:
                counts[value] += count
            elif len(counts) < MAX_LEVELS:
                counts[value] = count

    def sorted(self) -> tuple[list[str], list[int]]:
        levels = sorted(self.counts)
        return levels, [self.counts[v] for v in levels]
