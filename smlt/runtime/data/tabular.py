"""Tabular sources with named columns (CSV, Parquet): the label column, and one ColumnTransform per
feature column (fitted on the train split by smlt.runtime.data.table_fit, as prepare streams the
file).

A column is numeric when every cell is a number or empty (a missing marker such as `NA` is an
empty cell there: table_reader.Block.number_text); a text column whose every present cell is an
ISO-8601 date, or a date as spreadsheets write one in the column's recorded format (day-month
order, month names, 12-hour times: ColumnTransform.date_format), or a Parquet date/timestamp column, is a date column, its features days since
1970-01-01, month, day of the week and, when it has times, the hour (`date_features`); other text
columns are one-hot encoded when the train split has few levels and hashed into a fixed number of
buckets otherwise (Cirrus's preprocessing), unless they are free text (`is_free_text`: many distinct
values, at least TEXT_MIN_WORDS words with a letter a cell on average), whose cells become a bag of
hashed words (`text_features`). An empty cell or null is imputed from the train split (the
median, a date column's median date, the most frequent text; free text: no words) with a 0/1
indicator feature, or refused with the column and the row named. `encode_columns` is the one
place the recorded transforms turn rows into features: prepare uses it block by block, and
`apply_columns` (later data) adds the recorded standardisation. A one-hot column's value that is
none of its levels (`unseen_values`) is encoded as none of them: `smlt predict` and a pipeline's
later versions say so.
"""

from __future__ import annotations

import difflib
import json
import shlex
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from smlt.runtime.data.arrays import FIX_ROWS, FLOAT32_MAX, standardise
from smlt.runtime.data.manifest import ColumnTransform, Manifest
from smlt.runtime.data.table_reader import date_example, parse_dates, unnamed
from smlt.runtime.errors import InvalidDataset

if TYPE_CHECKING:
    from smlt.runtime.data.table_reader import Block

# A text column with at most this many distinct values in the train split is one-hot encoded;
# more are hashed into HASH_BUCKETS features.
MAX_ONEHOT_LEVELS = 16
HASH_BUCKETS = 32
# Such a column whose present train cells hold at least TEXT_MIN_WORDS words with a letter on
# average (LETTERED, separated by spaces: a date, a time, a number or a code of digits is no such
# word, and an id, an e-mail address or a URL written without spaces is one) is free text (a
# review, a description): each cell's words (WORD: runs of Unicode letters, marks, digits and
# underscores, as Python's `\w+` but with combining marks kept in their word, as Devanagari's are;
# lower-cased a character at a time, pyarrow's utf8_lower: `İ` is `i`, a final `Σ` is `σ`),
# hashed into TEXT_BUCKETS features holding log1p of each bucket's count. 512 buckets: the
# shards hold dense float32 rows, so a text column costs 2 KB a row (100k reviews, 12 MB of CSV:
# 197 MB of shards) and 512 x hidden weights in the model's first layer; more buckets buy fewer
# collisions at that price, which matters when the words that carry the label are many and rare
# (logistic regression on 20k synthetic reviews of 5,600 distinct words, 600 of them the label's:
# validation accuracy 0.63 at 512, 0.69 at 1024, 0.81 at 2048, 0.84 at 4096 buckets; on a few
# dozen strong words, 0.92 at 512 already).
TEXT_MIN_WORDS = 3
TEXT_BUCKETS = 512
# RE2 (pyarrow.compute), (Unicode, ASCII): pyarrow compiles a pattern at every call, and the
# Unicode classes take 1.5 ms (WORD) to 4 ms (LETTERED) a call, per column and block: an array of
# ASCII text (the same words) takes the ASCII patterns, 0.01 ms.
WORD = (r"[\p{L}\p{M}\p{N}_]+", r"[A-Za-z0-9_]+")
# LETTERED: a word is what spaces separate (`don't` is one, a UUID, an e-mail address or a URL too:
# ids, not text), and it has a letter.
LETTERED = (r"[^\s\p{Z}\p{L}]*\p{L}[^\s\p{Z}]*", r"[^\sA-Za-z]*[A-Za-z]\S*")
_NOT_WORD = (r"[^\p{L}\p{M}\p{N}_]+", r"[^A-Za-z0-9_]+")
# A first column so named is a data frame's index or row names (pandas' to_csv writes "", and
# "Unnamed: 0" once read and written again; R's write.csv ""; pyarrow from pandas
# "__index_level_0__"): left out of the features.
INDEX_NAMES = frozenset({"", "Unnamed: 0", "__index_level_0__"})
# Columns taken as the label when none is named, in this order (else the last column).
LABEL_NAMES = ("label", "target", "y")
# More distinct whole-number labels than this and a table's task must be named: ages, prices or
# counts would otherwise become dozens of thin classes. Labels written as decimals ("151.0") look
# like a quantity sooner, but "0.0"/"1.0" flags are still classes. Between the two limits the
# labels are classes, and prepare says how to make them a quantity.
MAX_INFERRED_CLASSES = 20
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

    def where(self, i: int, column: str) -> str:
        return f"{self.path}: column {column!r}, {self.unit} {int(self.rows[i])}"


