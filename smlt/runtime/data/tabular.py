"""Tabular sources with named columns (CSV, Parquet): the label column, the task, and one
ColumnTransform per feature column fitted on the train split.

Numeric columns stay numbers; text columns are one-hot encoded when the train split has few
levels and hashed into a fixed number of buckets otherwise (Cirrus's preprocessing). An empty cell
or null is imputed from the train split (median / most frequent) with a 0/1 indicator feature, or
refused with the column and the row named. `apply_columns` is the one place the recorded
transforms turn rows into the stored features: prepare uses it, and so can later data.
"""

from __future__ import annotations

import csv
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smlt.runtime.data.arrays import FIX_ROWS, FLOAT32_MAX, standardise
from smlt.runtime.data.manifest import ColumnTransform, Manifest
from smlt.runtime.data.options import Task
from smlt.runtime.errors import InvalidDataset

# A text column with at most this many distinct values in the train split is one-hot encoded;
# more are hashed into HASH_BUCKETS features.
MAX_ONEHOT_LEVELS = 16
HASH_BUCKETS = 32
# Columns taken as the label when none is named, in this order (else the last column).
LABEL_NAMES = ("label", "target", "y")
# More distinct labels than this and a CSV's task must be named: integer-valued prices or counts
# would otherwise become hundreds of one-row classes. Labels written as decimals ("151.0") look
# like a quantity sooner, but "0.0"/"1.0" flags are still classes.
MAX_INFERRED_CLASSES = 100
MAX_INFERRED_DECIMAL_CLASSES = 10


@dataclass
class Table:
    """A source's rows, column by column: text cells as str arrays ("" = empty), typed numbers
    as float64 (NaN = null). `rows` says where each row came from, for messages."""

    path: str
    columns: dict[str, np.ndarray]
    rows: np.ndarray  # CSV line numbers, or Parquet row numbers (1-based)
    unit: str = "line"  # "line" (CSV) or "row" (Parquet)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, index: np.ndarray) -> Table:
        return Table(self.path, {k: v[index] for k, v in self.columns.items()}, self.rows[index], self.unit)

    def where(self, i: int, column: str) -> str:
        return f"{self.path}: column {column!r}, {self.unit} {int(self.rows[i])}"


def read_table(path: str | Path) -> Table:
    """A .csv (with a header) or .parquet file as a Table."""
    path = Path(path)
    if path.suffix.lower() in (".parquet", ".pq"):
        return _read_parquet(path)
    return _read_csv(path)


def _read_csv(path: Path) -> Table:
    try:
        # utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark, which is not the first column's name
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            body, lines = [], []
            for r in reader:
                if r:  # blank lines are not rows
                    body.append(r)
                    lines.append(reader.line_num)
    except UnicodeDecodeError as e:
        raise InvalidDataset(f"{path}: not UTF-8 text (byte {e.start}); save the CSV as UTF-8") from None
    if not body:
        raise InvalidDataset(f"{path}: a CSV dataset needs a header and at least one row")
    _check_header(path, header)
    for line, r in zip(lines, body):
        if len(r) != len(header):
            raise InvalidDataset(f"{path}: line {line} has {len(r)} values, the header {len(header)}")
    cols = {name: np.char.strip(np.array(cells, dtype=str)) for name, cells in zip(header, zip(*body))}
    return Table(str(path), cols, np.array(lines, np.int64), "line")


def _read_parquet(path: Path) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise InvalidDataset(f"{path}: not a readable Parquet file ({e})") from None
    _check_header(path, table.column_names)
    cols = {}
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            cols[name] = col.cast(pa.float64()).to_numpy()  # nulls -> NaN
        else:
            cols[name] = np.array(["" if v is None else str(v) for v in col.to_pylist()], dtype=str)
    if table.num_rows == 0:
        raise InvalidDataset(f"{path}: a Parquet dataset needs at least one row")
    return Table(str(path), cols, np.arange(1, table.num_rows + 1), "row")


def _check_header(path: Path, header: Sequence[str]) -> None:
    seen = set()
    for name in header:
        if name in seen:
            raise InvalidDataset(f"{path}: column {name!r} appears twice in the header")
        seen.add(name)


def missing(cells: np.ndarray) -> np.ndarray:
    """Where a column's cells are empty (text) or null (typed numbers)."""
    return np.isnan(cells) if cells.dtype.kind == "f" else cells == ""


def _numbers(cells: np.ndarray) -> np.ndarray | None:
    """The cells as float64 when every one is a number, else None."""
    if cells.dtype.kind == "f":
        return cells
    try:
        return cells.astype(np.float64)
    except ValueError:
        return None


