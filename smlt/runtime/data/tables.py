"""Open a table file of any format smlt reads in blocks: CSV, Parquet (smlt.runtime.data.table_reader),
JSON Lines (smlt.runtime.data.jsonl_reader) or an Excel workbook (smlt.runtime.data.workbook: read
as its CSV)."""

from __future__ import annotations

from pathlib import Path

from smlt.runtime.data.jsonl_reader import is_jsonl, open_jsonl
from smlt.runtime.data.options import text_encoding
from smlt.runtime.data.table_reader import TableFile, open_csv_or_parquet
from smlt.runtime.data.workbook import WORKBOOK_SUFFIXES, is_workbook, open_workbook
from smlt.runtime.errors import InvalidDataset

# What a table file is named (a compressed one also ends .gz, .bz2 or .xz: table_reader.table_suffix).
# `.txt`: delimited text, as Excel's "Unicode Text" (UTF-16, tab-separated) and "Text (Tab delimited)" name it.
TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".parquet", ".pq", ".jsonl", ".ndjson", *WORKBOOK_SUFFIXES)


def open_table(path: str | Path, encoding: str | None = None) -> TableFile:
    """A .csv (.tsv, .txt: with a header), .parquet, .jsonl or .xlsx file, its header checked; its rows are
    read by `TableFile.blocks`. `encoding`: a delimited text or JSON Lines file's, when it is not UTF-8
    and has no byte-order mark (`table_reader.open_text`); Parquet and workbooks say their own."""
    if is_workbook(path):
        return open_workbook(path)
    if encoding is not None:
        try:
            encoding = text_encoding(encoding)
        except ValueError as e:
            raise InvalidDataset(f"encoding: {e}") from None
    return open_jsonl(Path(path), encoding) if is_jsonl(path) else open_csv_or_parquet(path, encoding)