def read_table(path: str | Path, numeric: Collection[str] | None = None, encoding: str | None = None) -> Table:
    """A whole .csv (with a header), .parquet or JSON Lines file as a Table (data to predict on:
    prepare streams a file in blocks instead). The `numeric` columns (a model's number columns;
    None: those whose every cell is a number or empty, as prepare would read this file) hold their text
    as a number column reads it (`Block.number_text`): "" for a missing marker (`NA`, ...), a
    point for a decimal comma; the others their text as written (`NA` a level). `encoding`: a
    delimited text file's when it is not UTF-8 and has no byte-order mark (`tables.open_table`)."""
    from smlt.runtime.data.tables import open_table

    file = open_table(path, encoding)
    blocks = list(file.blocks())
    if numeric is None:
        numeric = {name for name in file.columns if all(b.numbers(name) is not None for b in blocks)}
    columns = {name: _cells(blocks, name, name in numeric) for name in file.columns}
    return Table(file.path, columns, np.concatenate([b.rows for b in blocks]), file.unit)


def _cells(blocks: list[Block], name: str, numeric: bool) -> np.ndarray:
    if not numeric:
        return np.concatenate([b.column(name, numeric=False) for b in blocks])
    parsed = [b.numbers(name) for b in blocks if not b.csv]
    if parsed and all(p is not None for p in parsed):  # Parquet numbers: float64, NaN where null or NaN
        return np.concatenate([p[0] for p in parsed if p is not None])
    return np.concatenate(
        [np.asarray(b.number_text(name).fill_null("").to_numpy(zero_copy_only=False), dtype=str) for b in blocks]
    )


def no_column(where: str, names: Sequence[str], columns: Sequence[str]) -> InvalidDataset:
    """`names` (asked for by an option: `where` says which) are not among a file's `columns`."""
    close = _nearest(names[0], columns)
    hint = f" (did you mean {close!r}?)" if close else ""
    return InvalidDataset(f"{where}: no column {', '.join(map(repr, names))}{hint}; the columns are {_listed(columns)}")


def _nearest(name: str, columns: Sequence[str]) -> str | None:
    """The column a name asked for most likely means: the same but for end spaces and letter case (a
    spreadsheet's header cell `  price `), else difflib's closest."""
    same = [c for c in columns if c.strip().casefold() == name.strip().casefold()]
    close = same or difflib.get_close_matches(name, list(columns), n=1)
    return close[0] if close else None


def _listed(columns: Sequence[str]) -> str:
    """Column names for a message: quoted when one has spaces at an end (a spreadsheet's ` price `)."""
    padded = any(c != c.strip() for c in columns)
    return ", ".join(repr(c) if padded else c for c in columns)


