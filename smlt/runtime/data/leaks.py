"""A feature column that gives the label away, found in `smlt data prepare`'s first pass and told
as a notice: a copy of the label, or a value known only after it (a cancellation date beside
"churned", a diagnosis code beside "sick"). The validation rows have such a column too, so the
run reports a fine accuracy and exits 0; new rows, where the value is not known yet, get a model
that leans on what they lack.

- classification: a column each of whose values goes with a single class in every train row, with
  at least MIN_ROWS_PER_VALUE rows per value on average (fewer: an id, or too few rows to tell);
- regression: a numeric column whose correlation with the target is CORRELATION or more in size
  over the train rows where both are present.

A notice, not a refusal: a column may truly come before the label and decide it (then the task is a
lookup). Columns with more than MAX_VALUES distinct values are not followed for classification.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from smlt.runtime.data import tabular
from smlt.runtime.data.table_reader import Block

MAX_VALUES = 1_000
MIN_ROWS_PER_VALUE = 5
MIN_ROWS = 30
CORRELATION = 0.999


class LabelLeaks:
    """Pass 1's evidence, per feature column, that the column determines the label."""

    def __init__(self, label: str, features: Sequence[str]):
        self.label = label
        # value -> the one class it goes with; None once a value goes with two (or too many values)
        self.classes: dict[str, dict[Any, Any] | None] = {f: {} for f in features}
        # (n, mean x, mean y, M2 x, M2 y, C xy) over train rows where the column and the label are numbers
        self.moments: dict[str, tuple[float, ...]] = {f: (0.0,) * 6 for f in features}
        self.rows = 0

    def add(self, block: Block, train: np.ndarray, numeric: set[str]) -> None:
        """A block's train rows (`train`: their positions in the block); `numeric`: the columns
        read as numbers (parsed already: a text column is not parsed again here)."""
        import pyarrow as pa

        if not len(train):
            return
        self.rows += len(train)
        labels = self._cells(block, self.label).take(pa.array(train))
        y = block.numbers(self.label)
        for name, seen in self.classes.items():
            if seen is not None:
                self.classes[name] = _one_class_each(seen, self._cells(block, name).take(pa.array(train)), labels)
            x = block.numbers(name) if name in numeric and y is not None else None
            if x is not None and y is not None:
                xs, ys = x[0][train], y[0][train]
                both = np.isfinite(xs) & np.isfinite(ys)
                self.moments[name] = _merge(self.moments[name], _moments(xs[both], ys[both]))

    @staticmethod
    def _cells(block: Block, name: str) -> Any:
        return block.text(name) if block.csv else block.cells[name]

    def merge(self, other: LabelLeaks) -> None:
        """Add another file's evidence (the same columns)."""
        self.rows += other.rows
        for name, seen in self.classes.items():
            theirs = other.classes[name]
            if seen is not None and theirs is not None:
                for value, label in theirs.items():
                    if seen.setdefault(value, label) != label:
                        seen = None
                        break
                self.classes[name] = seen if seen is not None and len(seen) <= MAX_VALUES else None
            else:
                self.classes[name] = None
            self.moments[name] = _merge(self.moments[name], other.moments[name])

    def notices(self, path: str, task: str) -> list[str]:
        """What to tell the user, one line per column that gives the label away."""
        if self.rows < MIN_ROWS:
            return []
        out: list[tuple[str, str]] = []  # (column, what it does)
        for name in self.classes:
            seen = self.classes[name]
            if task == "classification" and seen is not None and 2 <= len(seen) <= self.rows / MIN_ROWS_PER_VALUE:
                what = f"each of its {len(seen):,} values goes with one class of {self.label!r} in all {self.rows:,} train rows"
                out.append((name, what))
            r = _correlation(self.moments[name])
            if task == "regression" and r is not None and abs(r) >= CORRELATION:
                what = f"its correlation with {self.label!r} is {r:+.4f} over {int(self.moments[name][0]):,} train rows"
                out.append((name, what))
        return [
            f"{path}: column {name!r} gives the label away: {what}. If it is a copy of the label or known only "
            f"after it, a model leaning on it scores well here and fails on new rows: {tabular.drop_hint(name)}"
            for name, what in out
        ]


def _one_class_each(seen: dict[Any, Any], values: Any, labels: Any) -> dict[Any, Any] | None:
    """`seen` with the block's (value, class) pairs; None when a value goes with two classes."""
    import pyarrow as pa

    pairs = pa.table({"v": values, "l": labels}).group_by(["v", "l"]).aggregate([])
    if pairs.num_rows > MAX_VALUES or len(pairs.column("v").unique()) < pairs.num_rows:
        return None
    for value, label in zip(pairs.column("v").to_pylist(), pairs.column("l").to_pylist()):
        if seen.setdefault(value, label) != label:
            return None
    return seen if len(seen) <= MAX_VALUES else None


def _moments(x: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    if not len(x):
        return (0.0,) * 6
    mx, my = float(x.mean()), float(y.mean())
    dx, dy = x - mx, y - my
    return (float(len(x)), mx, my, float(dx @ dx), float(dy @ dy), float(dx @ dy))


def _merge(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    """Two sets of co-moments as one (Chan et al.'s parallel update)."""
    na, nb = a[0], b[0]
    if not nb:
        return a
    if not na:
        return b
    n = na + nb
    dx, dy = b[1] - a[1], b[2] - a[2]
    w = na * nb / n
    return (
        n,
        a[1] + dx * nb / n,
        a[2] + dy * nb / n,
        a[3] + b[3] + dx * dx * w,
        a[4] + b[4] + dy * dy * w,
        a[5] + b[5] + dx * dy * w,
    )


def _correlation(m: tuple[float, ...]) -> float | None:
    n, _, _, sxx, syy, sxy = m
    if n < MIN_ROWS or sxx <= 0 or syy <= 0:
        return None
    return sxy / float(np.sqrt(sxx * syy))
