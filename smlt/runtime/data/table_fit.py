"""The first of `smlt data prepare`'s two passes over a CSV or Parquet file (blocks from
smlt.runtime.data.table_reader, split by smlt.runtime.data.split): every cell read once, in
bounded memory, for

- the label: numbers or text, the task, the classes (or the regression targets' train mean and
  std and validation variance); a row without one (an empty cell, or a missing marker in a label
  column of numbers) is left out of both passes and both splits, and said once
  (`LabelFit.labelled`);
- each feature column: numeric (every cell a number), date (every present cell an ISO-8601 date,
  or every one a spreadsheet's `3/15/2024`, `15.03.2024`, ... with the day-month order its largest
  fields decide over the whole column, or `15-Mar-2024`, `Mar 15, 2024`, ..., times 24-hour or
  all AM/PM, table_reader.parse_dates; or a Parquet date/timestamp) or
  text, and the train split's statistics
  of its transform (its levels and most frequent value; its median, a date's in days since
  1970-01-01, settled in the second pass; whether a date has times of day);
- the refusals, named by file, column and line: an empty cell (`--missing refuse`, or a column
  the pipeline's first version had no gaps in), a cell that is not a number where a number is
  needed, a NaN/Inf/beyond-float32 number (`not_finite`: the first in file order, with the count).

A missing marker (`NA`, `NULL`, ... : table_reader.MISSING_MARKERS) in a column of numbers is an
empty cell, imputed or refused as one; prepare says how many a column had (`markers_read`).

With a pipeline's FeatureSpec nothing is fitted: its transforms are checked against the file, a
one-hot column's values that are none of its levels are counted (`ColumnFit.unseen_levels`), and
a number column's present values (a regression's target's too) gather their moments, told when
far from the recorded standardisation (smlt.runtime.data.drift: another unit, a broken column).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from smlt.runtime.data import drift, tabular
from smlt.runtime.data.arrays import FLOAT32_MAX, target_std
from smlt.runtime.data.leaks import LabelLeaks
from smlt.runtime.data.manifest import (
    ArraySpec,
    ColumnTransform,
    DateFormat,
    FeatureSpec,
    TargetScaling,
    class_name,
)
from smlt.runtime.data.options import SourceOptions, Task
from smlt.runtime.data.stats import MAX_LEVELS, Levels, Median, Moments
from smlt.runtime.data.table_reader import (
    DATE_ORDER_UNTOLD,
    NAMED_ORDER,
    NAMED_STYLES,
    Block,
    DateShape,
    date_form,
    same_clock,
)
from smlt.runtime.errors import InvalidDataset

# Numbers kept in memory for all the numeric columns' medians together (8 bytes each).
MEDIAN_NUMBERS = 4 << 20


def _more(seen: set | None, values: list) -> set | None:
    """`seen` with `values` added; None (too many to keep) past MAX_LEVELS."""
    if seen is None:
        return None
    seen.update(values)
    return seen if len(seen) <= MAX_LEVELS else None


@dataclass
class Labels:
    """What the label column became: the task, y's spec, the outputs, the classes or the scaling."""

    task: Task
    y: ArraySpec
    outputs: int
    classes: list[str] | None
    target: TargetScaling | None


# Rows without a label named by their line (or row) in the notice that they are left out.
UNLABELLED_SHOWN = 3


