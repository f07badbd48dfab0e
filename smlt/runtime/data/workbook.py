"""An Excel workbook (`.xlsx`, `.xlsm`) read as the CSV Excel's "Save as CSV UTF-8" writes of it,
so that every rule of a CSV (types, missing markers, labels, notices) applies to it unchanged.

Its first visible worksheet (a notice names the others) is read with openpyxl in read-only mode,
formulas as their cached values (`data_only`: what Excel last computed and shows), and written
to a temporary CSV, row by row: a number as Python writes it (an integral one without `.0`, as
Excel writes it), a date or date-time as ISO-8601 (`2024-03-17`; `2024-03-17 10:05:00` when it
has a time of day: a date column), a boolean as `TRUE`/`FALSE`, an error as Excel shows it
(`#N/A`, `#DIV/0!`: missing markers in a column of numbers), an empty cell empty. Its first row
that is not blank is the header; blank rows are no rows, and columns left empty in every row,
the header too (Excel's used range often holds such rows and columns, formatted but empty), are
no columns. A number formatted as a percent or a currency is its value (`0.075`, not `7.50%`).

The CSV is then read by the CSV reader (smlt.runtime.data.table_reader) as often as asked; its
blocks and messages name the workbook and the sheet's rows (`sales.xlsx: column 'price', row 7`,
the row Excel shows), never the temporary file, which is deleted with the table."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from smlt.runtime.data.table_reader import Block, TableFile, is_compressed, open_csv_or_parquet, table_suffix
from smlt.runtime.errors import InvalidDataset

WORKBOOK_SUFFIXES = (".xlsx", ".xlsm")
# The first bytes of an OLE compound file: an encrypted (password-protected) workbook, or an old .xls.
_OLE = b"\xd0\xcf\x11\xe0"


def is_workbook(path: str | Path) -> bool:
    return table_suffix(path) in WORKBOOK_SUFFIXES


@contextlib.contextmanager
def named_as(path: str | Path, name: str) -> Iterator[None]:
    """A dataset error about `path` (a temporary file something was written to, to be read as a
    table) names `name` instead: the workbook, or the DataFrame (smlt.inference)."""
    try:
        yield
    except InvalidDataset as e:
        message = str(e).replace(str(path), name)
        if message == str(e):
            raise
        raise type(e)(message) from None


def open_workbook(path: str | Path) -> TableFile:
    """The workbook's first visible sheet as a table: a temporary CSV (deleted with the returned
    TableFile), read in blocks whose rows are the sheet's row numbers."""
    path = Path(path)
    if is_compressed(path):
        raise InvalidDataset(f"{path}: a workbook compresses itself; give it as it was saved ({path.stem})")
    folder = tempfile.mkdtemp(prefix="smlt-workbook-")
    try:
        csv_path = Path(folder) / f"{path.stem}.csv"
        rows = _write_csv(path, csv_path)
        with named_as(csv_path, str(path)):
            inner = open_csv_or_parquet(csv_path)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    last = int(rows[-1]) if len(rows) else 0

    def read(table: TableFile, progress: Callable[[int], None] | None) -> Iterator[Block]:
        done = 0
        with named_as(csv_path, str(path)):
            for block in inner.blocks():
                at = rows[done : done + len(block)]
                done += len(block)
                if progress is not None:
                    progress(int(at[-1]))
                yield Block(str(path), "row", at, block.cells, block.csv, block.decimal_comma)

    table = TableFile(str(path), inner.columns, "row", last, read, inner.delimiter)
    weakref.finalize(table, shutil.rmtree, folder, True)
    return table


def _open(path: Path) -> Any:
    with path.open("rb") as f:
        head = f.read(4)
    if head == _OLE:
        raise InvalidDataset(
            f"{path}: an encrypted (password-protected) workbook, or an Excel 97-2003 one saved under a new name: "
            "save a copy without a password as an Excel workbook (.xlsx), or as CSV UTF-8"
        )
    from openpyxl import load_workbook

    try:
        return load_workbook(path, read_only=True, data_only=True)
    except Exception as e:  # not a zip, a zip without a workbook, damaged XML
        raise InvalidDataset(f"{path}: not a readable Excel workbook ({type(e).__name__}: {e})") from None


