"""CSV and Parquet files read in blocks of bounded size, whatever the file's: what `smlt data
prepare` streams through twice (statistics, then shards) and `read_table` concatenates (JSON
Lines files too: smlt.runtime.data.jsonl_reader makes the same blocks of text cells).

A CSV is cut into blocks of about BLOCK_BYTES at record boundaries (newlines outside quotes) and
each block is parsed by pyarrow's CSV reader, single-threaded, every cell as text; the line where
each row ends is kept for messages (blank lines are not rows). Cells are separated by commas, or by
the semicolons, tabs or bars of a header that has none outside quotes (a spreadsheet saved in a
comma-decimal locale writes semicolons; in such a file a column of `0,346` is numbers). Its text
is UTF-8, or what a byte-order mark says (UTF-16 or UTF-32: Excel's "Unicode Text"), or the
encoding the user names (`encoding`: Windows-1252 for Excel's "CSV (Comma delimited)"), read as
UTF-8 as it streams (`open_text`); a file that is none of those is refused by the line and
character of its first byte that is not UTF-8 (`_not_utf8`), never guessed; a JSON Lines file's
text follows the same rules, read by the same code. A NUL byte, which no such text holds, is
refused (`refuse_nul`): UTF-16 without its byte-order mark named as such, a binary file by its
first bytes. A Parquet
file is read by record batches (pyarrow's `iter_batches`, one row group at a time); a column of
number lists (an embedding) is a column per element, `emb[0]`, `emb[1]`, ... (`vector_columns`,
`_spread`; a JSON Lines file's lists of numbers too). A block's cells stay Arrow arrays
until asked for as numbers (float64, NaN where a cell is empty), as dates (days since 1970-01-01,
`parse_dates`: ISO 8601, or `3/15/2024`, `15.03.2024`, ... in an order `date_shape`'s fields decide,
`15-Mar-2024`, `Mar 15, 2024`, ..., with 24-hour or AM/PM times) or as text (stripped, null where empty): numbers and dates cost a cast, not a
Python string per cell.

A text cell (a CSV's, a JSON Lines file's) that is a missing-value marker (MISSING_MARKERS: R
writes `NA`, Excel `#N/A`, a database `NULL`) is an empty cell when the column is read as numbers
(`number_text`): a column of numbers and markers is a number column with empty cells. Read as text
the marker is a level like any other (`NA` may be Namibia). `nan` is the number NaN, not a marker.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import csv
import gzip
import io
import lzma
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smlt.runtime.errors import InvalidDataset

# About this many bytes of CSV text per block (a row longer than that makes its block longer): a
# block costs about 60 MB with the arrays pyarrow and numpy make of it; 16 MiB blocks peaked
# 150 MB higher and were no faster.
BLOCK_BYTES = 4 << 20
# Rows per Parquet batch.
PARQUET_ROWS = 65_536
# pyarrow parses a block in pieces of this many bytes (4 MiB measured faster than 1 or 16 MiB).
_ARROW_BLOCK = 4 << 20
_BOM = b"\xef\xbb\xbf"
# Byte-order marks of other encodings than UTF-8 (UTF-32's first: its LE mark starts as UTF-16's).
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# Bytes of a transcoded file decoded at a time.
_TEXT_CHUNK = 1 << 20
_NEWLINE, _QUOTE, _CR = 10, 34, 13
_OTHER_DELIMITERS = ";\t|"
# Cells (stripped) that mean "no value" in a column of numbers, as R (`NA`), Excel (`#N/A`),
# databases (`NULL`) and pandas (`<NA>`, `None`) write one: the common ones of pandas' own list,
# without `nan`/`NaN`, which are the number NaN here (refused as not finite); and Excel's other
# error values, a formula's that failed (`#DIV/0!`), as its CSV and a workbook (smlt.runtime.data.workbook) hold them.
EXCEL_ERRORS = ("#DIV/0!", "#VALUE!", "#REF!", "#NAME?", "#NUM!", "#NULL!")
# `?` is how UCI's repository writes one (adult, heart-disease, breast-cancer-wisconsin's `.data` files).
MISSING_MARKERS = ("NA", "N/A", "n/a", "#N/A", "NULL", "null", "<NA>", "None", "?", *EXCEL_ERRORS)
# Characters a text cell may have for its column to be a fixed-width numpy str array (`Block.column`).
WIDE_CELL = 256
# A number as a spreadsheet formats it: grouped thousands, a currency sign before or after, a
# percent sign, parentheses for a negative (`1,234.50`, `$1,234.50`, `-$5`, `12 €`, `7.5%`, `(1,234)`; in a file not separated by commas,
# `1.234,50` or `1.234.567`). Read as the number without its marks (`7.5%` is 7.5): whole columns of
# them were text, hashed into buckets. In a comma file `1,234` is a thousand and more, as Excel
# writes it in English; in a comma-decimal file `1.234` stays 1.234. Thousands are also grouped by a
# no-break or narrow no-break space (French, `1 234,56`, as Excel in France writes it) or an
# apostrophe (Swiss, `1'234.56`), in a comma-decimal file by a space too, and a no-break space may
# stand before a percent or currency sign (`11,6 %`, `12 €`).
_SIGNS = "$€£¥"
_SPACE = "[\\s\u00a0\u202f]"  # a space, a no-break space, a narrow no-break space
_GROUPS = {
    False: "[,'\u00a0\u202f]",
    True: "['\u00a0\u202f ]",
}  # what separates groups of thousands, besides a comma file's
_DIGITS = {
    False: rf"(?:[0-9]{{1,3}}(?:{_GROUPS[False]}[0-9]{{3}})+|[0-9]+)(?:\.[0-9]+)?",
    True: rf"(?:[0-9]{{1,3}}(?:\.[0-9]{{3}})+,[0-9]+|[0-9]{{1,3}}(?:\.[0-9]{{3}}){{2,}}"
    rf"|[0-9]{{1,3}}(?:{_GROUPS[True]}[0-9]{{3}})+(?:,[0-9]+)?|[0-9]+(?:,[0-9]+)?)",
}
# A negative number as an accountant writes it, in parentheses (`(1,234.50)`, `$(5)`, `($5)`, `$ (5.00)`
# of Excel's accounting format), is that number negated.
_MARKED = {
    comma: rf"^(?:[+-]?[{_SIGNS}]?[+-]?{digits}(?:{_SPACE}?%|{_SPACE}?[{_SIGNS}])?"
    rf"|[{_SIGNS}]?{_SPACE}?\([{_SIGNS}]?{digits}(?:{_SPACE}?%|{_SPACE}?[{_SIGNS}])?\))$"
    for comma, digits in _DIGITS.items()
}
_MARKS = {False: f"[,'%\\s\u00a0\u202f{_SIGNS}]", True: f"[.'%\\s\u00a0\u202f{_SIGNS}]"}
_PARENTHESES = r"^\((.*)\)$"


# A text table (CSV, TSV, JSON Lines) may come compressed whole, as Spark, Firehose and pandas
# write it: `part-00000.csv.gz`. It is read as it streams, never unpacked to disk.
COMPRESSED: dict[str, Callable[[Any], Any]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile,
}


def table_suffix(path: str | Path) -> str:
    """The name's format suffix, lower case, a compression suffix left aside (`a.CSV.gz`: `.csv`)."""
    suffixes = [s.lower() for s in Path(str(path)).suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in COMPRESSED:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def is_compressed(path: str | Path) -> bool:
    return Path(str(path)).suffix.lower() in COMPRESSED


@contextlib.contextmanager
def open_bytes(path: Path) -> Iterator[tuple[Any, Any]]:
    """(the file's bytes as a stream, decompressed when its name says so; the file itself, whose
    position is how far into the file on disk the reading is: what progress reports)."""
    with path.open("rb") as raw:
        opener = COMPRESSED.get(path.suffix.lower())
        if opener is None:
            yield raw, raw
            return
        with opener(raw) as f:
            try:
                yield f, raw
            except (OSError, EOFError, lzma.LZMAError) as e:  # a damaged or truncated archive
                raise InvalidDataset(f"{path}: not a readable {path.suffix} file ({e})") from None


@contextlib.contextmanager
def open_text(path: Path, encoding: str | None = None) -> Iterator[tuple[Any, Any]]:
    """`open_bytes` of a text table (a CSV's, a JSON Lines file's: one rule for both), its text as
    UTF-8 bytes: as it is when it is UTF-8 (with or without its byte-order mark, which the reader
    leaves out), else decoded as it streams, in chunks (`_Transcoded`): by what its byte-order mark
    says (UTF-16, UTF-32), else by `encoding` (a codec's name, as `SourceOptions.encoding` reads
    it), else left as it is (UTF-8)."""
    with open_bytes(path) as (f, _):
        head = f.read(_CR_HEAD)
    marked = next((name for bom, name in _BOMS if head.startswith(bom)), None)
    told = marked or (None if head.startswith(_BOM) else encoding)
    # lines ended by a CR alone (Excel for Mac's "CSV (Macintosh)", classic Mac OS): read as ended by LF
    lone_cr = b"\r" in head and b"\n" not in head
    with open_bytes(path) as (f, raw):
        if told is not None and codecs.lookup(told).name != "utf-8":
            f = io.BufferedReader(_Transcoded(f, told, str(path), marked is not None), _TEXT_CHUNK)
        yield (io.BufferedReader(_CRLines(f), _TEXT_CHUNK) if lone_cr else f), raw


# Bytes of a text table's start looked at for its byte-order mark and its line ends.
_CR_HEAD = 1 << 16


class _CRLines(io.RawIOBase):
    """Text whose lines end with a CR alone, as text whose lines end with LF (a CR byte is never part
    of another UTF-8 character)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self._given = 0  # bytes read

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._given

    def readinto(self, b: Any) -> int:
        chunk = self._f.read(len(b))
        n = len(chunk)
        b[:n] = chunk.replace(b"\r", b"\n")
        self._given += n
        return n


def save_as(path: Path | str) -> str:
    """What to save a text table as, in a message: its format in UTF-8."""
    return "UTF-8 JSON Lines" if table_suffix(path) in (".jsonl", ".ndjson") else "CSV UTF-8"


# What a binary file's first bytes say it is, for the refusal of one named as a text table.
_MAGIC = (
    (b"PK\x03\x04", "a zip archive (an Excel workbook .xlsx is one: name it .xlsx)"),
    (b"PAR1", "a Parquet file (name it .parquet)"),
    (b"\x1f\x8b", "gzip-compressed (name it .gz: houses.csv.gz)"),
    (b"BZh", "bzip2-compressed (name it .bz2)"),
    (b"\xfd7zXZ", "xz-compressed (name it .xz)"),
    (b"\xd0\xcf\x11\xe0", "an old Excel workbook .xls (save it as .xlsx or CSV UTF-8)"),
    (b"%PDF", "a PDF document"),
    (b"SQLite format 3", "an SQLite database"),
)


def refuse_nul(path: Path | str, data: bytes, line: int) -> None:
    """Refuse text with a NUL byte, which no CSV or JSON Lines text holds (`data`: the text from a
    line's start, after `line` lines of the file; 0: the file's start). Never guessed: a start whose
    every other byte is NUL (ASCII text in UTF-16 without a byte-order mark) is named UTF-16 LE or
    BE, to be read with that encoding named; another NUL byte names a binary file, by what its first
    bytes say it is when they say."""
    at = data.find(b"\x00")
    if at < 0:
        return
    path = str(path)
    if line == 0:
        sample = np.frombuffer(data[: min(len(data), 4096) & ~1], np.uint8)
        even, odd = (sample[0::2] == 0).mean(), (sample[1::2] == 0).mean()
        for share, other, order in ((odd, even, "LE"), (even, odd, "BE")):
            if share > 0.3 and other < 0.02:
                codec = f"utf-16-{order.lower()}"
                first = sample.tobytes().decode(codec, "replace").split("\n")[0].rstrip("\r")[:40]
                shown = " ".join(f"{b:02X}" for b in data[:8])
                raise InvalidDataset(
                    f"{path}: every other byte of its start is NUL ({shown} ...): it looks like UTF-16 {order} text "
                    f"without a byte-order mark (its first line would read {first!r}); nothing is guessed: read it "
                    f'with --encoding {codec} (a job\'s "dataset": {{"encoding": "{codec}"}}), or save it as '
                    f"{save_as(path)}"
                )
    begin = data.rfind(b"\n", 0, at) + 1
    number = line + data.count(b"\n", 0, at) + 1
    where = f"{path}: line {number}, character {at - begin + 1}: byte 0x00 (NUL)"
    kind = next((what for magic, what in _MAGIC if data.startswith(magic)), None) if line == 0 else None
    if kind is not None:
        raise InvalidDataset(f"{where}: the file is not text, its first bytes say it is {kind}")
    raise InvalidDataset(
        f"{where}, which no text table holds: the file is binary, or text in an encoding with NUL bytes (UTF-16, "
        f"UTF-32) and no byte-order mark: name that encoding with --encoding NAME, or save it as {save_as(path)}"
    )


class _Transcoded(io.RawIOBase):
    """A stream of text in `encoding` (`marked`: as its byte-order mark says) as a stream of its
    UTF-8 bytes, decoded a chunk at a time; a byte that is not of that encoding is refused by its
    line and character."""

    def __init__(self, f: Any, encoding: str, path: str, marked: bool = False) -> None:
        self._f, self._encoding, self._path, self._marked = f, encoding, path, marked
        self._decoder = codecs.getincrementaldecoder(encoding)()
        self._out, self._at, self._done = b"", 0, False
        self._given = 0  # UTF-8 bytes read
        self._lines = 0  # newlines decoded
        self._column = 0  # characters decoded after the last newline

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._given

    def readinto(self, b: Any) -> int:
        while self._at == len(self._out) and not self._done:
            chunk = self._f.read(_TEXT_CHUNK)
            self._done = not chunk
            try:
                text = self._decoder.decode(chunk, final=self._done)
            except UnicodeDecodeError as e:
                raise self._refusal(e) from None
            newlines = text.count("\n")
            self._lines += newlines
            self._column = len(text) - text.rfind("\n") - 1 if newlines else self._column + len(text)
            self._out, self._at = text.encode("utf-8"), 0
        n = min(len(b), len(self._out) - self._at)
        b[:n] = self._out[self._at : self._at + n]
        self._at += n
        self._given += n
        return n

    def _refusal(self, e: UnicodeDecodeError) -> InvalidDataset:
        before = e.object[: e.start].decode(e.encoding, "replace")
        line = self._lines + before.count("\n") + 1
        column = len(before) - before.rfind("\n") if "\n" in before else self._column + len(before) + 1
        bad = e.object[e.start : e.end]
        shown = " ".join(f"0x{c:02X}" for c in bad)
        said = f"{self._path}: line {line}, character {column}: {'byte' if len(bad) == 1 else 'bytes'} {shown}"
        if self._marked:
            name = self._encoding.upper()
            return InvalidDataset(
                f"{said} {'is' if len(bad) == 1 else 'are'} not {name} text ({e.reason}), which the file's "
                f"byte-order mark says it is: the file is damaged (cut short?); save it again, as {save_as(self._path)}"
            )
        return InvalidDataset(
            f"{said} {'is' if len(bad) == 1 else 'are'} not {self._encoding} text ({e.reason}), the encoding named: "
            'name the file\'s own with --encoding NAME (a job\'s "dataset": {"encoding": "NAME"}), or save it as '
            f"{save_as(self._path)}"
        )


def is_parquet(path: str | Path) -> bool:
    return table_suffix(path) in (".parquet", ".pq")


@dataclass
class Block:
    """Consecutive rows of a table file. `rows` says where each came from: the CSV line where it
    ends (a JSON Lines file's line), or the Parquet row number (both 1-based). `csv`: every cell
    is text (a CSV's or a JSON Lines file's)."""

    path: str
    unit: str  # "line" (CSV, JSON Lines) or "row" (Parquet)
    rows: np.ndarray
    cells: dict[str, Any]  # column -> pyarrow Array: CSV text (null where empty), Parquet as stored
    csv: bool
    decimal_comma: bool = False  # a CSV not separated by commas: `0,346` may be a number
    _text: dict[str, Any] = field(default_factory=dict)
    _numbers: dict[str, tuple[np.ndarray, np.ndarray] | None] = field(default_factory=dict)
    _number_text: dict[str, Any] = field(default_factory=dict)
    _dates: dict[str, tuple[np.ndarray, np.ndarray] | None] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int, column: str) -> str:
        return f"{self.path}: column {column!r}, {self.unit} {int(self.rows[i])}"

    def slice(self, start: int, stop: int) -> Block:
        cells = {k: v.slice(start, stop - start) for k, v in self.cells.items()}
        return Block(self.path, self.unit, self.rows[start:stop], cells, self.csv, self.decimal_comma)

    def keep(self, rows: np.ndarray) -> Block:
        """The block's rows where `rows` (a mask) is True, in order, with their row numbers."""
        import pyarrow as pa

        mask = pa.array(rows)
        cells = {k: v.filter(mask) for k, v in self.cells.items()}
        return Block(self.path, self.unit, self.rows[rows], cells, self.csv, self.decimal_comma)

    def concat(self, other: Block) -> Block:
        import pyarrow as pa

        cells = {k: pa.concat_arrays([v, other.cells[k]]) for k, v in self.cells.items()}
        rows = np.concatenate([self.rows, other.rows])
        return Block(self.path, self.unit, rows, cells, self.csv, self.decimal_comma)

    def text(self, name: str) -> Any:
        """The column as a pyarrow string array, null where a cell is empty (a CSV's stripped of
        surrounding whitespace first; a Parquet's non-text values as Python writes them)."""
        if name not in self._text:
            import pyarrow as pa
            import pyarrow.compute as pc

            col = self.cells[name]
            if self.csv:
                col = pc.utf8_trim_whitespace(col)
            elif not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                # numbers, booleans, dates, ...: as the manifest's levels have always named them
                col = pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())
            self._text[name] = pc.if_else(pc.equal(col, ""), pa.scalar(None, col.type), col)
        return self._text[name]

    def numbers(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(float64 values with NaN where empty, where empty) when every present cell is a number,
        else None; a text cell that is a missing marker (`NA`, `NULL`, ...) is empty here. A number
        written `nan` or `inf` is a value, not an empty cell (a Parquet float NaN is empty, as a
        null is)."""
        if name not in self._numbers:
            self._numbers[name] = self._parse(name)
        return self._numbers[name]

    def _parse(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        import pyarrow as pa

        col = self.cells[name]
        if not self.csv and _is_number_type(col.type):
            # unsafe: an integer past 2^53 (a 64-bit id) is its nearest float64, as numpy makes it
            values = col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            return values, np.isnan(values)
        if not self.csv and not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            return None  # booleans, dates, ...: text, as Python writes them
        # as written, then stripped (" 1.5", a cell of spaces, NA): the stripped text only when needed
        for cells_of in (lambda: col, lambda: self.number_text(name)):
            try:
                numbers = cells_of().cast(pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
            values = numbers.to_numpy(zero_copy_only=False)
            return values, numbers.is_null().to_numpy(zero_copy_only=False)
        return None

    def dates(self, name: str, form: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """(days since 1970-01-01 as float64, the time of day its fraction, NaN where empty; where
        empty) when every present cell is a date as `form` writes one (`parse_dates`: None, an
        ISO-8601 date or date-time; `m/d/yyyy`, `d.m.yyyy`, ...: DATE_FORMS; a missing marker is
        empty, as in `number_text`) or the column is a Parquet date or timestamp, else None."""
        key = name if form is None else f"{name}\0{form}"
        if key not in self._dates:
            import pyarrow as pa

            col = self.cells[name]
            if not self.csv and (pa.types.is_date(col.type) or pa.types.is_timestamp(col.type)):
                tz = col.type.tz if pa.types.is_timestamp(col.type) else None
                self._dates[key] = _days(col.cast(pa.timestamp("us", tz)))  # a zone's instant in UTC
            elif self.csv or pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                self._dates[key] = parse_dates(self.number_text(name), form)
            else:
                self._dates[key] = None
        return self._dates[key]

    def date_shape(self, name: str) -> DateShape | None:
        """How the column's present cells write dates (`date_shape`; a Parquet date or timestamp
        column's are ISO), or None when they are not all dates written one way."""
        import pyarrow as pa

        col = self.cells[name]
        if not self.csv and (pa.types.is_date(col.type) or pa.types.is_timestamp(col.type)):
            return DateShape("iso")
        if self.csv or pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            text = self.number_text(name)
            if text.null_count == len(text):
                return DateShape("")
            if written_style(text) is not None:  # no ISO date: spare the cast's failure (~1.8 us a cell)
                return written_shape(text)
            return DateShape("iso") if self.dates(name) is not None else None
        return None

    def first_not_a_date(self, name: str, form: str | None = None) -> int:
        """The index of the first present cell that is not a date as `form` writes one (the column has one)."""
        cells = self.number_text(name)
        lo, hi = 0, len(cells)  # bisect: the prefix [0, hi) holds one, [0, lo) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if parse_dates(cells.slice(0, mid), form) is not None:
                lo = mid
            else:
                hi = mid
        return lo

    def number_text(self, name: str) -> Any:
        """The column's text (`text`) as a number column reads it: a missing marker (`NA`,
        `#N/A`, `NULL`, ...) is null, as an empty cell is, a spreadsheet's formatted number
        (`$1,234.50`, `7.5%`: _MARKED) is bare, and in a file not separated by commas
        a decimal comma is a point (`0,5` is 0.5): what prepare parses and counts, and
        `tabular.read_table` reads of a number column."""
        if name not in self._number_text:
            import pyarrow as pa
            import pyarrow.compute as pc

            text = self.text(name)
            if self.csv:
                marked = pc.is_in(text, value_set=pa.array(MISSING_MARKERS, text.type))
                if pc.any(marked).as_py():
                    text = pc.if_else(marked, pa.scalar(None, text.type), text)
                formatted = pc.fill_null(pc.match_substring_regex(text, _MARKED[self.decimal_comma]), False)
                if pc.any(formatted).as_py():
                    bare = pc.replace_substring_regex(text, _MARKS[self.decimal_comma], "")
                    bare = pc.replace_substring_regex(bare, _PARENTHESES, r"-\1")
                    text = pc.if_else(formatted, bare, text)
            if self.decimal_comma:
                text = pc.replace_substring(text, ",", ".")
            self._number_text[name] = text
        return self._number_text[name]

    def markers(self, name: str) -> np.ndarray:
        """Where the column's cells are missing markers: text `number_text` reads as empty."""
        self.numbers(name)
        if not self.csv or name not in self._number_text:  # cast as written: no marker (a marker fails a cast)
            return np.zeros(len(self), bool)
        empty = self.text(name).is_null().to_numpy(zero_copy_only=False)
        return self.number_text(name).is_null().to_numpy(zero_copy_only=False) & ~empty

    def gaps(self, name: str) -> np.ndarray:
        """Where the column's cells are empty, read as text (a missing marker is text; a number
        column's gaps, markers among them, are `numbers(name)[1]`)."""
        if not self.csv and _is_number_type(self.cells[name].type):
            parsed = self.numbers(name)
            assert parsed is not None
            return parsed[1]
        return self.text(name).is_null().to_numpy(zero_copy_only=False)

    def first_not_a_number(self, name: str) -> int:
        """The index of the first present cell that is not a number (the column has one; a
        missing marker is not it: read as a number column, it is empty)."""
        import pyarrow as pa

        cells = self.number_text(name)
        lo, hi = 0, len(cells)  # bisect: the prefix [0, hi) holds one, [0, lo) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                cells.slice(0, mid).cast(pa.float64())
                lo = mid
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                hi = mid
        return lo

    def cell(self, i: int, name: str) -> str:
        """A cell's text as the file has it (stripped), for messages."""
        value = self.cells[name][i].as_py()
        return "" if value is None else str(value).strip() if self.csv else str(value)

    def column(self, name: str, numeric: bool) -> np.ndarray:
        """The column as a Table holds it: float64 (NaN where empty, a missing marker too) when
        `numeric` (every cell a number) or a Parquet number column, else str cells ("" where
        empty; a marker is its text): fixed-width str, or Python strings (object) when a cell is
        longer than WIDE_CELL (a fixed width is the longest cell's for every cell: one 100 KB
        document in a block of 20,000 rows would take 8 GB)."""
        if numeric or (not self.csv and _is_number_type(self.cells[name].type)):
            parsed = self.numbers(name)
            assert parsed is not None, f"{name}: not a number column"
            return parsed[0]
        import pyarrow.compute as pc

        text = self.text(name).fill_null("")
        longest = pc.max(pc.utf8_length(text)).as_py() or 0
        return np.asarray(text.to_numpy(zero_copy_only=False), dtype=str if longest <= WIDE_CELL else object)


def parse_dates(text: Any, form: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """A pyarrow string array's cells (null: empty) as `Block.dates` reads them, or None unless
    every present cell is a date written as `form` says.

    None: an ISO-8601 date or date-time as pyarrow's cast to a timestamp reads one: `2024-03-17`,
    `2024-03-17T10:05:00`, `2024-03-17 10:05`, fractions of a second. Either every cell is without
    a zone (the time as written) or every cell has one (`Z`, `+02:00`: the instant in UTC);
    `03/17/2024`, `2024-3-7` or a mix of the two are not ISO dates.

    A DATE_FORMS entry (`m/d/yyyy`, `d.m.yyyy`, ...): the day and month in that order, one or two
    digits each, and a four-digit year, separated by that form's `/`, `.` or `-`, optionally a
    24-hour time after a space (`3/17/2024 14:05`, `3/17/2024 9:05:30.5`); a NAMED_STYLES entry:
    the month by name (`17-Mar-2024`, `17 March 2024`, `Mar 17, 2024`); a ` h:mm AM/PM` entry: the
    time, if any, 12-hour (`3/17/2024 2:05 PM`, `12:05 am` is 00:05). Each cell is rewritten as the
    ISO date it means and read by the same cast (no zone), so `3/17/2024` is `2024-03-17` to the
    last bit; a day the month does not have (`2/30/2024`), an hour past 23, or an AM/PM hour
    outside 1-12 is not a date."""
    import pyarrow as pa

    if form is not None:
        text = _as_iso(text, form)
        if text is None:
            return None
    for tz in (None, "UTC") if form is None else (None,):
        try:
            return _days(text.cast(pa.timestamp("us", tz)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return None


# Dates as spreadsheets (Excel, Google Sheets, their CSV exports) write them: a day and a month of
# one or two digits in either order, then a four-digit year, separated by `/`, `.` or `-`; or the
# month's English name or its three-letter abbreviation (any case, `Sept` too) with a four-digit
# year (`15-Mar-2024`, `15 March 2024`, `Mar 15, 2024`); optionally a time after a space, 24-hour
# (`14:05`) or 12-hour (`2:05 PM`, the form's ` h:mm AM/PM` entries). Read by `parse_dates` and
# recorded in a date column's ColumnTransform.date_format (None: ISO 8601).
DATE_SEPARATORS = "/.-"
# Styles with no day-month order to decide: the month by name, or the year first (`2024/3/17`, as
# Excel in Japan, China and Taiwan writes dates; `2024.3.17`), whose order is always year, month, day.
NAMED_STYLES = ("d-mon-yyyy", "d mon yyyy", "mon d, yyyy", "yyyy/m/d", "yyyy.m.d")
CLOCK_12 = " h:mm AM/PM"
DATE_FORMS = tuple(
    f"{style}{clock}"
    for style in ("m/d/yyyy", "d/m/yyyy", "m.d.yyyy", "d.m.yyyy", "m-d-yyyy", "d-m-yyyy", *NAMED_STYLES)
    for clock in ("", CLOCK_12)
)
# Which order a column whose every day and month are at most 12 is read in, by separator: `/` as
# Excel's US default writes it, `.` and `-` as European (and most other) spreadsheets do.
DATE_ORDER_UNTOLD = {"/": "month_first", ".": "day_first", "-": "day_first"}
# the order of a named month's style: its name says which field is the month
NAMED_ORDER = "named"
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = (
    r"(?P<mon>(?i:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?))"
)
_DAY, _YEAR = r"(?P<d>\d{1,2})", r"(?P<y>\d{4})"
_DATE_PART = {
    **{sep: rf"(?P<a>\d{{1,2}}){re.escape(sep)}(?P<b>\d{{1,2}}){re.escape(sep)}{_YEAR}" for sep in DATE_SEPARATORS},
    "d-mon-yyyy": rf"{_DAY}-{_MONTH}-{_YEAR}",
    "d mon yyyy": rf"{_DAY} {_MONTH} {_YEAR}",
    "mon d, yyyy": rf"{_MONTH} {_DAY}, {_YEAR}",
    **{f"yyyy{sep}m{sep}d": rf"{_YEAR}{re.escape(sep)}(?P<mo>\d{{1,2}}){re.escape(sep)}{_DAY}" for sep in "/."},
}
# the time after the date: `clock` "24" (14:05, 14:05:30.5), "12" (2:05 PM, 2:05:30 pm) or "any"
_CLOCK = {
    "24": r"(?: (?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}(?:\.\d+)?))?)?",
    "12": r"(?: (?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}(?:\.\d+)?))? ?(?P<p>[AaPp][Mm]))?",
    "any": r"(?: (?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}(?:\.\d+)?))?(?: ?(?P<p>[AaPp][Mm]))?)?",
}
_WRITTEN = {(style, clock): f"^{date}{time}$" for style, date in _DATE_PART.items() for clock, time in _CLOCK.items()}
_WRITTEN_PY = {key: re.compile(pattern) for key, pattern in _WRITTEN.items()}


def date_form(sep: str, order: str, clock: str = "") -> str:
    """The DATE_FORMS entry of a style (a separator, or a NAMED_STYLES entry), an order
    (`month_first`, `day_first`; NAMED_ORDER for a named month) and a clock ("12": AM/PM)."""
    if sep in NAMED_STYLES:
        style = sep
    else:
        style = f"m{sep}d{sep}yyyy" if order == "month_first" else f"d{sep}m{sep}yyyy"
    return style + (CLOCK_12 if clock == "12" else "")


def _form_parts(form: str) -> tuple[str, str, str]:
    """A DATE_FORMS entry's style (separator or NAMED_STYLES entry), order and clock ("24", "12")."""
    clock = "12" if form.endswith(CLOCK_12) else "24"
    style = form.removesuffix(CLOCK_12)
    if style in NAMED_STYLES:
        return style, NAMED_ORDER, clock
    return style[1], "month_first" if style[0] == "m" else "day_first", clock


@dataclass(frozen=True)
class DateShape:
    """How a column's present cells write dates: `sep` "" when none is present, "iso" (ISO 8601,
    or a Parquet date or timestamp), else the separator of a day-and-month-in-numbers date, with
    the largest first and second field (a first above 12 is a day, so the day comes first; a
    second above 12, the month first), or a NAMED_STYLES entry; `clock` "" when no cell has a
    time of day, "24" or "12" (AM/PM) for how those that do write it."""

    sep: str
    first: int = 0
    second: int = 0
    clock: str = ""


def same_clock(a: str, b: str) -> str | None:
    """Two shapes' clocks together ("" with either), or None when one is 24-hour, the other AM/PM."""
    return None if a and b and a != b else a or b


def date_shape(text: Any) -> DateShape | None:
    """How a pyarrow string array's present cells write dates, or None when they are not all ISO
    dates (`parse_dates`) nor all one style's DATE_FORMS dates (a mix is no date column)."""

    if text.null_count == len(text):
        return DateShape("")
    if written_style(text) is not None:
        return written_shape(text)
    return DateShape("iso") if parse_dates(text) is not None else None


def written_style(text: Any) -> str | None:
    """The DATE_FORMS style (a separator or a NAMED_STYLES entry) the first present cell of a
    pyarrow string array (not all empty) is written in, or None."""
    first = str(text.filter(text.is_valid())[0].as_py()) if text.null_count else str(text[0].as_py())
    return next((s for s in _DATE_PART if _WRITTEN_PY[s, "any"].match(first)), None)


def written_shape(text: Any) -> DateShape | None:
    """`date_shape` of cells that are not all ISO dates (and not all empty): one style's
    DATE_FORMS dates, their times all 24-hour or all AM/PM (hours 1-12), or None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    present = text.drop_null()
    sep = written_style(present)
    if sep is None:
        return None
    pattern = _WRITTEN_PY[sep, "any"]
    fields = pc.extract_regex(present, _WRITTEN[sep, "any"])
    if fields.null_count:
        return None
    hour, half = (pc.struct_field(fields, [pattern.groupindex[g] - 1]) for g in ("h", "p"))
    twelve, timed = pc.not_equal(half, ""), pc.not_equal(hour, "")
    clock = ""
    if pc.any(twelve).as_py():
        if pc.any(pc.and_(timed, pc.invert(twelve))).as_py():
            return None  # some times 24-hour, some AM/PM
        hours = pc.filter(hour, twelve).cast(pa.int32())
        if pc.min(hours).as_py() < 1 or pc.max(hours).as_py() > 12:
            return None
        clock = "12"
    elif pc.any(timed).as_py():
        clock = "24"
    if sep in NAMED_STYLES:
        return DateShape(sep, clock=clock)
    first_field = pc.max(pc.struct_field(fields, [0]).cast(pa.int32())).as_py()
    second_field = pc.max(pc.struct_field(fields, [1]).cast(pa.int32())).as_py()
    return DateShape(sep, int(first_field), int(second_field), clock)


def _as_iso(text: Any, form: str) -> Any:
    """`form` dates (DATE_FORMS) rewritten as the ISO-8601 dates they mean (null where empty), or
    None when a present cell is not written so (an AM/PM hour outside 1-12 included)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sep, order, clock = _form_parts(form)
    pattern = _WRITTEN_PY[sep, clock]
    fields = pc.extract_regex(text, _WRITTEN[sep, clock])
    if fields.null_count != text.null_count:
        return None

    def group(name: str) -> Any:
        return pc.struct_field(fields, [pattern.groupindex[name] - 1])

    pad = lambda f: pc.utf8_lpad(f, width=2, padding="0")  # noqa: E731
    if order == NAMED_ORDER and "mo" in pattern.groupindex:  # the year first
        month, day = group("mo"), group("d")
    elif order == NAMED_ORDER:
        name = pc.utf8_lower(pc.utf8_slice_codeunits(group("mon"), 0, 3))
        month = pc.add(pc.index_in(name, value_set=pa.array(MONTHS)), 1).cast(pa.string())
        day = group("d")
    else:
        month, day = (group("a"), group("b")) if order == "month_first" else (group("b"), group("a"))
    date = pc.binary_join_element_wise(group("y"), pad(month), pad(day), "-")
    hour, minute, second = group("h"), group("m"), group("s")
    if clock == "12":  # 12 AM is hour 0, 12 PM hour 12, 1 PM hour 13; no hour 0 nor above 12
        timed = pc.not_equal(hour, "")
        h12 = pc.if_else(timed, hour, "12").cast(pa.int32())
        if pc.any(pc.or_(pc.less(h12, 1), pc.greater(h12, 12))).as_py():
            return None
        pm = pc.equal(pc.utf8_upper(group("p")), "PM")
        h24 = pc.add(pc.if_else(pc.equal(h12, 12), 0, h12), pc.if_else(pm, 12, 0))
        hour = pc.if_else(timed, h24.cast(pa.string()), "")
    clock_text = pc.binary_join_element_wise(pad(hour), minute, ":")
    clock_text = pc.if_else(pc.equal(second, ""), clock_text, pc.binary_join_element_wise(clock_text, second, ":"))
    stamp = pc.if_else(pc.equal(hour, ""), date, pc.binary_join_element_wise(date, clock_text, " "))
    return pc.if_else(text.is_null(), pa.scalar(None, pa.string()), stamp)


def date_example(form: str) -> tuple[str, str, str]:
    """17 March 2024 as `form` (a DATE_FORMS entry) writes it: the date, with a time, with seconds."""
    sep, order, clock = _form_parts(form)
    if order == NAMED_ORDER:
        date = {
            "d-mon-yyyy": "17-Mar-2024",
            "d mon yyyy": "17 Mar 2024",
            "mon d, yyyy": "Mar 17, 2024",
            "yyyy/m/d": "2024/3/17",
            "yyyy.m.d": "2024.3.17",
        }[sep]
    else:
        date = sep.join(["3", "17", "2024"] if order == "month_first" else ["17", "3", "2024"])
    if clock == "12":
        return date, f"{date} 2:05 PM", f"{date} 2:05:30 PM"
    return date, f"{date} 10:05", f"{date} 10:05:30"


_US_PER_DAY = 86_400_000_000


def _days(stamps: Any) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    gaps = stamps.is_null().to_numpy(zero_copy_only=False)
    us = stamps.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    days = us / _US_PER_DAY
    days[gaps] = np.nan
    return days, gaps


def _is_number_type(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


@dataclass
class TableFile:
    """A table file's header, read again block by block as often as asked."""

    path: str
    columns: list[str]
    unit: str
    size: int  # bytes (CSV, JSON Lines) or rows (Parquet): what `blocks` reports progress in
    read: Callable[[TableFile, Callable[[int], None] | None], Iterator[Block]]  # its format's block reader
    delimiter: str = ","  # a CSV's, as its header shows it
    vectors: dict[str, int] = field(default_factory=dict)  # a list-of-numbers column (Parquet, JSON Lines): its length
    encoding: str | None = None  # a text table's without a byte-order mark, as named (`open_text`); None: UTF-8

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[Block]:
        """The file's rows in order; `progress` is told how far (in `size` units) after each block."""
        yield from self.read(self, progress)


def open_csv_or_parquet(path: str | Path, encoding: str | None = None) -> TableFile:
    """A .csv (with a header) or .parquet file, its header checked; its rows are read by `blocks`.
    `encoding`: a CSV's without a byte-order mark (`open_text`; a Parquet file's text is UTF-8).
    (`smlt.runtime.data.tables.open_table` takes JSON Lines too.)"""
    path = Path(path)
    if is_parquet(path) and is_compressed(path):
        raise InvalidDataset(
            f"{path}: a Parquet file compresses its own pages; give it as it was written ({path.stem})"
        )
    if is_parquet(path):
        pf = _parquet(path)
        if pf.metadata.num_rows == 0:
            raise InvalidDataset(f"{path}: a Parquet dataset needs at least one row")
        vectors = _vector_lengths(path, pf)
        columns = [
            c
            for name in pf.schema_arrow.names
            for c in (vector_columns(name, vectors[name]) if name in vectors else [name])
        ]
        _check_header(path, columns)
        return TableFile(str(path), columns, "row", pf.metadata.num_rows, _parquet_blocks, vectors=vectors)
    with open_text(path, encoding) as (f, _):
        header, _, _, delimiter = _csv_header(path, f)
    _check_header(path, header)
    return TableFile(str(path), header, "line", path.stat().st_size, _csv_blocks, delimiter, encoding=encoding)


def _check_header(path: Path | str, header: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, name in enumerate(header):
        if name in seen:
            raise InvalidDataset(
                f"{path}: column {name!r} appears twice in the header (columns {seen[name] + 1} and {i + 1}, counting "
                "from 1): rename one of them"
            )
        seen[name] = i


# --- CSV -------------------------------------------------------------------------------------


def _record_ends(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(positions of every newline, of those that end a record: outside quotes). A block starts
    at a record's start, so a newline is outside quotes when an even number of quotes precede it."""
    a = np.frombuffer(buf, np.uint8)
    newlines = np.flatnonzero(a == _NEWLINE)
    if _QUOTE not in a:
        return newlines, newlines
    quotes = np.flatnonzero(a == _QUOTE)
    return newlines, newlines[np.searchsorted(quotes, newlines) % 2 == 0]


# How a CSV header cell with no name is named, with its position (pandas' names).
UNNAMED = "Unnamed: "


def unnamed(name: str) -> bool:
    """A column whose header cell had no name (`Unnamed: 3`), or a frame written with one."""
    return name.startswith(UNNAMED) and name[len(UNNAMED) :].isdigit()


def _csv_header(path: Path, f: Any) -> tuple[list[str], bytes, int, str]:
    """(the header's names, the bytes read past it, the lines it took, the delimiter)."""
    buf = f.read(BLOCK_BYTES)
    if buf.startswith(_BOM):  # Excel's "CSV UTF-8": not part of the first column's name
        buf = buf[len(_BOM) :]
    refuse_nul(path, buf, 0)
    while True:
        _, ends = _record_ends(buf)
        more = f.read(BLOCK_BYTES) if not len(ends) else b""
        if not more:
            break
        buf += more
    hint = _SEP_LINE.match(buf)
    skipped = 0
    if hint:  # Excel's `sep=;` line: the delimiter, not the header
        buf, skipped = buf[hint.end() :], 1
        while b"\n" not in buf:
            more = f.read(BLOCK_BYTES)
            if not more:
                break
            buf += more
        _, ends = _record_ends(buf)
    end = int(ends[0]) + 1 if len(ends) else len(buf)
    try:
        text = buf[:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, buf, e.start, skipped) from None
    delimiter = hint.group(1).decode() if hint else _delimiter(text)
    header = next(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter), [])
    _refuse_numbers_header(path, header, skipped + 1)
    _refuse_above_header(path, header, skipped + 1, buf[end:], delimiter)
    # A header cell with no name after the first (a trailing delimiter, as spreadsheets write one)
    # is named as pandas names it, `Unnamed: 3` (sources._table leaves it out); the first stays ''
    # (row names: tabular.INDEX_NAMES).
    header = [name if name.strip() or not i else f"{UNNAMED}{i}" for i, name in enumerate(header)]
    return header, buf[end:], skipped + buf[:end].count(b"\n"), delimiter


# Excel's first line naming a CSV's delimiter (`sep=;`), as Excel reads it and some exporters write
# it so that Excel splits the columns in any locale.
_SEP_LINE = re.compile(rb"sep=([,;\t|])\r?\n")


def _refuse_numbers_header(path: Path | str, header: list[str], line: int) -> None:
    """A header holding a fractional number (`5.1`), or only whole numbers that do not count up by one,
    is a file's first row, not its header: a file written without one (pandas' `to_csv(header=False)`,
    a sensor's log, a UCI `.data` file such as iris's) would lose the row and have its columns named
    by its values."""
    names = [n.strip() for n in header if n.strip()]
    numbers = [n for n in names if _PLAIN_NUMBER.fullmatch(n)]
    # a name such as `5.1` or `-3` is a cell; names that are all whole numbers are a row unless they
    # count up by one (pandas' default column names 0, 1, 2, ...; years)
    fractional = any(not n.isdigit() for n in numbers)
    whole = [int(n) for n in numbers if n.isdigit()]
    counting = whole == list(range(whole[0], whole[0] + len(whole))) if whole else False
    if not numbers or not (fractional or (len(numbers) == len(names) and not counting)):
        return
    first = ",".join(header) if len(header) <= 8 else ",".join(header[:8]) + ",..."
    example = ",".join([f"x{i + 1}" for i in range(min(len(header), 3) - 1)] + ["label"])
    raise InvalidDataset(
        f"{path}: line {line}, the header, holds numbers where a header names columns ({first}): the file "
        f"has no header, so its first row would be taken for one; add a header line as its first line "
        f"(such as '{example}', with the label column's name) and prepare again"
    )


def _refuse_above_header(path: Path | str, header: list[str], line: int, rest: bytes, delimiter: str) -> None:
    """A first line that is a title, a note or a comment above the table, not its header: one cell
    (`Sales report 2024`, `# units: mm`) where the next line holds three or more, or a first cell
    and only empty ones after it (a title in a spreadsheet's A1 saved as CSV: `Sales report,,`)."""
    first = header[0].strip() if header else ""
    if len(header) > 1 and not any(n.strip() for n in header[1:]):
        what = f"{first!r} and {len(header) - 1} empty cell{'s' * (len(header) > 2)}" if first else "empty cells"
    elif len(header) == 1 and first.startswith("#"):
        what = f"one cell, {first!r}"
    elif len(header) == 1:
        following = next((t for t in rest.split(b"\n") if t.strip(b"\r\t ")), b"").decode("utf-8", "replace")
        seen = _delimiter(following) if "," in following or delimiter == "\t" else delimiter
        cells = next(csv.reader(io.StringIO(following, newline=""), delimiter=seen), [])
        if len(cells) < 3:
            return
        what = f"one cell, {first!r}, where line {line + 1} holds {len(cells)}"
    else:
        return
    raise InvalidDataset(
        f"{path}: line {line} is not a header: {what} (a title, a note or a comment above the table?); a CSV's "
        "first line names its columns: delete the lines above the column names and prepare again"
    )


# `12`, `-0.5`, `1e3` (not `nan` or `Infinity`, names a header may have)
_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _delimiter(header: str) -> str:
    """A comma, unless the header has none: then its semicolons, tabs or bars (the most of them),
    or a tab for a header of one column (whose cells hold no delimiter, but may hold `0,5`).
    Quoted names do not count (`"price, EUR";rooms` is separated by semicolons)."""
    header = re.sub(r'"[^"]*"', "", header)
    if "," in header:
        return ","
    counts = {d: header.count(d) for d in _OTHER_DELIMITERS}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else "\t"


def _not_utf8(path: Path | str, data: bytes, start: int, line: int, table: TableFile | None = None) -> InvalidDataset:
    """The refusal of a text table (a CSV, a JSON Lines file: one rule) that is not UTF-8, named no
    encoding and has no byte-order mark: `data` (bytes from a line's start, after `line` lines of
    the file; a CSV's header when `table` is None) is UTF-8 up to `start`, its first byte that is
    not. Names that byte's line, character and cell (a JSON Lines file's key); when `data` reads as
    Windows-1252 (what Excel's "CSV (Comma delimited)" and other Windows programs write), shows the
    cell as it reads so and how to read the file so. Nothing is guessed."""
    begin = data.rfind(b"\n", 0, start) + 1
    end = data.find(b"\n", start)
    raw_line = data[begin : end if end >= 0 else len(data)].rstrip(b"\r")
    before = data[begin:start].decode("utf-8")
    try:
        data.decode("cp1252")
        text: str | None = raw_line.decode("cp1252")
    except UnicodeDecodeError:
        text = None
    json_lines = table_suffix(path) in (".jsonl", ".ndjson")
    cell, shown = _json_cell(text, start - begin) if json_lines else _csv_cell(before, text, raw_line, table)
    number = line + data.count(b"\n", 0, start) + 1
    where = f"{path}: line {number}, character {len(before) + 1}{f' ({cell})' if cell else ''}"
    said = f"{where}: byte 0x{data[start]:02X} is not UTF-8 text"
    if shown is None:
        return InvalidDataset(
            f'{said}: name the file\'s encoding with --encoding NAME (a job\'s "dataset": {{"encoding": "NAME"}}), '
            f"or save it as {save_as(path)}"
        )
    writer = "programs on Windows write" if json_lines else 'Excel\'s "CSV (Comma delimited)" writes on Windows'
    return InvalidDataset(
        f"{said}; read as Windows-1252 (what {writer}) the "
        f"{'name' if cell == 'the header' else 'value' if json_lines else 'cell'} is {shown!r}: if that is right, "
        'read the file with --encoding cp1252 (a job\'s "dataset": {"encoding": "cp1252"}), or save it as '
        f"{save_as(path)}"
    )


def _csv_cell(before: str, text: str | None, raw_line: bytes, table: TableFile | None) -> tuple[str, str | None]:
    """(the cell a CSV's byte not UTF-8 is in, after `before` on its line; that cell read as
    Windows-1252 (`text`: its line so), None when it does not read so)."""
    delimiter = table.delimiter if table is not None else _delimiter(text or raw_line.decode("utf-8", "replace"))
    index, quoted = 0, False  # the cell the byte is in: delimiters before it outside quotes
    for c in before:
        if c == '"':
            quoted = not quoted
        elif c == delimiter and not quoted:
            index += 1
    if table is None:
        cell = "the header"
    elif index < len(table.columns):
        cell = f"column {table.columns[index]!r}"
    else:
        cell = f"value {index + 1}"
    cells = next(csv.reader([text], delimiter=delimiter), []) if text is not None else []
    return cell, cells[index] if index < len(cells) else None


def _json_cell(text: str | None, at: int) -> tuple[str, str | None]:
    """(the key whose value (or name) a JSON Lines line's byte not UTF-8 is in, byte `at` of the
    line; that string read as Windows-1252 (`text`: its line so), None when it does not read so or
    is not a JSON object's string)."""
    import json

    if text is None:
        return "", None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        record = None
    char = text[at]
    if isinstance(record, dict):
        for key, value in record.items():
            if char in key:
                return "a key", key
            if isinstance(value, str) and char in value:
                return f"key {key!r}", value
    return "", None


def _csv_blocks(table: TableFile, progress: Callable[[int], None] | None) -> Iterator[Block]:
    path = Path(table.path)
    rows = 0
    with open_text(path, table.encoding) as (f, raw):
        _, buf, line, _ = _csv_header(path, f)
        offset = f.tell() - len(buf)  # the file byte where `buf` starts
        eof = False
        while not eof:
            chunk = f.read(BLOCK_BYTES) if len(buf) < BLOCK_BYTES else b""
            eof = not chunk and len(buf) < BLOCK_BYTES
            buf += chunk
            newlines, ends = _record_ends(buf)
            if eof:
                cut = len(buf)
            elif len(ends):
                cut = int(ends[-1]) + 1
                newlines, ends = newlines[newlines < cut], ends
            else:  # one record longer than a block (a long quoted text): read on
                more = f.read(BLOCK_BYTES)
                if more:
                    buf += more
                    continue
                eof, cut = True, len(buf)  # to the end of the file: a quote never closed
            body, buf = buf[:cut], buf[cut:]
            refuse_nul(path, body, line)
            if eof:
                _refuse_open_quote(table, body, newlines, ends, line)
            block = _csv_block(table, body, newlines, ends, line)
            line += len(newlines)
            offset += cut
            if progress is not None:
                progress(raw.tell() if raw is not f else offset)
            if len(block):
                rows += len(block)
                yield block
    if not rows:
        raise InvalidDataset(f"{path}: a CSV dataset needs a header and at least one row")


def _refuse_open_quote(table: TableFile, body: bytes, newlines: np.ndarray, ends: np.ndarray, line: int) -> None:
    """The file's last bytes inside a quote that is never closed: its last newline ends no record
    (a block of only that record would otherwise hold no row, and the row be lost)."""
    if not body.endswith(b"\n") or (len(ends) and int(ends[-1]) == len(body) - 1):
        return
    start = int(ends[-1]) + 1 if len(ends) else 0
    first = line + int(np.searchsorted(newlines, start)) + 1
    raise InvalidDataset(
        f'{table.path}: line {first}: a quote (") opened in this row is never closed, so the rest of the file '
        "would be one cell: close the quote, or remove it"
    )


def _csv_block(table: TableFile, body: bytes, newlines: np.ndarray, ends: np.ndarray, line: int) -> Block:
    """One block's rows; `line` lines of the file come before it."""
    import pyarrow as pa

    lines = _row_lines(body, newlines, ends, line)
    if not len(lines):
        return Block(table.path, "line", lines, {}, csv=True, decimal_comma=table.delimiter != ",")
    parsed = None
    try:
        parsed = _parse_csv(table.columns, body, quoted=b'"' in body, delimiter=table.delimiter)
    except pa.ArrowInvalid as e:
        _diagnose(table, body, line, e)
    assert parsed is not None
    if parsed.num_rows != len(lines):  # a line ending Python's csv and pyarrow count apart (a lone \r)
        lines = _python_lines(table, body, line)
    cells = {name: parsed.column(i).combine_chunks() for i, name in enumerate(table.columns)}
    return Block(table.path, "line", lines, cells, csv=True, decimal_comma=table.delimiter != ",")


def _parse_csv(columns: list[str], body: bytes, quoted: bool, delimiter: str = ",") -> Any:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    block_size = _ARROW_BLOCK
    while True:
        try:
            return pcsv.read_csv(
                pa.BufferReader(body),
                read_options=pcsv.ReadOptions(column_names=columns, use_threads=False, block_size=block_size),
                parse_options=pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=quoted),
                convert_options=pcsv.ConvertOptions(
                    column_types={name: pa.string() for name in columns},
                    strings_can_be_null=True,
                    null_values=[""],
                    quoted_strings_can_be_null=True,
                ),
            )
        except pa.ArrowInvalid as e:
            if "straddling" not in str(e) or block_size > len(body):
                raise
            block_size *= 4  # a row longer than pyarrow's block


def _row_lines(body: bytes, newlines: np.ndarray, ends: np.ndarray, line: int) -> np.ndarray:
    """The line each row of `body` ends on (blank lines are not rows)."""
    if not body:
        return np.zeros(0, np.int64)
    a = np.frombuffer(body, np.uint8)
    if len(body) and a[-1] != _NEWLINE:  # the file's last line, without a newline
        ends = np.append(ends, len(body))
        newlines = np.append(newlines, len(body))
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    length = ends - starts
    blank = (length == 0) | ((length == 1) & (a[np.minimum(starts, len(a) - 1)] == _CR))
    return (line + 1 + np.searchsorted(newlines, ends[~blank])).astype(np.int64)


def _python_lines(table: TableFile, body: bytes, line: int) -> np.ndarray:
    reader = csv.reader(io.StringIO(_decode(table, body, line), newline=""), delimiter=table.delimiter)
    return np.array([line + reader.line_num for r in reader if r], np.int64)


def _decode(table: TableFile, body: bytes, line: int) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(table.path, body, e.start, line, table) from None


def _ragged_hint(row: list[str], width: int, delimiter: str) -> str:
    """Why a row has another number of values than the header's `width`, as far as its cells tell."""
    shown = "tab" if delimiter == "\t" else repr(delimiter)
    if len(row) > width and not any(c.strip() for c in row[width:]):
        extra = len(row) - width
        return (
            f": its last {'value is' if extra == 1 else f'{extra} values are'} empty, a delimiter at the end of the "
            "line (as spreadsheets write one where a cell right of the table was once used); remove it from such "
            "lines, or name a column for it in the header (a column without a name is left out)"
        )
    if len(row) > width:
        return (
            f': a cell holding the delimiter ({shown}) without quotes? Quote such a cell ("Smith, John"), as a '
            "spreadsheet saving CSV does"
        )
    return ": a value is missing from it (or a line break in a cell without quotes cut it)"


def _diagnose(table: TableFile, body: bytes, line: int, error: Exception) -> None:
    """The named error for a block pyarrow could not read: not UTF-8, or a row with another
    number of values than the header (found with Python's csv, as only a failing block is)."""
    reader = csv.reader(io.StringIO(_decode(table, body, line), newline=""), delimiter=table.delimiter)
    for r in reader:
        if r and len(r) != len(table.columns):
            raise InvalidDataset(
                f"{table.path}: line {line + reader.line_num} has {len(r)} values, the header {len(table.columns)}"
                + _ragged_hint(r, len(table.columns), table.delimiter)
            )
    raise InvalidDataset(f"{table.path}: not a readable CSV after line {line} ({error})")


# --- Parquet ---------------------------------------------------------------------------------


def _parquet(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise InvalidDataset(f"{path}: not a readable Parquet file ({e})") from None


def vector_columns(name: str, length: int) -> list[str]:
    """The columns a column of number lists (an embedding; a Parquet file's or a JSON Lines
    file's) becomes: `emb[0]`, `emb[1]`, ..."""
    return [f"{name}[{i}]" for i in range(length)]


def _vector_lengths(path: Path, pf: Any) -> dict[str, int]:
    """Each list-of-numbers column's length (its type's, or its first list's); any other nested
    column (a struct, a map, a list of text) is refused by name: a cell is one value."""
    import pyarrow as pa

    lengths: dict[str, int] = {}
    for f in pf.schema_arrow:
        t = f.type
        if not pa.types.is_nested(t):
            continue
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) or not (
            _is_number_type(t.value_type)
        ):
            raise InvalidDataset(
                f"{path}: column {f.name!r} holds {t}: a cell is one number, text or date (a list of numbers, such "
                "as an embedding, is a feature per element); flatten it into columns of their own"
            )
        if pa.types.is_fixed_size_list(t):
            lengths[f.name] = t.list_size
            continue
        for batch in pf.iter_batches(batch_size=PARQUET_ROWS, columns=[f.name], use_threads=False):
            present = batch.column(0).drop_null()
            if len(present):
                lengths[f.name] = len(present[0])
                break
        else:
            raise InvalidDataset(f"{path}: column {f.name!r} holds lists, and every one is null")
        if lengths[f.name] == 0:
            raise InvalidDataset(f"{path}: column {f.name!r}: its first list is empty")
    return lengths


def _spread(table: TableFile, name: str, col: Any, rows: np.ndarray) -> dict[str, Any]:
    """A list-of-numbers column as one column per element, each list checked to have the
    column's length (`rows`: where each came from, for the refusal). A Parquet column's numbers
    become float64 columns (NaN where the list is null: empty cells, imputed or refused as any); a
    JSON Lines column, lists of the numbers' text as written (`jsonl_reader`), becomes text
    columns (null where the list or the element is), read as a CSV's cells are."""
    import pyarrow as pa
    import pyarrow.compute as pc

    length = table.vectors[name]
    sizes = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    present = ~col.is_null().to_numpy(zero_copy_only=False)
    wrong = present & (np.nan_to_num(sizes, nan=length) != length)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise InvalidDataset(
            f"{table.path}: column {name!r}, {table.unit} {int(rows[i])} holds {int(sizes[i])} numbers, the "
            f"column's first list {length}: every list of a column needs the same length (or null)"
        )
    flat = pc.list_flatten(col.filter(pa.array(present)))
    if pa.types.is_string(flat.type):  # text: the flat values taken once, column after column (null where absent)
        at = np.full((len(col), length), -1, np.int64)
        at[present] = np.arange(len(flat)).reshape(-1, length)
        order = at.T.ravel()
        by_column = flat.take(pa.array(order, mask=order < 0))
        return {c: by_column.slice(i * len(col), len(col)) for i, c in enumerate(vector_columns(name, length))}
    values = np.full((len(col), length), np.nan)
    values[present] = flat.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False).reshape(-1, length)
    return {c: pa.array(values[:, i]) for i, c in enumerate(vector_columns(name, length))}


def _parquet_blocks(table: TableFile, progress: Callable[[int], None] | None) -> Iterator[Block]:
    import pyarrow as pa

    pf = _parquet(Path(table.path))
    start = 1
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_ROWS, use_threads=False):
            rows = np.arange(start, start + batch.num_rows, dtype=np.int64)
            cells: dict[str, Any] = {}
            for name, col in zip(batch.schema.names, batch.columns):
                if name in table.vectors:
                    cells.update(_spread(table, name, col, rows))
                else:
                    col = col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col
                    # numpy's float16 as pandas writes it: float32 (pyarrow's grouping and sorting take no float16)
                    cells[name] = col.cast(pa.float32()) if pa.types.is_float16(col.type) else col
            start += batch.num_rows
            if progress is not None:
                progress(start - 1)
            yield Block(table.path, "row", rows, cells, csv=False)
    except (pa.ArrowException, OSError) as e:
        raise InvalidDataset(f"{table.path}: not a readable Parquet file ({e})") from None