def _not_a_number(table: Table, column: str, cells: np.ndarray, why: str = "") -> InvalidDataset:
    bad = next(i for i, c in enumerate(cells) if _numbers(np.array([c])) is None)
    return InvalidDataset(f"{table.where(bad, column)}: {str(cells[bad])!r} is not a number{why}")


# --- the label -------------------------------------------------------------------------------


def pick_label(table: Table, label: str | None) -> str:
    """The label column: the one named, else one called label/target/y, else the last (said)."""
    names = list(table.columns)
    if label is not None:
        if label not in table.columns:
            raise InvalidDataset(f"{table.path}: no label column {label!r}; the columns are {', '.join(names)}")
        return label
    for name in LABEL_NAMES:
        if name in table.columns:
            return name
    from smlt.runtime.progress import notice  # local-only (not in the Lambda layer), as preparing is

    notice.info(
        f"{table.path}: no label column named (--label or the job's dataset.label): using the last, {names[-1]!r}"
    )
    return names[-1]


def labels(table: Table, column: str, task: Task | None) -> tuple[np.ndarray, Task]:
    """(the label column's values, the task): numbers when every label is one, else text classes.
    An empty label is an error naming its row, whatever `missing` says."""
    cells = table.columns[column]
    gaps = np.flatnonzero(missing(cells))
    if len(gaps):
        raise InvalidDataset(f"{table.where(gaps[0], column)} is empty: every row needs a label")
    y = _numbers(cells)
    if y is None:
        if task == "regression":
            raise _not_a_number(table, column, cells, " (task is regression)")
        return cells, "classification"
    written_as_floats = cells.dtype.kind == "f" or any(not t.lstrip("+-").isdigit() for t in cells)
    return y, task or _infer_task(table.path, column, written_as_floats, y)


def _infer_task(path: str, column: str, written_as_floats: bool, y: np.ndarray) -> Task:
    """Regression for fractional labels, classification for whole numbers with few distinct values
    (fewer still when written as decimals); anything in between is refused rather than guessed."""
    if not np.all(y == np.round(y)):
        return "regression"
    n = len(np.unique(y))
    if n > (MAX_INFERRED_DECIMAL_CLASSES if written_as_floats else MAX_INFERRED_CLASSES):
        raise InvalidDataset(
            f"{path}: label column {column!r} has {n} distinct whole-number values"
            + (" written as decimals" if written_as_floats else "")
            + ": pass --task regression for a quantity, or --task classification if each value is a class"
        )
    return "classification"


# --- the feature columns ---------------------------------------------------------------------


def refuse_missing(table: Table, names: Sequence[str]) -> None:
    """InvalidDataset naming the first row (in the table's order: the file's, before any split)
    with an empty cell among `names`, and its column."""
    first: tuple[int, str] | None = None
    for name in names:
        gaps = np.flatnonzero(missing(table.columns[name]))
        if len(gaps):
            i = int(gaps[0])
            if first is None or table.rows[i] < table.rows[first[0]]:
                first = (i, name)
    if first is not None:
        raise InvalidDataset(
            f"{table.where(*first)} is empty: missing values are refused "
            "(impute them from the train split with --missing impute, the job's dataset.missing)"
        )


def refuse_non_finite(table: Table, names: Sequence[str]) -> None:
    """InvalidDataset naming the first cell (in the file's order, before any split) among the
    numeric columns `names` that is NaN, Inf or too large for a float32 feature, with how many
    rows of its column (and of the others) are so: a NaN feature makes a worker's loss NaN."""
    found: list[tuple[int, str, np.ndarray, np.ndarray, np.ndarray]] = []
    for name in names:
        cells = table.columns[name]
        gaps = missing(cells)
        values = _numbers(np.where(gaps, "nan", cells) if cells.dtype.kind != "f" else cells)
        if values is None:
            continue  # a text column: encoded as levels or buckets, always finite
        bad = _not_finite(values, gaps)
        if len(bad):
            first = int(bad[np.argmin(table.rows[bad])])
            found.append((int(table.rows[first]), name, cells, values, bad))
    if found:
        _, name, cells, values, bad = min(found, key=lambda f: f[0])
        others = [f"{f[1]!r} ({len(f[4])})" for f in found if f[1] != name]
        also = f"; also column {', '.join(others)}" if others else ""
        raise _not_finite_error(table, name, cells, values, bad, also)