def _case_hint(absent: Sequence[str], columns: Sequence[str]) -> str:
    """Which of the file's columns are the `absent` ones but for letter case or end spaces: a header
    retyped (`City` for `city`); names must match the training data's exactly, so say which to rename."""
    near = {c.strip().casefold(): c for c in columns}
    pairs = [(near[a.strip().casefold()], a) for a in absent if a.strip().casefold() in near]
    if not pairs:
        return ""
    said = ", ".join(f"{have!r} for {want!r}" for have, want in pairs)
    return f" (the file has {said}: column names must match the training data's exactly, letter case and spaces too)"


def drop_hint(name: str) -> str:
    """How to leave a column out of the features, for a notice that names one."""
    return f'leave it out with --drop {shlex.quote(name)} (a job\'s dataset: "drop": [{json.dumps(name)}])'


def case_variants(values: Collection[str]) -> list[list[str]]:
    """Groups of values that differ only in letter case or inner spaces (`Yes`, `yes`, `YES`;
    `New York`, `New  York`): one thing written several ways, or truly different values ('a' and 'A'
    are two letters). Told, never merged."""
    groups: dict[str, list[str]] = {}
    for v in values:
        groups.setdefault(" ".join(v.split()).casefold(), []).append(v)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def same_but_case(value: str, known: Collection[str]) -> str | None:
    """The one of `known` that `value` differs from only in letter case or spacing (`Rooms` and
    `rooms`, `rooms ` and `rooms`), or None: a later version's header or label written another way."""
    key = " ".join(value.split()).casefold()
    found = [k for k in known if k != value and " ".join(k.split()).casefold() == key]
    return found[0] if len(found) == 1 else None


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


def pick_label(path: str, names: Sequence[str], label: str | None) -> str:
    """The label column: the one named, else one called label/target/y, else the last (said)."""
    if label is not None:
        if label not in names:
            # a header cell with spaces at an end (`  price `) or in another case: the column to name
            close = _nearest(label, names)
            hint = (
                f" (did you mean {close!r}? name it exactly, spaces and case as the header has them)" if close else ""
            )
            raise InvalidDataset(f"{path}: no label column {label!r}{hint}; the columns are {_listed(names)}")
        return label
    for name in LABEL_NAMES:
        if name in names:
            return name
    from smlt.runtime.progress import notice

    notice.info(f"{path}: no label column named (--label or the job's dataset.label): using the last, {names[-1]!r}")
    return names[-1]


# --- the feature columns ---------------------------------------------------------------------


def refuse_missing(table: Table, names: Sequence[str]) -> None:
    """InvalidDataset naming the first row (in the table's order) with an empty cell among
    `names`, and its column."""
    first: tuple[int, str] | None = None
    for name in names:
        gaps = np.flatnonzero(missing(table.columns[name]))
        if len(gaps):
            i = int(gaps[0])
            if first is None or table.rows[i] < table.rows[first[0]]:
                first = (i, name)
    if first is not None:
        raise missing_refused(table.where(*first) + " is empty")


def missing_refused(empty: str) -> InvalidDataset:
    """`empty`: where an empty cell is, "... is empty" (table_fit says how a marker is written)."""
    return InvalidDataset(
        f"{empty}: missing values are refused "
        "(impute them from the train split with --missing impute, the job's dataset.missing)"
    )


