"""A number column far from what a model was trained on: the one rule (`far_notice`) of a
pipeline's later versions (prepared with the first version's recorded standardisation:
table_fit.TableFit, from the moments and counts pass 1 gathers as it streams) and `smlt predict`
(`table_notices` on a table read whole; `TableFar`, the same notices gathered block by block as
predict streams a file). A warning only: the features are computed as before.

Another unit (grams for kilograms, cents for dollars, a percentage written 0-100 for 0-1) or a
broken export (all zeros, a default filled in) makes a column's standardised features land
hundreds or thousands of sd away, where a model's predictions are confident and wrong. Told, for
a number column (kind numeric) over the rows that hold one, and for a regression's target
against its recorded scaling, when

- more than half of its n rows lie more than SHIFT_SD training sd from the training mean
  (SHIFT_SD_FEW with fewer than SPREAD_ROWS rows, a predict batch of a few rows). Whatever a
  column's distribution, at most 1/k² of its rows lie k sd from its mean (Chebyshev's
  inequality): 1 % at 10 sd, so more than 15 of 30 such rows are beyond any chance (1e-20), and
  one row of a few at 100 sd has a chance of 1e-4. Another unit moves nearly every row (x100 on
  a column centred on 0: 92 % of its rows past 10 sd), a heavy tail a few (a sample of a
  lognormal or Pareto column whose mean or sd alone is 10 to 100 times training's, for one huge
  value: these are not told);
- or, with SPREAD_ROWS rows or more, its sd is less than 1/SPREAD_RATIO of training's (about a
  constant) while its rows sit z training sd from the training mean with n·log(1+z²) above
  -log(CONSTANT_CHANCE): by Cantelli's inequality at most a share 1/(1+z²) of any column with the
  training mean and sd lies that far on one side, so n such rows have a chance of at most
  (1+z²)^-n = 1e-9. A column of rare values (mostly 0, 1 % refunds) whose new rows are all 0
  sits 0.1 sd from its mean and is not told until some 2,000 rows all are; a column constant at
  its training mean is never told (it moves no prediction).

Ordinary drift and sampling noise (the same distribution, another sample) stay far below these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from smlt.runtime.data.manifest import ColumnTransform, Manifest, Normalization
    from smlt.runtime.data.tabular import Table

SHIFT_SD = 10.0
SHIFT_SD_FEW = 100.0
SPREAD_ROWS = 30
SPREAD_RATIO = 10.0
CONSTANT_CHANCE = 1e-9

UNITS = "are its units the same (grams for kilograms, cents for dollars, a percentage as 0-100 for 0-1)?"
BROKEN = "is the column broken (all zeros, a default value filled in)?"


def _num(v: float) -> str:
    return f"{v:,.5g}"


def _sd(z: float) -> str:
    return f"{z:,.0f}" if z >= 10 else f"{z:.1f}"


def beyond(values: np.ndarray, train_mean: float, train_std: float) -> list[int]:
    """How many of `values` (present, finite) lie more than SHIFT_SD and SHIFT_SD_FEW training sd
    from the training mean: what `far_notice` counts, block by block as prepare streams."""
    off = np.abs(np.asarray(values, np.float64) - train_mean)
    return [int((off > SHIFT_SD * train_std).sum()), int((off > SHIFT_SD_FEW * train_std).sum())]


def far_notice(
    where: str,
    what: str,
    n: int,
    mean: float,
    std: float,
    far: Sequence[int],
    train_mean: float,
    train_std: float,
    whose: str,
    todo: str,
) -> str | None:
    """A warning when `n` present values of `what` (`column 'weight'`) with `mean` and `std`
    (population sd), `far` of them beyond SHIFT_SD and SHIFT_SD_FEW sd (`beyond`), are far from
    `train_mean` and `train_std` (the recorded standardisation: `whose`, e.g. "in training"), in the
    module's sense, naming both, how far in sd, the likely cause and `todo`; else None."""
    if n <= 0 or not (train_std > 0 and math.isfinite(mean) and math.isfinite(std)):
        return None
    z = abs(mean - train_mean) / train_std
    said = (
        f"{where}: {what}: mean {_num(mean)}, sd {_num(std)} over {n:,} row{'s' * (n != 1)}; "
        f"{whose}: mean {_num(train_mean)}, sd {_num(train_std)}"
    )
    k, out = (SHIFT_SD, far[0]) if n >= SPREAD_ROWS else (SHIFT_SD_FEW, far[1])
    if 2 * out > n:
        rows = "the row lies" if n == 1 else f"{out:,} of the {n:,} rows lie"
        return f"{said}: {rows} more than {k:g} sd from that mean (the mean {_sd(z)} sd away): {UNITS} {todo}"
    if n >= SPREAD_ROWS and std < train_std / SPREAD_RATIO and n * math.log1p(z * z) > -math.log(CONSTANT_CHANCE):
        return f"{said}: nearly constant where it varied ({_sd(z)} sd away): {BROKEN} {todo}"
    return None


