"""Open a table file of any format smlt reads in blocks: CSV, Parquet (smlt.runtime.data.table_reader)
or JSON Lines (smlt.runtime.data.jsonl_reader)."""

from __future__ import annotations

from pathlib import Path

from smlt.runtime.data.jsonl_reader import is_jsonl, open_jsonl
from smlt.runtime.data.table_reader import TableFile, open_csv_or_parquet


def open_table(path: str | Path) -> TableFile:
    """A .csv (with a header), .parquet or .jsonl file, its header checked; its rows are read by
    `TableFile.blocks`."""
    return open_jsonl(Path(path)) if is_jsonl(path) else open_csv_or_parquet(path)