class LabelFit:
    def __init__(self, path: str, name: str, task: Task | None, spec: FeatureSpec | None, text: bool = False):
        self.path, self.name, self.task, self.spec = path, name, task, spec
        # the column read as text (a missing marker a class, not a missing label): from the first
        # row when pass 1 starts again (`flipped`), else from the first block not all numbers
        self.as_text = text
        self.unlabelled = 0  # rows left out: their label is missing
        self.marked = 0  # those whose label is a missing marker (`NA`, ...) in a column read as numbers
        self.written: set[str] = set()  # those markers, as written
        self.first_unlabelled: list[tuple[str, str, int]] = []  # (file, unit, row number) of the first few
        self.files = 1  # the table's files (parts merged)
        self.numeric = True  # every label so far a number
        self.decimals = False  # one written with a decimal point or an exponent (or a Parquet number)
        self.fraction = False  # one not a whole number
        self.not_finite = 0  # labels that are NaN or Inf (`inf`, `1e400`): refused for a regression
        self.first_not_finite: tuple[str, str] | None = None  # (where, cell) of the first
        self.numbers: set | None = set()  # the distinct labels (while at most MAX_LEVELS)
        self.texts: set | None = set()
        self.train, self.val = Moments(1), Moments(1)
        self._keys: Any = None
        self._index = np.zeros(0, np.int64)
        self._scale = (0.0, 1.0)
        # a pipeline's regression: the recorded target (mean, sd), and how many labels lie beyond
        # drift.SHIFT_SD and SHIFT_SD_FEW sd of it (drift.far_notice, with `train` and `val`)
        self.trained: tuple[float, float] | None = None
        if spec is not None and spec.task == "regression" and spec.target_mean and spec.target_std:
            self.trained = (spec.target_mean[0], spec.target_std[0])
        self.far = [0, 0]

    def labelled(self, block: Block, count: bool = True) -> Block:
        """The block's rows that have a label, as read from the file (before the split: the rows
        left are split as a file without the others would be). A label is missing when its cell
        is empty, or is a missing marker (`NA`, `NULL`, ...: `Block.number_text`) while the column
        is numbers; in a text column a marker is a class. Pass 1 `count`s the rows left out (for
        `unlabelled_notice`); pass 2 leaves out the same rows, the column read as pass 1 ended."""
        import pyarrow as pa

        parsed = None if self.as_text else block.numbers(self.name)
        if parsed is None:
            # a regression's text label is refused by `add`; else text from here on (rows with a
            # marker left out before: `flipped`, pass 1 starts again with the column as text)
            self.as_text = self.as_text or self.task != "regression"
            missing = block.gaps(self.name)
        else:
            missing = parsed[1]
        if not missing.any():
            return block
        if count:
            self.unlabelled += int(missing.sum())
            if parsed is not None and block.csv:
                marked = block.markers(self.name)
                if marked.any():
                    self.marked += int(marked.sum())
                    self.written.update(block.text(self.name).filter(pa.array(marked)).unique().to_pylist())
            more = UNLABELLED_SHOWN - len(self.first_unlabelled)
            if more > 0:
                self.first_unlabelled += [(block.path, block.unit, int(r)) for r in block.rows[missing][:more]]
        return block.keep(~missing)

    @property
    def flipped(self) -> bool:
        """Rows left out for a missing marker in a column that turned out to be text, where the
        marker is a class: pass 1 must start again with the column read as text."""
        return self.as_text and self.marked > 0

    def unlabelled_notice(self, rows: int) -> str | None:
        """A notice when rows were left out for their missing label (`rows`: those kept)."""
        if not self.unlabelled:
            return None
        said = _row_list(self.first_unlabelled, self.files > 1, self.unlabelled)
        if self.marked:
            said += f"; {self.marked:,} written {' or '.join(map(repr, sorted(self.written)))}"
        return (
            f"{self.path}: {self.unlabelled:,} of {rows + self.unlabelled:,} rows have no label in column "
            f"{self.name!r} ({said}): left out of training and validation"
        )

    def refuse_too_few(self, rows: int) -> None:
        """Refused when rows were left out for their missing label and fewer than 2 are left
        (`rows`: those kept): one to train on and one to validate."""
        if not self.unlabelled or rows >= 2:
            return
        total = rows + self.unlabelled
        if not rows:
            empty = "empty or a missing marker" if self.marked else "empty"
            raise InvalidDataset(
                f"{self.path}: no row has a label in column {self.name!r} (all {total:,} are {empty}): nothing to "
                "learn from; name the label column with --label if it is another"
            )
        raise InvalidDataset(
            f"{self.path}: only 1 of {total:,} rows has a label in column {self.name!r}: at least 2 are needed "
            "(one to train on, one to validate)"
        )

    def refuse_a_row_per_class(self, labels: Labels, rows: int) -> None:
        """Refused: a new classification whose classes average under 2 rows (`rows`: those with a
        label), past MAX_INFERRED_CLASSES classes: most validation rows' classes would have no
        train row. The column is a name, an id or free text, most likely taken as the label for
        being the last one, not a label."""
        k = labels.outputs
        if labels.task != "classification" or self.spec is not None or k <= tabular.MAX_INFERRED_CLASSES:
            return
        if 2 * k <= rows:
            return
        raise InvalidDataset(
            f"{self.path}: label column {self.name!r} has {k:,} distinct values in {rows:,} rows: most classes have "
            "a single row, which no model can learn or be validated on (a name, an id or free text, not a label?): "
            'name the label column with --label COLUMN (a job\'s dataset: "label"), or pass --task regression '
            "for a quantity"
        )

    def add(self, block: Block, val: np.ndarray, train: np.ndarray) -> None:
        """Count a block's labels (rows without one left out: `labelled`)."""
        import pyarrow.compute as pc

        parsed = None if self.as_text else block.numbers(self.name)
        if parsed is None:
            if self.task == "regression":
                i = block.first_not_a_number(self.name)
                raise InvalidDataset(
                    f"{block.where(i, self.name)}: {block.cell(i, self.name)!r} is not a number (task is regression)"
                )
            self.numeric = False
        else:
            values = parsed[0]
            self.fraction = self.fraction or not bool(np.all(values == np.round(values)))
            ok = np.isfinite(values)
            if not ok.all():
                if self.first_not_finite is None:
                    i = int(np.argmin(ok))
                    self.first_not_finite = (block.where(i, self.name), block.cell(i, self.name))
                self.not_finite += int((~ok).sum())
            if not self.decimals:
                whole = pc.match_substring_regex(block.text(self.name), r"^[+-]*[0-9]+$")
                self.decimals = not block.csv or not pc.all(whole).as_py()
            for moments, rows in ((self.train, values[train]), (self.val, values[val])):
                moments.add(rows[np.isfinite(rows), None])  # NaN and Inf are refused (`_regression`)
            if self.trained is not None:
                present = values[np.isfinite(values)]
                self.far = [a + b for a, b in zip(self.far, drift.beyond(present, *self.trained))]
            self.numbers = _more(self.numbers, np.unique(values).tolist())
        if block.csv or parsed is None:
            self.texts = _more(self.texts, pc.unique(block.text(self.name)).to_pylist())

    def merge(self, other: LabelFit) -> None:
        """Add another file's pass 1 (the same label column, read after this one's rows)."""
        self.numeric = self.numeric and other.numeric
        self.decimals = self.decimals or other.decimals
        self.fraction = self.fraction or other.fraction
        self.not_finite += other.not_finite
        self.first_not_finite = self.first_not_finite or other.first_not_finite
        self.numbers = _more(self.numbers, list(other.numbers)) if other.numbers is not None else None
        self.texts = _more(self.texts, list(other.texts)) if other.texts is not None else None
        self.train.merge(other.train)
        self.val.merge(other.val)
        self.far = [a + b for a, b in zip(self.far, other.far)]
        self.as_text = self.as_text or other.as_text
        self.unlabelled += other.unlabelled
        self.marked += other.marked
        self.written |= other.written
        self.first_unlabelled = (self.first_unlabelled + other.first_unlabelled)[:UNLABELLED_SHOWN]
        self.files += other.files

    def finish(self) -> Labels:
        """The labels as the manifest records them, or the named refusal."""
        task = self.task or ("classification" if not self.numeric else self._infer())
        if task == "regression":
            return self._regression()
        distinct = self.numbers if self.numeric else self.texts
        if distinct is None:
            raise InvalidDataset(
                f"{self.path}: label column {self.name!r} has more than {MAX_LEVELS:,} distinct values: "
                "too many classes (pass --task regression for a quantity)"
            )
        keys = sorted(distinct)
        names = [class_name(k) for k in keys]
        if self.spec is not None and self.spec.classes is not None:
            index_of = {c: i for i, c in enumerate(self.spec.classes)}
            unseen = sorted(n for n in names if n not in index_of)
            for label in unseen:
                written = tabular.same_but_case(label, self.spec.classes)
                if written is not None:
                    raise InvalidDataset(
                        f"{self.path}: label {label!r} is not one of the pipeline's classes "
                        f"({', '.join(self.spec.classes)}), but differs from its class {written!r} only in letter "
                        f"case or spacing: write it {written!r} in column {self.name!r} and upload the version "
                        "again (a class of its own changes the model's outputs: prepare with --new-features)"
                    )
            if unseen:
                raise InvalidDataset(
                    f"{self.path}: label {unseen[0]!r} is not one of the pipeline's classes "
                    f"({', '.join(self.spec.classes)}); a new class changes the model's outputs: prepare with "
                    "--new-features to start a new generation"
                )
            index, classes = [index_of[n] for n in names], list(self.spec.classes)
        else:
            if len(keys) < 2:
                raise InvalidDataset(
                    f"{self.path}: every label is {keys[0]!r}: a classifier needs at least 2 classes "
                    "(or pass --task regression)"
                )
            index, classes = list(range(len(keys))), names
            _tell_case_variants(self.path, f"label column {self.name!r}", names, "classes")
        self._keys = np.array(keys, np.float64) if self.numeric else keys
        self._index = np.array(index, np.int64)
        return Labels("classification", ArraySpec(shape=[], dtype="int64"), len(classes), classes, None)

    def _infer(self) -> Task:
        """Regression for fractional labels, classification for whole numbers with few distinct
        values (fewer still when written as decimals); more are refused rather than guessed, and
        classes past MAX_INFERRED_DECIMAL_CLASSES are told how to be a quantity."""
        from smlt.runtime.progress import notice

        if self.fraction:
            return "regression"
        limit = tabular.MAX_INFERRED_DECIMAL_CLASSES if self.decimals else tabular.MAX_INFERRED_CLASSES
        n = len(self.numbers) if self.numbers is not None else None
        task = '(a job\'s dataset: "task": "regression")'
        if n is None or n > limit:
            raise InvalidDataset(
                f"{self.path}: label column {self.name!r} has {n if n is not None else f'more than {MAX_LEVELS:,}'} "
                "distinct whole-number values"
                + (" written as decimals" if self.decimals else "")
                + f"{self._span()}: pass --task regression for a quantity such as an age, a count or a price {task}, "
                "or --task classification if each value is a class"
            )
        if n > tabular.MAX_INFERRED_DECIMAL_CLASSES:
            notice.info(
                f"{self.path}: label column {self.name!r} has {n} distinct whole-number values{self._span()}, "
                f"read as {n} classes: if it is a quantity such as a count or a rating, pass --task regression {task}"
            )
        return "classification"

    def _span(self) -> str:
        return f" ({min(self.numbers):g} to {max(self.numbers):g})" if self.numbers else ""

    def _regression(self) -> Labels:
        if self.first_not_finite is not None:
            where, cell = self.first_not_finite
            total = int(self.train.n[0] + self.val.n[0]) + self.not_finite
            raise tabular.not_finite(where, cell, False, self.not_finite, total, self.name)
        spec = self.spec
        if spec is not None and spec.target_mean is not None and spec.target_std is not None:
            if len(spec.target_mean) != 1:
                raise InvalidDataset(
                    f"{self.path}: 1 regression target, the pipeline's features {len(spec.target_mean)}"
                )
            mean, std = float(spec.target_mean[0]), float(spec.target_std[0])
        else:
            mean = float(self.train.mean[0])
            std = float(target_std(np.asarray(self.train.std[:1]), self.path, np.asarray([mean]), [self.name])[0])
        self._scale = (mean, std)
        val_var = float(self.val.m2[0] / max(self.val.n[0], 1.0))
        target = TargetScaling(mean=[mean], std=[std], val_var=[val_var])
        return Labels("regression", ArraySpec(shape=[1], dtype="float32"), 1, None, target)

    def target_notice(self, whose: str) -> str | None:
        """A pipeline's regression version: a warning when its targets (both splits) are far from
        the recorded target scaling (drift.far_notice)."""
        if self.trained is None or not self.numeric:
            return None
        both = Moments(1)
        both.merge(self.train)
        both.merge(self.val)
        where = f"target column {self.name!r}"
        return drift.far_notice(self.path, where, *_moments(both), self.far, *self.trained, whose, PIPELINE_TODO)

    def encode(self, block: Block) -> np.ndarray:
        """The block's stored y (after `finish`): class indices, or targets standardised."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self._keys is None:  # regression
            parsed = block.numbers(self.name)
            assert parsed is not None
            mean, std = self._scale
            return ((parsed[0] - mean) / std).astype(np.float32)[:, None]
        if self.numeric:
            parsed = block.numbers(self.name)
            assert parsed is not None
            return self._index[np.searchsorted(self._keys, parsed[0])]
        found = pc.index_in(block.text(self.name), value_set=pa.array(self._keys, pa.string()))
        return self._index[found.to_numpy(zero_copy_only=False)]


def _tell_case_variants(path: str, what: str, values: Sequence[str], kind: str) -> None:
    """A warning when some of a label's classes (or a one-hot column's levels) differ only in case
    or spacing: likely one value written several ways, which a model learns apart."""
    from smlt.runtime.progress import notice

    groups = tabular.case_variants(values)
    if not groups:
        return
    said = "; ".join(" and ".join(map(repr, g)) for g in groups[:3]) + ("; ..." if len(groups) > 3 else "")
    notice.warning(
        f"{path}: {what}: {said} differ only in letter case or spacing, and are learnt as different {kind}: "
        "if they mean the same, write them one way in the file and prepare again"
    )


def _row_list(rows: list[tuple[str, str, int]], named: bool, n: int) -> str:
    """`lines 61, 80, 95, ...`: the first rows of `n`; `named`, each file's named (a table in parts:
    `part-00000.csv line 6; part-00001.csv lines 3, 9`)."""
    said: list[str] = []
    for i, (file, unit, row) in enumerate(rows):
        if i and rows[i - 1][0] == file:
            said[-1] += f", {row}"
            continue
        name = f"{file.rsplit('/', 1)[-1]} " if named else ""
        plural = unit + "s" if sum(f == file for f, _, _ in rows) > 1 else unit
        said.append(f"{name}{plural} {row}")
    return "; ".join(said) + (", ..." if n > len(rows) else "")


def _empty(block: Block, i: int, name: str) -> str:
    """Where an empty cell is, and how it is written when it is a missing marker."""
    cell = block.cell(i, name) if block.csv else ""
    return block.where(i, name) + " is empty" + (f" (written {cell!r})" if cell else "")


# A cell that is a number as float64 parsing reads one (after stripping): what `mostly_numbers` counts.
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


# What a pipeline version far from its features' standardisation is told to do (drift.far_notice).
PIPELINE_TODO = (
    "prepared as it is, with the recorded mean and sd: fix the file and upload the version again (or, "
    "to change the column for good, prepare with --new-features: a new generation, its run starts cold)"
)


def _moments(m: Moments) -> tuple[int, float, float]:
    """(rows, mean, population sd) of a one-feature Moments."""
    return int(m.n[0]), float(m.mean[0]), float(m.std[0])


# Rows a rising column needs before it is named a row number (fewer: too few to tell).
ROW_NUMBER_ROWS = 30
# A pipeline's one-hot column: its unseen values counted one by one up to this many, the most
# frequent so far (the rows holding any of them always).
UNSEEN_KEPT = 256


def _still_rising(span: list[float], values: np.ndarray, gaps: np.ndarray) -> list[float] | None:
    """`span` ([first, last] so far, [] before any) with a block's numbers, None unless they are
    whole, present and each above the one before."""
    if not len(values):
        return span
    if gaps.any() or (span and values[0] <= span[1]) or np.any(np.diff(values) <= 0):
        return None
    if not np.all(values == np.round(values)):
        return None
    return [span[0] if span else float(values[0]), float(values[-1])]


# What a spreadsheet's totals row says in one of its cells (stripped, any case, an optional colon).
_TOTAL = re.compile(
    r"(?i:(?:grand |sub-?)?totals?|sum|summe|gesamt(?:summe)?|total général|totale|totaal|suma|合計|合计|总计|總計):?"
)


def _totals_row(block: Block, label: str) -> str | None:
    """Where a block's last row is a totals row with a label (its label cell not empty): `path: column
    'id', line 62 is 'Total'`; else None (a row without a label is left out as such)."""
    i = len(block) - 1
    if label in block.cells and not block.cell(i, label):
        return None
    for name in block.cells:
        cell = block.cell(i, name)
        if cell and _TOTAL.fullmatch(cell):
            return f"{block.where(i, name)} is {cell!r}"
    return None


# A column name that says it is an id: `id`, `ID`, `customer_id`, `customer id`, `userId`, `CustomerID`,
# `uuid` (not `idle`, `valid`, `paid`: `id` a word of its own, or capitalised after a lower-case letter).
_ID_NAME = re.compile(r"(?:^|[_\s.-])(?:id|ID|Id|uuid|UUID)$|^(?:id|ID|Id)(?:[_\s.-]|$)|[a-z](?:Id|ID)$")


class ColumnFit:
    """One feature column over pass 1: numeric or text, its train statistics, its bad numbers."""

    def __init__(
        self, name: str, fixed: ColumnTransform | None, numeric: bool, keep: int, date_order: str | None = None
    ):
        self.name = name
        self.fixed = fixed  # the pipeline's transform: checked, not fitted
        self.numeric = fixed.kind == "numeric" if fixed is not None else numeric
        self.flipped = False  # text after blocks read as numbers: pass 1 starts again
        self.blocks = 0
        self.train_gaps = 0
        self.median = Median(keep)
        self.levels = Levels()
        self.bad = 0  # cells NaN, Inf or beyond float32
        self.first_bad: tuple[int, str, str, bool] | None = None  # (row number, where, cell, finite)
        # a text column's present cells, those that are numbers, and its first that is not
        self.cells, self.numberlike = 0, 0
        self.first_text: tuple[int, str, str] | None = None  # (row number, where, cell)
        self.marked = 0  # cells of a number column that are missing markers (empty)
        self.written: set[str] = set()  # those markers, as written
        # [first, last] while the column's numbers are whole and rise with every row (no gaps): a
        # row number or an id; None once they do not
        self.rising: list[float] | None = []
        # a text column while every present cell is a date written one way (table_reader.parse_dates):
        # its present cells, its train gaps (a missing marker is one), whether one has a time of day;
        # its median date is `median`'s (days since 1970-01-01)
        self.dates = fixed is None or fixed.kind == "date"
        self.date_cells, self.date_gaps, self.timed = 0, 0, False
        # how its cells write dates (table_reader.DateShape: "" none yet, "iso", or a day-month
        # separator with the largest first and second field); the order told (--date-order), else
        # decided by those fields over the whole column; while they leave it open (none above 12),
        # `median` holds the dates read in `median_order` (the separator's default) and
        # `median_other` those read in the other order, until a field settles it
        self.date_shape = DateShape("")
        self.date_order = date_order
        self.median_order: str | None = None
        self.median_other: Median | None = None
        # a pipeline's one-hot column: the rows it has read, those holding values that are none of
        # its levels (tabular.unseen_values), and some of those values with their counts
        self.read, self.unseen_rows = 0, 0
        self.unseen: dict[str, int] = {}
        # a text column's words with a letter (tabular.word_count) in its present train cells, and
        # those cells: free text when many distinct values hold at least TEXT_MIN_WORDS a cell on average
        self.words, self.word_cells = 0, 0
        # a pipeline's number column: its recorded (mean, sd), its present values' moments (all
        # rows) and how many lie beyond drift.SHIFT_SD and SHIFT_SD_FEW sd of it (drift.far_notice)
        self.trained: tuple[float, float] | None = None
        self.moments = Moments(1)
        self.far = [0, 0]

    @property
    def is_date(self) -> bool:
        """A date column: the pipeline's, or a text column whose every present cell is a date."""
        if self.fixed is not None:
            return self.fixed.kind == "date"
        return not self.numeric and self.dates and self.date_cells > 0

    @property
    def is_text(self) -> bool:
        """Free text (kind "text"): the pipeline's, or a text column, not dates, with more than
        tabular.MAX_ONEHOT_LEVELS distinct train values of tabular.TEXT_MIN_WORDS words with a letter or
        more on average."""
        if self.fixed is not None:
            return self.fixed.kind == "text"
        if self.numeric or self.is_date:
            return False
        return tabular.is_free_text(len(self.levels.counts), self.words, self.word_cells)

    def values(self, block: Block) -> tuple[np.ndarray, np.ndarray] | None:
        """The block's cells as the column's median counts them: numbers, or a date's days."""
        return block.dates(self.name, self.date_format) if self.is_date else block.numbers(self.name)

    @property
    def date_format(self) -> DateFormat | None:
        """How a date column's cells write dates (table_reader.DATE_FORMS), None for ISO 8601."""
        if self.fixed is not None:
            return self.fixed.date_format
        sep = self.date_shape.sep
        if sep in ("", "iso") or self.median_order is None:
            return None
        return cast(DateFormat, date_form(sep, self.median_order, self.date_shape.clock))

    def _settled_order(self) -> str | None:
        """The day-month order the largest fields seen decide (a first above 12: day first; a
        second above 12: month first); None while they leave it open. Both, or one against the
        order told: not dates (`dates` False). A month by name settles it (NAMED_ORDER)."""
        shape = self.date_shape
        if shape.sep in NAMED_STYLES:
            return NAMED_ORDER
        day_first, month_first = shape.first > 12, shape.second > 12
        found = "day_first" if day_first else "month_first" if month_first else None
        if (day_first and month_first) or (found and self.date_order and found != self.date_order):
            self.dates = False
            return None
        return found or self.date_order

    def _median_in(self, order: str) -> Median:
        """The dates' median read in `order` (empty when none was read with a separator)."""
        if self.median_order is None:
            return Median(self.median.keep)
        if order == self.median_order:
            return self.median
        assert self.median_other is not None, "the order was settled the other way"
        return self.median_other

    def _settle(self, order: str | None) -> None:
        """Keep the median read in `order` (None: both, the separator's default in `median`)."""
        sep = self.date_shape.sep
        if order is None:
            order = DATE_ORDER_UNTOLD[sep]
            other = "day_first" if order == "month_first" else "month_first"
            self.median, self.median_other = self._median_in(order), self._median_in(other)
        else:
            self.median, self.median_other = self._median_in(order), None
        self.median_order = order

    def add(self, block: Block, train: np.ndarray) -> np.ndarray:
        """Count the block's cells; returns where they are empty."""
        import pyarrow as pa

        if self.fixed is not None and self.fixed.kind == "date":
            return self._add_dates(block, train)
        parsed = block.numbers(self.name) if self.numeric else None
        if self.numeric and parsed is None:
            if self.fixed is not None:
                i = block.first_not_a_number(self.name)
                raise InvalidDataset(
                    f"{block.where(i, self.name)}: {block.cell(i, self.name)!r} is not a number, and the pipeline's "
                    f"features read column {self.name!r} as numbers: empty the cell (or write NA, read as empty) and "
                    "upload the version again"
                )
            self.numeric, self.flipped = False, self.blocks > 0
        if parsed is not None:
            values, gaps = parsed
            with np.errstate(invalid="ignore"):  # NaN compares False
                bad = ~(np.abs(values) <= FLOAT32_MAX) & ~gaps
            if bad.any():
                if self.first_bad is None:
                    i = int(np.argmax(bad))
                    where, cell = block.where(i, self.name), block.cell(i, self.name)
                    self.first_bad = (int(block.rows[i]), where, cell, bool(np.isfinite(values[i])))
                self.bad += int(bad.sum())
            if self.fixed is None:
                self.median.add(values[train & ~gaps & ~bad])
                if self.rising is not None:
                    self.rising = _still_rising(self.rising, values, gaps)
            elif self.trained is not None:
                present = values[~gaps & ~bad]
                self.moments.add(present[:, None])
                self.far = [a + b for a, b in zip(self.far, drift.beyond(present, *self.trained))]
            if block.csv and gaps.any():
                marked = block.markers(self.name)
                if marked.any():
                    self.marked += int(marked.sum())
                    self.written.update(block.text(self.name).filter(pa.array(marked)).unique().to_pylist())
        else:
            gaps = block.gaps(self.name)
            if self.fixed is None:
                train_text = block.text(self.name).filter(pa.array(train))
                self.levels.add(train_text)
                self.words += tabular.word_count(train_text)
                self.word_cells += len(train_text) - train_text.null_count
                self._count_numbers(block)
                if self.dates:
                    self._add_dates(block, train)
            elif self.fixed.kind == "onehot":
                found = tabular.unseen_values(self.fixed, block.text(self.name))
                self._add_unseen(found, sum(found.values()), len(block))
        self.train_gaps += int((gaps & train).sum())
        self.blocks += 1
        return gaps

    def _add_dates(self, block: Block, train: np.ndarray) -> np.ndarray:
        """Count a block's dates (a date column no more when one cell is not, or is written
        otherwise than earlier cells: the pipeline's is refused by name); returns where they are
        empty."""
        parsed = self._read_dates(block)
        if parsed is None:
            if self.fixed is None:
                self.dates = False
                return block.gaps(self.name)
            form = self.fixed.date_format
            i = block.first_not_a_date(self.name, form)
            raise InvalidDataset(
                f"{block.where(i, self.name)}: {block.cell(i, self.name)!r} is not a date {tabular.date_written(form)}"
            )
        days, gaps = parsed
        present = days[~gaps]
        self.date_cells += len(present)
        self.date_gaps += int((gaps & train).sum())
        self.timed = self.timed or bool(np.any(present != np.floor(present)))
        if self.fixed is None:
            self.median.add(days[train & ~gaps])
            if self.median_other is not None:  # the order still open: the dates read the other way too
                other = block.dates(
                    self.name,
                    date_form(
                        self.date_shape.sep,
                        "day_first" if self.median_order == "month_first" else "month_first",
                        self.date_shape.clock,
                    ),
                )
                assert other is not None, "a day and a month of at most 12 read either way"
                self.median_other.add(other[0][train & ~gaps])
        else:
            self.train_gaps += int((gaps & train).sum())
            self.blocks += 1
        return gaps

    def _read_dates(self, block: Block) -> tuple[np.ndarray, np.ndarray] | None:
        """A block's dates as the column writes them, its shape added to the column's (None: not
        dates, or written otherwise than the column's earlier cells)."""
        if self.fixed is not None:
            return block.dates(self.name, self.fixed.date_format)
        shape = block.date_shape(self.name)
        mine = self.date_shape
        if shape is None or (shape.sep and mine.sep and shape.sep != mine.sep):
            return None
        if not shape.sep:  # no present cell
            return block.dates(self.name)
        clock = same_clock(mine.clock, shape.clock)
        if clock is None:  # 24-hour times in some blocks, AM/PM in others
            return None
        self.date_shape = DateShape(shape.sep, max(mine.first, shape.first), max(mine.second, shape.second), clock)
        if shape.sep == "iso":
            return block.dates(self.name)
        order = self._settled_order()
        if not self.dates:
            return None
        self._settle(order)
        return block.dates(self.name, self.date_format)

    def _add_unseen(self, counts: dict[str, int], cells: int, rows: int) -> None:
        """Count `rows` more rows of a pipeline's one-hot column, `cells` of them unseen values
        (`counts`: those values, or some of them, by value)."""
        self.read += rows
        self.unseen_rows += cells
        for value, n in counts.items():
            self.unseen[value] = self.unseen.get(value, 0) + n
        if len(self.unseen) > UNSEEN_KEPT:  # the most frequent kept
            kept = sorted(self.unseen.items(), key=lambda kv: (-kv[1], kv[0]))[:UNSEEN_KEPT]
            self.unseen = dict(kept)

    def unseen_levels(self, path: str) -> str | None:
        """A notice when a pipeline's one-hot column holds values none of its levels: encoded as
        none of them, which the model cannot learn."""
        if not self.unseen_rows:
            return None
        levels = self.fixed.levels if self.fixed is not None else []
        near = [(v, k) for v in sorted(self.unseen) if (k := tabular.same_but_case(v, levels)) is not None]
        written = (
            "; "
            + ", ".join(f"{v!r} differs from its level {k!r}" for v, k in near[:3])
            + " only in letter case or spacing: if they mean the same, write them so and upload the version again"
            if near
            else ""
        )
        return (
            tabular.unseen_notice(
                path, self.name, self.unseen, self.unseen_rows, self.read, "new to the pipeline's features"
            )
            + ", which the model cannot learn: prepare with --new-features to learn them "
            f"(a new generation; its run starts cold){written}"
        )

    def _count_numbers(self, block: Block) -> None:
        """How many of a text column's cells are numbers: a quantity with a few stray cells
        ("unknown", "12 kg") is read as text, which `mostly_numbers` tells. A missing marker
        counts as the empty cell it would be were the column numbers."""
        import pyarrow.compute as pc

        text = block.number_text(self.name)
        gaps = text.is_null().to_numpy(zero_copy_only=False)
        number = pc.fill_null(pc.match_substring_regex(text, _NUMBER), False).to_numpy(zero_copy_only=False)
        self.cells += int((~gaps).sum())
        self.numberlike += int(number.sum())
        if self.first_text is None:
            other = ~number & ~gaps
            if other.any():
                i = int(np.argmax(other))
                self.first_text = (int(block.rows[i]), block.where(i, self.name), block.cell(i, self.name))

    def mostly_numbers(self) -> str | None:
        """A notice when this column is read as text though at least 90 % of its cells are numbers."""
        if self.numeric or self.fixed is not None or self.first_text is None or self.numberlike < 0.9 * self.cells:
            return None
        _, where, cell = self.first_text
        return (
            f"{where}: {cell!r} is not a number, so column {self.name!r} is read as text though "
            f"{self.numberlike:,} of its {self.cells:,} cells are numbers; if it is a quantity, fix or empty "
            "such cells (an empty cell is imputed or refused, see --missing) and prepare again"
        )

    def markers_read(self, path: str) -> str | None:
        """A notice when this number column had missing markers (`NA`, ...), read as empty cells
        (imputed: a refused empty cell stops pass 1)."""
        if not self.numeric or not self.marked:
            return None
        written = " or ".join(map(repr, sorted(self.written)))
        how = "the pipeline's recorded median" if self.fixed is not None else "the train split's median, see --missing"
        cells = "1 cell written {} is" if self.marked == 1 else f"{self.marked:,} cells written {{}} are"
        return f"{path}: column {self.name!r}: {cells.format(written)} read as empty (imputed with {how})"

    def mostly_distinct(self, path: str) -> str | None:
        """A notice when this column is hashed though nearly every value in it is different: an
        id, a timestamp or free text, whose buckets a model can only memorise."""
        if self.numeric or self.fixed is not None or self.is_date or self.is_text:
            return None
        counted = sum(self.levels.counts.values())
        distinct = len(self.levels.counts)
        if distinct <= max(tabular.MAX_ONEHOT_LEVELS, 50) or distinct < 0.5 * counted:
            return None
        return (
            f"{path}: column {self.name!r} has {distinct:,} distinct values in {counted:,} train rows, hashed into "
            f"{tabular.HASH_BUCKETS} features: values that are nearly all different (an id, a date, free text?) "
            f"tell a model nothing it can use on new rows: {tabular.drop_hint(self.name)}, unless it means something"
        )

    def row_number(self, path: str, rows: int) -> str | None:
        """A notice when this numeric column rises by whole numbers with every row, as a row
        number, an id or a time does: a model can only memorise it."""
        if not self.numeric or self.fixed is not None or not self.rising or rows < ROW_NUMBER_ROWS:
            return None
        first, last = self.rising
        return (
            f"{path}: column {self.name!r} rises with every row ({first:,.0f} to {last:,.0f}): a row number, an id "
            "or a time tells a model nothing it can use on new rows (and gives the label away in a file sorted by "
            f"it): {tabular.drop_hint(self.name)}, unless it means something"
        )

    def id_named(self, path: str) -> str | None:
        """A notice when this numeric column is named as an id is (`id`, `customer_id`, `userId`, `ID`)
        and does not rise with every row (`row_number` says so of one that does): its numbers name
        rows, they measure nothing."""
        if not self.numeric or self.fixed is not None or self.is_date or not _ID_NAME.search(self.name):
            return None
        return (
            f"{path}: column {self.name!r} is named as an id is, and is read as a number: an id names a row and "
            f"measures nothing, so a model can only memorise it: {tabular.drop_hint(self.name)}, unless it means "
            "something"
        )

    def merge(self, other: ColumnFit, offset: int) -> None:
        """Add another file's pass 1 of the same column, its rows after this one's (`offset` is
        added to its row numbers: the first bad cell stays the first in the files' order). A
        column numeric in one file and text in another is `flipped`: pass 1 starts again with it
        read as text, as for one file."""
        if self.numeric != other.numeric and self.fixed is None:
            self.numeric, self.flipped = False, True
        self.flipped = self.flipped or other.flipped
        self.blocks += other.blocks
        self.train_gaps += other.train_gaps
        if not self._merge_dates(other):
            self.median.merge(other.median)
        self.levels.merge(other.levels)
        self.bad += other.bad
        self.cells += other.cells
        self.numberlike += other.numberlike
        self.marked += other.marked
        self.written |= other.written
        self.date_cells += other.date_cells
        self.date_gaps += other.date_gaps
        self.timed = self.timed or other.timed
        self._add_unseen(other.unseen, other.unseen_rows, other.read)
        self.words += other.words
        self.word_cells += other.word_cells
        self.moments.merge(other.moments)
        self.far = [a + b for a, b in zip(self.far, other.far)]
        if self.rising is None or other.rising is None:
            self.rising = None
        elif self.rising and other.rising:
            ahead = other.rising[0] > self.rising[1]
            self.rising = [self.rising[0], other.rising[1]] if ahead else None
        else:
            self.rising = self.rising or other.rising
        if self.first_text is None and other.first_text is not None:
            row, where, cell = other.first_text
            self.first_text = (row + offset, where, cell)
        if self.first_bad is None and other.first_bad is not None:
            row, where, cell, finite = other.first_bad
            self.first_bad = (row + offset, where, cell, finite)

    def _merge_dates(self, other: ColumnFit) -> bool:
        """Add another file's date shape (a date column still when both write dates one way and
        their fields leave one order); True when the dates' medians were merged here, in the order
        both files' fields decide (while they leave it open, in either)."""
        mine, theirs = self.date_shape, other.date_shape
        clock = same_clock(mine.clock, theirs.clock)
        self.dates = self.dates and other.dates and not (mine.sep and theirs.sep and mine.sep != theirs.sep)
        self.dates = self.dates and clock is not None
        if not self.dates or clock is None:
            return False
        sep = mine.sep or theirs.sep
        self.date_shape = DateShape(sep, max(mine.first, theirs.first), max(mine.second, theirs.second), clock)
        if sep in ("", "iso") or self.fixed is not None:
            return False
        order = self._settled_order()
        if not self.dates:
            return False
        orders = [order] if order else ["month_first", "day_first"]
        merged = {o: self._median_in(o) for o in orders}
        for o in orders:
            merged[o].merge(other._median_in(o))
        self.median_order = order or DATE_ORDER_UNTOLD[sep]
        self.median = merged[self.median_order]
        self.median_other = (
            None if order else merged["day_first" if self.median_order == "month_first" else "month_first"]
        )
        return True

    def date_notice(self) -> str:
        """How a date column's cells were read, for prepare's notice: ISO, or the day-month order
        taken and why (the fields seen, the order told, or the separator's default)."""
        form = self.date_format
        if form is None:
            return ""
        shape = self.date_shape
        if self.fixed is not None:
            return f"written {form} as the pipeline's"
        if shape.sep in NAMED_STYLES:
            return f"written {form}"
        if shape.first > 12:
            return f"written {form}: a first field above 12 is a day"
        if shape.second > 12:
            return f"written {form}: a second field above 12 is a day"
        if self.date_order is not None:
            return f"written {form}, as --date-order told"
        other = "day_first" if self.median_order == "month_first" else "month_first"
        by = "Excel's US" if shape.sep == "/" else "the European"
        return (
            f"written {form} as {by} default: no day or month above 12 tells which comes first; "
            f'--date-order {other} (a job\'s dataset: "date_order": "{other}") reads {date_form(shape.sep, other, shape.clock)}'
        )

    def transform(self, impute: bool) -> ColumnTransform:
        """The column's transform from the train split; a numeric column's imputed median is NaN
        until the second pass settles it (`median.value()`)."""
        if self.fixed is not None:
            return self.fixed
        if self.is_date:
            parts = [p for p in tabular.DATE_FEATURES if p != "hour" or self.timed]
            fill = math.nan if impute else None
            return ColumnTransform(
                name=self.name,
                kind="date",
                levels=parts,
                fill=fill,
                indicator=impute and self.date_gaps > 0,
                date_format=self.date_format,
            )
        indicator = impute and self.train_gaps > 0
        if self.numeric:
            return ColumnTransform(
                name=self.name, kind="numeric", fill=math.nan if impute else None, indicator=indicator
            )
        if self.is_text:  # an empty cell has no words (fill ""; None: refused)
            return ColumnTransform(
                name=self.name,
                kind="text",
                buckets=tabular.TEXT_BUCKETS,
                fill="" if impute else None,
                indicator=indicator,
            )
        levels, counts = self.levels.sorted()
        common = levels[int(np.argmax(counts))] if impute and levels else None  # ties: the first in sorted order
        if len(levels) <= tabular.MAX_ONEHOT_LEVELS:
            return ColumnTransform(name=self.name, kind="onehot", levels=levels, fill=common, indicator=indicator)
        return ColumnTransform(
            name=self.name, kind="hash", buckets=tabular.HASH_BUCKETS, fill=common, indicator=indicator
        )


class TableFit:
    """Pass 1 over a table: `add` each split block, then `finish`."""

    def __init__(
        self,
        path: str,
        label: str,
        features: Sequence[str],
        opts: SourceOptions,
        spec: FeatureSpec | None = None,
        text: set[str] | frozenset[str] = frozenset(),
    ):
        self.path = path
        self.impute = opts.missing == "impute"
        self.labels = LabelFit(path, label, opts.task, spec, label in text)
        keep = max(4096, MEDIAN_NUMBERS // max(1, len(features)))
        if spec is not None and spec.columns is not None:
            self.columns = [ColumnFit(t.name, t, False, keep) for t in spec.columns]
            trained = drift.trained(spec.columns, spec.normalization)
            for c in self.columns:
                c.trained = trained.get(c.name)
            self.refused = {t.name for t in spec.columns if t.fill is None}
        else:
            self.columns = [ColumnFit(name, None, name not in text, keep, opts.date_order) for name in features]
            self.refused = set() if self.impute else set(features)
        # a column that gives the label away (told, not refused); a pipeline's later versions were told at their first
        self.leaks = LabelLeaks(label, [c.name for c in self.columns]) if spec is None else None
        self.rows = 0
        self.train_rows = 0
        self.span = 0  # the largest row number read: where another file's rows start in `merge`
        self.totals: str | None = None  # the file's last row, when it is a labelled totals row: where, and why

    @property
    def flipped(self) -> set[str]:
        """Columns read as numbers in earlier blocks that hold text (the label too, when rows were
        left out for a missing marker in it: `LabelFit.flipped`): pass 1 must start again."""
        label = {self.labels.name} if self.labels.flipped else set()
        return {c.name for c in self.columns if c.flipped} | label

    def add(self, block: Block, val: np.ndarray, train: np.ndarray) -> None:
        in_train = np.zeros(len(block), bool)
        in_train[train] = True
        self.labels.add(block, val, train)
        first: tuple[int, str] | None = None  # the first empty cell refused, in file order
        for c in self.columns:
            gaps = c.add(block, in_train)
            if c.name in self.refused and gaps.any():
                i = int(np.argmax(gaps))
                first = (i, c.name) if first is None or i < first[0] else first
        if first is not None:
            raise tabular.missing_refused(_empty(block, *first))
        if self.leaks is not None:
            self.leaks.add(block, train, {c.name for c in self.columns if c.numeric})
        self.rows += len(block)
        self.train_rows += len(train)
        self.span = max(self.span, int(block.rows[-1])) if len(block) else self.span
        if block.csv and len(block):  # the file's last row so far: a spreadsheet's totals row?
            self.totals = _totals_row(block, self.labels.name)

    def merge(self, other: TableFit) -> None:
        """Add another file's pass 1 (the same columns; its rows after this one's): the statistics
        one pass over both files' rows would have, up to float rounding (a Distributed Map's
        children fit one part each, smlt.runtime.data.parts)."""
        names, theirs = [c.name for c in self.columns], [c.name for c in other.columns]
        if names != theirs:
            raise InvalidDataset(f"{other.path}: columns {theirs} differ from {self.path}'s {names}")
        self.labels.merge(other.labels)
        if self.leaks is not None and other.leaks is not None:
            self.leaks.merge(other.leaks)
        for mine, their in zip(self.columns, other.columns):
            mine.merge(their, self.span)
        self.rows += other.rows
        self.train_rows += other.train_rows
        self.span += other.span
        self.totals = self.totals or other.totals

    def refuse_totals(self) -> None:
        """A table whose last row sums the rows above it (`Total`, `Sum`, ...: a spreadsheet's totals
        row saved with the table) and has a label: as a row of data it would be trained on."""
        if self.totals is not None:
            raise InvalidDataset(
                f"{self.totals}: the table's last row is a totals row, not a row of data (a spreadsheet's sum of "
                "the rows above it, saved with them); delete it from the file and prepare again"
            )

    def refuse_unlabelled(self) -> None:
        """Too few rows with a label left, the others left out (`LabelFit.refuse_too_few`)."""
        self.labels.refuse_too_few(self.rows)

    def refuse_non_finite(self) -> None:
        """The first NaN, Inf or beyond-float32 number of a numeric column, in file order, with
        how many rows of its column (and of the others) are so: a NaN feature makes a worker's
        loss NaN."""
        found = [c for c in self.columns if c.numeric and c.first_bad is not None]
        if not found:
            return
        first = min(found, key=lambda c: c.first_bad[0] if c.first_bad else 0)
        assert first.first_bad is not None
        _, where, cell, finite = first.first_bad
        others = [f"{c.name!r} ({c.bad})" for c in found if c is not first]
        also = f"; also column {', '.join(others)}" if others else ""
        raise tabular.not_finite(where, cell, finite, first.bad, self.rows, first.name, also)

    def far_from_features(self) -> list[str]:
        """With a pipeline's features: a warning per number column (and a regression's target)
        whose values are far from the recorded standardisation (drift.far_notice)."""
        spec = self.labels.spec
        if spec is None:
            return []
        whose = f"the pipeline's features (generation {spec.generation})"
        found = [
            drift.far_notice(
                self.path, f"column {c.name!r}", *_moments(c.moments), c.far, *c.trained, whose, PIPELINE_TODO
            )
            for c in self.columns
            if c.trained is not None
        ]
        found.append(self.labels.target_notice(whose))
        return [note for note in found if note]

    def empty(self, c: ColumnFit) -> bool:
        """Whether a column (not a pipeline's, whose features are fixed) has no cell in the train split's
        rows (a spreadsheet's column with a header and nothing below it, a Parquet column of nulls): it
        is left out, and `transforms` says so (imputed, it would be a constant; a column of nulls has no
        value to impute)."""
        return c.fixed is None and self.train_rows > 0 and c.train_gaps >= self.train_rows

    def transforms(self, task: str) -> list[ColumnTransform]:
        from smlt.runtime.progress import notice

        empty = [c.name for c in self.columns if self.empty(c)]
        if empty:
            shown = ", ".join(repr(n) for n in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
            notice.info(
                f"{self.path}: column{'s' * (len(empty) > 1)} {shown} {'are' if len(empty) > 1 else 'is'} empty in "
                f"every row of the train split: left out (nothing to learn from {'them' if len(empty) > 1 else 'it'})"
            )

        unlabelled = self.labels.unlabelled_notice(self.rows)
        if unlabelled:
            notice.warning(unlabelled)
        for c in self.columns:
            for told in (
                c.markers_read(self.path),
                c.mostly_numbers()
                or c.mostly_distinct(self.path)
                or c.row_number(self.path, self.rows)
                or c.id_named(self.path),
            ):
                if told:
                    notice.info(told)
            unseen = c.unseen_levels(self.path)
            if unseen:
                notice.warning(unseen)
        transforms = [c.transform(self.impute) for c in self.columns]
        for told in self.far_from_features():
            notice.warning(told)
        for t in transforms:
            if t.kind == "onehot" and t.levels:
                _tell_case_variants(self.path, f"column {t.name!r}", t.levels, "levels")
        for t in transforms:
            if t.kind == "text":
                notice.info(
                    f"{self.path}: column {t.name!r} read as free text: its words hashed into {t.buckets} features"
                )
        dates = [(c, t) for c, t in zip(self.columns, transforms) if t.kind == "date"]
        if dates:
            said = "; ".join(
                f"{t.name!r}: {', '.join(tabular.DATE_MEANING[p] for p in t.levels)}"
                + (f", {c.date_notice()}" if c.date_notice() else "")
                for c, t in dates
            )
            notice.info(f"{self.path}: date column{'s' * (len(dates) > 1)} read as features ({said})")
        for told in self.leaks.notices(self.path, task) if self.leaks is not None else []:
            notice.warning(told)
        return transforms