def numeric_features(columns: Sequence[ColumnTransform]) -> dict[str, int]:
    """Each number column's (kind numeric) feature: its index in the standardisation."""
    from smlt.runtime.data.tabular import width

    at, found = 0, {}
    for t in columns:
        if t.kind == "numeric":
            found[t.name] = at  # its value; an indicator, if any, after it
        at += width(t)
    return found


def trained(columns: Sequence[ColumnTransform], norm: Normalization) -> dict[str, tuple[float, float]]:
    """Each number column's recorded standardisation: name -> (training mean, training sd)."""
    return {
        name: (norm.mean[j], norm.std[j])
        for name, j in numeric_features(columns).items()
        if j < len(norm.mean) and j < len(norm.std)
    }


PREDICT_TODO = "predictions on these rows are unreliable: fix the data and predict again"
PREDICT_TARGET_TODO = "the accuracy measured against it is not the model's: fix the data and predict again"


def _present(cells: np.ndarray) -> np.ndarray | None:
    """A column's present cells as finite float64 (None when one is not a number)."""
    from smlt.runtime.data.tabular import missing

    kept = cells[~missing(cells)]
    try:
        values = kept.astype(np.float64)
    except ValueError:
        return None
    return values[np.isfinite(values)]


def table_notices(manifest: Manifest, rows: Table) -> list[str]:
    """`smlt predict`'s warnings for the rows of a table read whole: its number columns against
    the manifest's standardisation, and a regression's target column (when the data holds it)
    against the recorded target scaling (`TableFar` over its one block)."""
    far = TableFar(manifest, list(rows.columns))
    far.add(rows)
    return far.notices(rows.path)


class Far:
    """One column's present values (`_present`) gathered block by block: what `far_notice` reads of
    them, their count and moments (stats.Moments, as pass 1 gathers a pipeline's) and how many lie
    far (`beyond`); none when a block's cell is not a number."""

    def __init__(self, train: tuple[float, float]):
        from smlt.runtime.data.stats import Moments

        self.train = train
        self.moments = Moments(1)
        self.far = [0, 0]
        self.numbers = True

    def add(self, cells: np.ndarray) -> None:
        if not self.numbers:
            return
        values = _present(cells)
        if values is None:
            self.numbers = False
            return
        self.moments.add(values[:, None])
        self.far = [a + b for a, b in zip(self.far, beyond(values, *self.train))]

    def notice(self, where: str, what: str, todo: str) -> str | None:
        n = int(self.moments.n[0])
        if not self.numbers or not n:
            return None
        mean, std = float(self.moments.mean[0]), float(self.moments.std[0])
        return far_notice(where, what, n, mean, std, self.far, *self.train, "in training", todo)


class TableFar:
    """The far-column warnings of a table, read block by block (`add` each block's rows, then
    `notices`): its number columns and a regression's target, over all its rows."""

    def __init__(self, manifest: Manifest, header: Sequence[str]):
        names = set(header)
        self.columns = {
            name: Far(train)
            for name, train in trained(manifest.columns or [], manifest.normalization).items()
            if name in names
        }
        label, target = manifest.label, manifest.target
        self.target: tuple[str, Far] | None = None
        if manifest.task == "regression" and label and target and label in names and len(target.mean) == 1:
            self.target = (label, Far((target.mean[0], target.std[0])))

    def add(self, rows: Table) -> None:
        for name, far in self.columns.items():
            far.add(rows.columns[name])
        if self.target is not None:
            self.target[1].add(rows.columns[self.target[0]])

    def notices(self, where: str) -> list[str]:
        found = [far.notice(where, f"column {name!r}", PREDICT_TODO) for name, far in self.columns.items()]
        if self.target is not None:
            found.append(self.target[1].notice(where, f"target column {self.target[0]!r}", PREDICT_TARGET_TODO))
        return [note for note in found if note]