def _not_finite(values: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Rows whose number is NaN, Inf or beyond a float32 (which would store it as Inf)."""
    with np.errstate(invalid="ignore"):  # NaN compares False
        return np.flatnonzero(~(np.abs(values) <= FLOAT32_MAX) & ~gaps)


def _not_finite_error(
    table: Table, name: str, cells: np.ndarray, values: np.ndarray, bad: np.ndarray
) -> InvalidDataset:
    first = int(bad[np.argmin(table.rows[bad])])
    finite = bool(np.isfinite(values[first]))
    return not_finite(table.where(first, name), str(cells[first]), finite, len(bad), len(table), name)


def not_finite(
    where: str, cell: str, finite: bool, count: int, total: int, name: str, also: str = ""
) -> InvalidDataset:
    """A column's first cell that is NaN, Inf or beyond a float32 (`finite`), and how many are."""
    big = " within ±3.4e38 (a float32 feature)" if finite else ""
    return InvalidDataset(
        f"{where}: {cell!r} is not a finite number{big}; "
        f"{count} of {total} rows of column {name!r} are not{also}: {FIX_ROWS}"
    )


def width(t: ColumnTransform) -> int:
    """Features one column becomes."""
    own = {"numeric": 1, "onehot": len(t.levels), "hash": t.buckets, "date": len(t.levels), "text": t.buckets}[t.kind]
    return own + int(t.indicator)


def feature_names(columns: Sequence[ColumnTransform]) -> list[str]:
    """The column each stored feature comes from, one name per feature."""
    return [t.name for t in columns for _ in range(width(t))]


def encode_columns(columns: Sequence[ColumnTransform], rows: Table) -> np.ndarray:
    """The columns' features before standardisation, float32 (rows, sum of widths)."""
    absent = [t.name for t in columns if t.name not in rows.columns]
    if absent:
        raise InvalidDataset(
            f"{rows.path}: no column {', '.join(map(repr, absent))}; the columns are "
            f"{_listed(list(rows.columns))}{_case_hint(absent, list(rows.columns))}"
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
    if t.kind == "date":
        days = cells if cells.dtype.kind == "f" else _days(rows, t.name, cells, gaps, t.date_format)
        fill = t.fill if isinstance(t.fill, float) else 0.0
        return date_features(np.where(gaps, fill, days), t.levels)
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
    if t.kind == "text":  # an empty cell has no words: all zeros (and its indicator)
        return text_features(np.where(gaps, "", text), t.buckets)
    text = np.where(gaps, str(t.fill), text)
    if t.kind == "onehot":
        return text[:, None] == np.asarray(t.levels, dtype=str)[None, :]  # an unseen level: all zeros (unseen_values)
    uniques, inverse = np.unique(text, return_inverse=True)
    buckets = np.array([zlib.crc32(u.encode()) % t.buckets for u in uniques], np.int64)[inverse]
    onehot = np.zeros((len(text), t.buckets), np.float32)
    onehot[np.arange(len(text)), buckets] = 1.0
    return onehot


# --- values a one-hot column never saw ---------------------------------------------------------

# Unseen values named in a notice, the most frequent first.
UNSEEN_NAMED = 3


def unseen_values(t: ColumnTransform, text: Any) -> dict[str, int]:
    """The values of a one-hot column's cells that are none of its levels, with how many cells
    hold each: `_encode` makes such a cell all zeros, which a model cannot tell from another
    unseen value nor learn. `text`: the cells as a pyarrow string array, null where empty (an
    empty cell is imputed or refused, never unseen). A hashed column (more than
    MAX_ONEHOT_LEVELS levels) gives any value a bucket: it has no unseen value. The one rule of
    `smlt predict` (`unseen_notices`) and a pipeline's later versions (table_fit.ColumnFit)."""
    if t.kind != "onehot":
        return {}
    import pyarrow as pa
    import pyarrow.compute as pc

    known = pc.is_in(text, value_set=pa.array(t.levels, text.type))
    new = pc.and_(pc.invert(known), pc.is_valid(text))
    if not pc.any(new).as_py():
        return {}
    counts = pc.value_counts(text.filter(new))
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))