def _sheet(path: Path, book: Any) -> Any:
    sheets = list(book.worksheets)
    if not sheets:
        raise InvalidDataset(f"{path}: the workbook has no worksheet (only charts)")
    visible = [s for s in sheets if s.sheet_state == "visible"] or sheets
    sheet = visible[0]
    if len(sheets) > 1:
        from smlt.runtime.progress import notice

        others = [s.title for s in sheets if s is not sheet]
        notice.info(
            f"{path}: {len(sheets)} sheets; read the first{' visible' if sheet is not sheets[0] else ''}, "
            f"{sheet.title!r}, not {', '.join(map(repr, others))}: to read another, move it first in the workbook "
            "(or save it as CSV UTF-8)"
        )
    return sheet


def cell_text(value: Any) -> str:
    """A cell's value as Excel's CSV writes it (a number as Python writes it, without a needless
    `.0`; a date as ISO-8601), "" for an empty cell."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, dt.datetime):
        if value.time() == dt.time(0) and value.tzinfo is None:
            return value.date().isoformat()
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return str(value)  # int, Decimal, timedelta, ...


def _write_csv(path: Path, out: Path) -> np.ndarray:
    """The sheet written to `out` as CSV (module docstring); each data row's sheet row number."""
    book = _open(path)
    try:
        sheet = _sheet(path, book)
        try:
            return _rows_to_csv(path, sheet, out)
        except InvalidDataset:
            raise
        except Exception as e:  # damaged sheet XML
            raise InvalidDataset(f"{path}: sheet {sheet.title!r} is not readable ({type(e).__name__}: {e})") from None
    finally:
        book.close()


def _rows_to_csv(path: Path, sheet: Any, out: Path) -> np.ndarray:
    # Read every row the sheet holds, not the rows and columns of the range its XML states (which
    # some writers state too small: read-only openpyxl would drop the rows past it); rows come
    # as wide as their last cell, blank rows empty.
    sheet.reset_dimensions()
    header: list[str] | None = None
    at = 0  # the header's row
    numbers: list[int] = []
    first, width = 0, 0  # the columns [first, width) that hold a cell in some row
    ragged = False  # a row with a cell past the header's last: the columns are cut again below
    with out.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        for number, values in enumerate(sheet.iter_rows(values_only=True), start=1):
            cells = [v if type(v) is str else cell_text(v) for v in values]
            end = len(cells)  # past the row's last cell that is not empty
            while end and not cells[end - 1]:
                end -= 1
            if not end:
                continue  # a blank row is no row
            lead = 0  # the row's first cell that is not empty
            while not cells[lead]:
                lead += 1
            if header is None:
                header, first, width, at = cells[:end], lead, end, number
                writer.writerow(header)
                continue
            first = min(first, lead)
            if end > len(header):
                width, ragged = max(width, end), True
            row = cells[: max(end, len(header))]
            writer.writerow(row + [""] * (len(header) - len(row)))
            numbers.append(number)
    title = f"sheet {sheet.title!r}"
    if header is None:
        raise InvalidDataset(f"{path}: {title} is empty: a table needs a header row and at least one row")
    if not numbers:
        raise InvalidDataset(f"{path}: {title} has a header row and no row below it")
    named = [c for c in header if c]
    if len(named) == 1 and width - first >= 3:  # a title in A1 above the table (table_reader._refuse_above_header)
        raise InvalidDataset(
            f"{path}: row {at} of {title} is not a header: one cell, {named[0]!r}, where the rows below hold "
            f"{width - first} columns (a title or a note above the table?); the sheet's first row that is not blank "
            "names its columns: delete the rows above the column names and prepare again"
        )
    if ragged or first:
        _cut(out, first, width)
    return np.asarray(numbers, np.int64)


def _cut(out: Path, first: int, width: int) -> None:
    """Rewrite `out` with the columns [first, width) of each row (padded): a table that starts
    right of column A, or a row with cells right of the header's last."""
    cut = out.with_suffix(".cut")
    with out.open(encoding="utf-8", newline="") as f, cut.open("w", encoding="utf-8", newline="") as g:
        writer = csv.writer(g, lineterminator="\n")
        for row in csv.reader(f):
            row = row[first:width]
            writer.writerow(row + [""] * (width - first - len(row)))
    cut.replace(out)
