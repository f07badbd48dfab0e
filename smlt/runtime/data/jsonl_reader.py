"""JSON Lines files (`.jsonl`, `.ndjson`: one JSON object per line) read in blocks of bounded
size, as smlt.runtime.data.table_reader reads a CSV: cut at newlines into blocks of about its
BLOCK_BYTES, each parsed by pyarrow's JSON reader, single-threaded; the line each row is on is
kept for messages (blank lines are not rows).

The columns are the keys of the file's first records (those in its first block), in the order
they first appear; a key first seen later is refused by name. A missing key or `null` is an
empty cell. Every cell becomes text, as a CSV's are, so one rule decides a column's kind for both:
numeric when every present cell is a number (a JSON number, or a string holding one), else text;
`true`/`false` are text. A nested object or array is refused by column and line.

A block pyarrow cannot read as a table (a column with numbers and strings, a number beyond a
double, a line that is not an object, ...) is read again line by line by Python's json, which
keeps each number's text as written and finds the line a refusal names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from smlt.runtime.data import table_reader
from smlt.runtime.data.table_reader import _BOM, _NEWLINE, Block, TableFile
from smlt.runtime.errors import InvalidDataset

JSONL_SUFFIXES = (".jsonl", ".ndjson")
_SPACE = np.array([9, 10, 13, 32], np.uint8)  # JSON's whitespace


def is_jsonl(path: str | Path) -> bool:
    return table_reader.table_suffix(path) in JSONL_SUFFIXES


def open_jsonl(path: Path) -> TableFile:
    """The file's columns: the keys of the records in its first block."""
    with table_reader.open_bytes(path) as (f, _):
        skip = len(_BOM) if f.read(len(_BOM)) == _BOM else 0
        f.seek(skip)
        body = f.read(table_reader.BLOCK_BYTES) + f.readline()
    columns: dict[str, None] = {}
    for _, record in _records(str(path), body, 0, skip):
        columns.update(dict.fromkeys(record))
    if not columns:
        raise InvalidDataset(f'{path}: a JSON Lines dataset needs at least one record {{"column": value, ...}}')
    return TableFile(str(path), list(columns), "line", path.stat().st_size, jsonl_blocks)


def jsonl_blocks(table: TableFile, progress: Callable[[int], None] | None) -> Iterator[Block]:
    """The file's rows in order, a block of whole lines at a time; `progress` is told the bytes read."""
    rows = line = 0
    dates: set[str] = set()  # columns pyarrow took for timestamps: read as strings from then on
    with table_reader.open_bytes(Path(table.path)) as (f, raw):
        offset = len(_BOM) if f.read(len(_BOM)) == _BOM else 0
        f.seek(offset)
        while body := f.read(table_reader.BLOCK_BYTES) + f.readline():
            block = _block(table, body, line, offset, dates)
            line += body.count(b"\n") + (not body.endswith(b"\n"))
            offset += len(body)
            if progress is not None:
                progress(raw.tell() if raw is not f else offset)
            if len(block):
                rows += len(block)
                yield block
    if not rows:
        raise InvalidDataset(f"{table.path}: a JSON Lines dataset needs at least one record")


def _row_lines(body: bytes, line: int) -> np.ndarray:
    """The line each row of `body` is on (lines of only whitespace are not rows)."""
    a = np.frombuffer(body, np.uint8)
    starts = np.concatenate([[0], np.flatnonzero(a == _NEWLINE) + 1])
    starts = starts[starts < len(a)]
    if not len(starts):
        return np.zeros(0, np.int64)
    content = np.maximum.reduceat(~np.isin(a, _SPACE), starts)  # each line with its newline
    return (line + 1 + np.flatnonzero(content)).astype(np.int64)


def _block(table: TableFile, body: bytes, line: int, offset: int, dates: set[str]) -> Block:
    """One block's rows as text cells; `line` lines of the file come before it, `offset` bytes.
    `dates` (updated): the columns pyarrow would take for timestamps, read as the strings they are."""
    lines = _row_lines(body, line)
    if not len(lines):
        return Block(table.path, "line", lines, {}, csv=True)
    cells = _arrow_cells(table, body, len(lines), dates)
    if cells is None:
        return _python_block(table, body, line, offset)
    return Block(table.path, "line", lines, cells, csv=True)