def unseen_notice(where: str, name: str, counts: dict[str, int], cells: int, rows: int, whose: str) -> str:
    """A notice that `cells` of `rows` rows of one-hot column `name` hold values `whose` levels do
    not have (`counts`: some of them, by value), the most frequent named."""
    named = sorted(counts, key=lambda v: (-counts[v], v))[:UNSEEN_NAMED]
    more = len(counts) - len(named)
    said = ", ".join(map(repr, named)) + (
        f" and {more:,} more" if more else " and more" if sum(counts.values()) < cells else ""
    )
    return (
        f"{where}: column {name!r}: {cells:,} of {rows:,} rows hold values {whose} ({said}): "
        "encoded as none of its levels"
    )


def unseen_notices(columns: Sequence[ColumnTransform], rows: Table) -> list[str]:
    """A notice per one-hot column of `rows` holding values the model never saw in training."""
    unseen = TableUnseen(columns, list(rows.columns))
    unseen.add(rows)
    return unseen.notices(rows.path)


class TableUnseen:
    """`unseen_notices` for a table read block by block (`add` each block's rows, then
    `notices`): every unseen value's count over all the rows, so the notice is the one the
    rows read whole give."""

    def __init__(self, columns: Sequence[ColumnTransform], header: Sequence[str]):
        names = set(header)
        self.columns = [t for t in columns if t.kind == "onehot" and t.name in names]
        self.counts: dict[str, dict[str, int]] = {t.name: {} for t in self.columns}
        self.rows = 0

    def add(self, rows: Table) -> None:
        import pyarrow as pa

        self.rows += len(rows)
        for t in self.columns:
            cells = rows.columns[t.name]
            gaps = missing(cells)
            text = cells.astype(str) if cells.dtype.kind == "f" else cells  # as `_encode` reads them
            counts = self.counts[t.name]
            for value, n in unseen_values(t, pa.array(text, pa.string(), mask=gaps)).items():
                counts[value] = counts.get(value, 0) + n

    def notices(self, where: str) -> list[str]:
        told = []
        for t in self.columns:
            counts = self.counts[t.name]
            if counts:
                n = sum(counts.values())
                told.append(unseen_notice(where, t.name, counts, n, self.rows, "the model never saw in training"))
        return told


def unused_columns(columns: Sequence[ColumnTransform], rows: Table, also: Collection[str] = ()) -> list[str]:
    """The columns of `rows` that none of the model's `columns` reads, but for `also` (the label,
    an id column), a data frame's index or row names (INDEX_NAMES, a first column) and columns
    without a name (`table_reader.unnamed`)."""
    used = {t.name for t in columns} | set(also)
    names = list(rows.columns)
    return [n for i, n in enumerate(names) if n not in used and not (i == 0 and n in INDEX_NAMES) and not unnamed(n)]


def is_free_text(levels: int, words: int, cells: int) -> bool:
    """Whether a text column (not numbers, not dates) with `levels` distinct values in the train
    split, whose `cells` present train cells hold `words` words with a letter (`word_count`), is
    free text (kind "text")."""
    return levels > MAX_ONEHOT_LEVELS and cells > 0 and words >= TEXT_MIN_WORDS * cells


def word_count(text: Any) -> int:
    """The words with a letter (LETTERED) in a pyarrow string array's cells (nulls have none)."""
    import pyarrow.compute as pc

    return int(pc.sum(pc.count_substring_regex(text, LETTERED[_ascii(text)])).as_py() or 0)


def _ascii(text: Any) -> int:
    """1 when a pyarrow string array is ASCII text (or empty, or nulls), else 0: which of a
    pattern's two forms to use."""
    import pyarrow.compute as pc

    return int(pc.all(pc.string_is_ascii(text)).as_py() is not False)