def _not_finite(values: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Rows whose number is NaN, Inf or beyond a float32 (which would store it as Inf)."""
    with np.errstate(invalid="ignore"):  # NaN compares False
        return np.flatnonzero(~(np.abs(values) <= FLOAT32_MAX) & ~gaps)


def _not_finite_error(
    table: Table, name: str, cells: np.ndarray, values: np.ndarray, bad: np.ndarray, also: str = ""
) -> InvalidDataset:
    first = int(bad[np.argmin(table.rows[bad])])
    big = " within ±3.4e38 (a float32 feature)" if np.isfinite(values[first]) else ""
    return InvalidDataset(
        f"{table.where(first, name)}: {str(cells[first])!r} is not a finite number{big}; "
        f"{len(bad)} of {len(table)} rows of column {name!r} are not{also}: {FIX_ROWS}"
    )


def fit_columns(train: Table, features: Sequence[str], impute: bool) -> list[ColumnTransform]:
    """One transform per feature column, from the train split alone."""
    return [_fit(name, train.columns[name], impute) for name in features]


def _fit(name: str, cells: np.ndarray, impute: bool) -> ColumnTransform:
    gaps = missing(cells)
    present = cells[~gaps]
    indicator = impute and bool(gaps.any())
    values = _numbers(present)
    if values is not None:
        fill = (float(np.median(values)) if len(values) else 0.0) if impute else None
        return ColumnTransform(name=name, kind="numeric", fill=fill, indicator=indicator)
    levels, counts = np.unique(present, return_counts=True)
    common = str(levels[np.argmax(counts)]) if impute else None  # ties: the first in sorted order
    if len(levels) <= MAX_ONEHOT_LEVELS:
        return ColumnTransform(name=name, kind="onehot", levels=levels.tolist(), fill=common, indicator=indicator)
    return ColumnTransform(name=name, kind="hash", buckets=HASH_BUCKETS, fill=common, indicator=indicator)


def width(t: ColumnTransform) -> int:
    """Features one column becomes."""
    own = {"numeric": 1, "onehot": len(t.levels), "hash": t.buckets}[t.kind]
    return own + int(t.indicator)


def feature_names(columns: Sequence[ColumnTransform]) -> list[str]:
    """The column each stored feature comes from, one name per feature."""
    return [t.name for t in columns for _ in range(width(t))]


def encode_columns(columns: Sequence[ColumnTransform], rows: Table) -> np.ndarray:
    """The columns' features before standardisation, float32 (rows, sum of widths)."""
    absent = [t.name for t in columns if t.name not in rows.columns]
    if absent:
        raise InvalidDataset(
            f"{rows.path}: no column {', '.join(map(repr, absent))}; the columns are {', '.join(rows.columns)}"
        )
    refuse_missing(rows, [t.name for t in columns if t.fill is None])  # prepared with missing: refuse
    out = np.zeros((len(rows), sum(width(t) for t in columns)), np.float32)
    at = 0
    for t in columns:
        cells = rows.columns[t.name]
        gaps = missing(cells)
        n = width(t) - int(t.indicator)
        out[:, at : at + n] = _encode(t, cells, gaps, rows)
        if t.indicator:
            out[:, at + n] = gaps
        at += width(t)
    return out


def _encode(t: ColumnTransform, cells: np.ndarray, gaps: np.ndarray, rows: Table) -> np.ndarray:
    if t.kind == "numeric":
        filled = np.where(gaps, "nan", cells) if cells.dtype.kind != "f" else cells
        values = _numbers(filled)
        if values is None:
            raise _not_a_number(rows, t.name, filled)
        bad_values = _not_finite(values, gaps)
        if len(bad_values):
            raise _not_finite_error(rows, t.name, cells, values, bad_values)
        return np.where(gaps, t.fill if t.fill is not None else 0.0, values)[:, None]
    text = cells.astype(str) if cells.dtype.kind == "f" else cells
    text = np.where(gaps, str(t.fill), text)
    if t.kind == "onehot":
        return text[:, None] == np.asarray(t.levels, dtype=str)[None, :]  # an unseen level: all zeros
    uniques, inverse = np.unique(text, return_inverse=True)
    buckets = np.array([zlib.crc32(u.encode()) % t.buckets for u in uniques], np.int64)[inverse]
    onehot = np.zeros((len(text), t.buckets), np.float32)
    onehot[np.arange(len(text)), buckets] = 1.0
    return onehot


def apply_columns(manifest: Manifest, rows: Table) -> np.ndarray:
    """Rows of a tabular source as the shards store them: the manifest's column transforms, then
    its per-feature standardisation. The label column, if present, is ignored."""
    if manifest.columns is None:
        raise InvalidDataset(f"{manifest.name} was not prepared from named columns (CSV or Parquet)")
    return standardise(encode_columns(manifest.columns, rows), manifest.normalization)