def _arrow_cells(table: TableFile, body: bytes, rows: int, dates: set[str]) -> dict[str, Any] | None:
    """The block's columns as text, read by pyarrow; None when it cannot (`_python_block` can)."""
    import pyarrow as pa
    import pyarrow.json as pj

    for _ in range(2):  # again when a column turns out to hold dates
        try:
            parsed = pj.read_json(
                pa.BufferReader(body),
                read_options=pj.ReadOptions(use_threads=False, block_size=max(len(body), 1 << 20)),
                parse_options=pj.ParseOptions(
                    explicit_schema=pa.schema([(name, pa.string()) for name in sorted(dates)]),
                    newlines_in_values=False,
                ),
            )
        except pa.ArrowInvalid:
            return None
        found = {n for n, t in zip(parsed.column_names, parsed.schema.types) if pa.types.is_temporal(t)}
        if not found:
            break
        dates |= found
    if parsed.num_rows != rows or not set(parsed.column_names) <= set(table.columns):
        return None
    cells = {}
    for name in table.columns:
        if name not in parsed.column_names:
            cells[name] = pa.nulls(rows, pa.string())
            continue
        col = parsed.column(name).combine_chunks()
        if not (_as_text(col.type) or pa.types.is_null(col.type)):
            return None  # a nested value: named by the line-by-line read
        cells[name] = col.cast(pa.string())
    return cells


def _as_text(t: Any) -> bool:
    """A pyarrow type whose values a cast to string writes as JSON did."""
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t))


def _python_block(table: TableFile, body: bytes, line: int, offset: int) -> Block:
    """The block read line by line: each number's text as written, and every refusal named."""
    import pyarrow as pa

    columns: dict[str, list[str | None]] = {name: [] for name in table.columns}
    known = set(columns)
    rows = []
    for at, record in _records(table.path, body, line, offset):
        extra = [k for k in record if k not in known]
        if extra:
            raise InvalidDataset(
                f"{table.path}: line {at} has key {extra[0]!r}, which the file's first records do not: "
                f"its columns are {', '.join(map(repr, table.columns))} (a record may leave a key out, "
                "an empty cell, but not add one)"
            )
        for name, values in columns.items():
            values.append(_text(table.path, at, name, record.get(name)))
        rows.append(at)
    cells = {name: pa.array(values, pa.string()) for name, values in columns.items()}
    return Block(table.path, "line", np.array(rows, np.int64), cells, csv=True)


def _records(path: str, body: bytes, line: int, offset: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) for each non-blank line of `body`, which starts after `line` lines and
    `offset` bytes; numbers keep their text as written."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidDataset(f"{path}: not UTF-8 text (byte {offset + e.start}); JSON Lines are UTF-8") from None
    for i, row in enumerate(text.split("\n"), start=line + 1):
        if not row.strip(" \t\r"):
            continue
        try:
            record = json.loads(row, parse_float=str, parse_int=str, parse_constant=str)
        except json.JSONDecodeError as e:
            raise InvalidDataset(f"{path}: line {i} is not JSON ({e.msg} at character {e.colno})") from None
        if not isinstance(record, dict):
            raise InvalidDataset(
                f"{path}: line {i} is a JSON {_kind(record)}, not an object: each line of a JSON Lines "
                'dataset is one record, {"column": value, ...}'
            )
        yield i, record


def _text(path: str, line: int, column: str, value: Any) -> str | None:
    """A cell's text (numbers already are: `_records`), null for a JSON null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    raise InvalidDataset(
        f"{path}: column {column!r}, line {line} holds a JSON {_kind(value)}: a cell is a number, a string, "
        "true/false or null (flatten nested values into columns of their own)"
    )


def _kind(value: Any) -> str:
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) else type(value).__name__