def text_features(cells: np.ndarray, buckets: int) -> np.ndarray:
    """Free-text cells ("" for none) as a bag of hashed words, float32 (rows, buckets): each
    lower-cased WORD's bucket is `zlib.crc32` of its UTF-8 bytes mod `buckets`, each feature
    log1p of how many of the cell's words fell in it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pa.array(cells, pa.string())
    ascii = _ascii(text)
    split = pc.split_pattern_regex((pc.ascii_lower if ascii else pc.utf8_lower)(text), _NOT_WORD[ascii])
    words, rows = pc.list_flatten(split), pc.list_parent_indices(split)
    kept = pc.greater(pc.binary_length(words), 0)  # the empty strings before and after separators
    coded = words.filter(kept).dictionary_encode()
    vocab = np.array([zlib.crc32(w.encode()) % buckets for w in coded.dictionary.to_pylist()], np.int64)
    if not len(vocab):
        return np.zeros((len(cells), buckets), np.float32)
    at = rows.filter(kept).to_numpy().astype(np.int64) * buckets + vocab[coded.indices.to_numpy()]
    where, counts = np.unique(at, return_counts=True)
    out = np.zeros((len(cells), buckets), np.float32)
    out.reshape(-1)[where] = np.log1p(counts)
    return out


# A date column's features (ColumnTransform.levels of kind "date"), in this order; "hour" only
# when some cell of the column has a time of day.
DATE_FEATURES = ("days", "month", "weekday", "hour")
DATE_MEANING = {
    "days": "days since 1970-01-01",
    "month": "month 1-12",
    "weekday": "day of the week (Monday 0)",
    "hour": "hour 0-23",
}


def date_features(days: np.ndarray, parts: Sequence[str]) -> np.ndarray:
    """Dates (days since 1970-01-01, the time of day its fraction; NaN stays NaN in every
    feature) as the `parts` features, float64 (rows, len(parts))."""
    empty = np.isnan(days)
    whole = np.floor(np.where(empty, 0.0, days))
    out = np.empty((len(days), len(parts)))
    for k, part in enumerate(parts):
        if part == "days":
            out[:, k] = days
        elif part == "month":
            out[:, k] = whole.astype(np.int64).astype("datetime64[D]").astype("datetime64[M]").astype(np.int64) % 12 + 1
        elif part == "weekday":
            out[:, k] = (whole + 3) % 7  # 1970-01-01 was a Thursday
        else:  # hour; a hair added so that 10:00 is not 9.999... in floating point
            out[:, k] = np.minimum(np.floor((days - whole) * 24 + 1e-7), 23)
    out[empty] = np.nan
    return out


def _days(table: Table, column: str, cells: np.ndarray, gaps: np.ndarray, form: str | None) -> np.ndarray:
    """Text cells of a date column as days since 1970-01-01 (NaN where empty), or the named
    refusal of the first that is not a date as the column's are written (`form`: None, ISO 8601)."""
    import pyarrow as pa

    parsed = parse_dates(pa.array(cells, pa.string(), mask=gaps), form)
    if parsed is not None:
        return parsed[0]
    bad = next(i for i, c in enumerate(cells) if not gaps[i] and parse_dates(pa.array([c], pa.string()), form) is None)
    raise InvalidDataset(f"{table.where(bad, column)}: {str(cells[bad])!r} is not a date {date_written(form)}")


DATE_WRITTEN = "(ISO 8601: 2024-03-17, 2024-03-17T10:05:00 or 2024-03-17 10:05:00)"


def date_written(form: str | None) -> str:
    """How a date column's cells are to be written (`form`: a ColumnTransform.date_format), for a refusal."""
    if form is None:
        return DATE_WRITTEN
    date, timed, seconds = date_example(form)
    return f"(written {form} as the column's other dates: {date}, {timed} or {seconds})"


def apply_columns(manifest: Manifest, rows: Table) -> np.ndarray:
    """Rows of a tabular source as the shards store them: the manifest's column transforms, then
    its per-feature standardisation. The label column, if present, is ignored."""
    if manifest.columns is None:
        raise InvalidDataset(f"{manifest.name} was not prepared from named columns (CSV or Parquet)")
    return standardise(encode_columns(manifest.columns, rows), manifest.normalization)
