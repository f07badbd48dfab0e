"""JSON Lines files (`.jsonl`, `.ndjson`: one JSON object per line) read in blocks of bounded
size, as smlt.runtime.data.table_reader reads a CSV: cut at newlines into blocks of about its
BLOCK_BYTES, each parsed by pyarrow's JSON reader, single-threaded; the line each row is on is
kept for messages (blank lines are not rows). Its text is read as a CSV's is, by the same code
(`table_reader.open_text`, `_not_utf8`, `refuse_nul`): UTF-8, or what its byte-order mark says
(UTF-16, UTF-32), or the encoding named (`--encoding`, `dataset.encoding`); bytes not UTF-8
otherwise are refused by line, character and key, never guessed.

The columns are the keys of the file's first records (those in its first block), in the order
they first appear; a key first seen later is refused by name. A missing key or `null` is an
empty cell. Every cell becomes text, as a CSV's are, so one rule decides a column's kind for both:
numeric when every present cell is a number (a JSON number, or a string holding one), else text;
`true`/`false` are text.

A key whose first value (not null) in the first records is a list of numbers (an embedding,
`{"emb": [0.1, 0.2, 0.3]}`) is a column per element, `emb[0]`, `emb[1]`, ..., as a Parquet
column of number lists is (table_reader's `vector_columns` and `_spread`: the same names, the same
refusal of a list of another length than the first, naming the line): each element's text as
written, so the file prepares to what a CSV with the columns `emb[0]`, ... written out does. A null
list, or a null element, is an empty cell. A nested object, a list of text (or of lists, objects,
true/false) or a list in a column of single values is refused by column and line.

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


class _Number(str):
    """A JSON number's text as written (`_records`): told apart from a string, which a list's
    elements must not be."""


def open_jsonl(path: Path, encoding: str | None = None) -> TableFile:
    """The file's columns: the keys of the records in its first block, a key whose first value
    there is a list spread into a column per element (`vector_columns`). Its text is read as a
    CSV's is (`table_reader.open_text`: UTF-8, or what its byte-order mark says, or `encoding`)."""
    with table_reader.open_text(path, encoding) as (f, _):
        body = _unmarked(f.read(table_reader.BLOCK_BYTES) + f.readline())
    table_reader.refuse_nul(path, body, 0)
    keys: dict[str, None] = {}
    first: dict[str, tuple[int, Any]] = {}  # key -> (line, its first value not null)
    for line, record in _records(str(path), body, 0):
        keys.update(dict.fromkeys(record))
        for k, v in record.items():
            if v is not None and k not in first:
                first[k] = (line, v)
    if not keys:
        raise InvalidDataset(f'{path}: a JSON Lines dataset needs at least one record {{"column": value, ...}}')
    vectors: dict[str, int] = {}
    for k, (line, v) in first.items():
        if isinstance(v, list):
            if not v:
                raise InvalidDataset(f"{path}: column {k!r}, line {line}: its first list is empty")
            vectors[k] = len(v)
    columns = [c for k in keys for c in (table_reader.vector_columns(k, vectors[k]) if k in vectors else [k])]
    if len(set(columns)) < len(columns):
        twice = next(c for i, c in enumerate(columns) if c in columns[:i])
        of = next(k for k in vectors if twice in table_reader.vector_columns(k, vectors[k]))
        raise InvalidDataset(
            f"{path}: key {twice!r} is also the column of an element of the list {of!r} (its elements are "
            f"{of}[0], {of}[1], ...); rename the key"
        )
    return TableFile(str(path), columns, "line", path.stat().st_size, jsonl_blocks, vectors=vectors, encoding=encoding)


def _unmarked(body: bytes) -> bytes:
    """The file's first bytes without UTF-8's byte-order mark (`open_text` leaves it in)."""
    return body[len(_BOM) :] if body.startswith(_BOM) else body


def _keys(table: TableFile) -> list[str]:
    """The file's keys, in order: its columns with each list's element columns one key."""
    firsts = {table_reader.vector_columns(k, 1)[0]: k for k in table.vectors}
    keys, skip = [], 0
    for c in table.columns:
        if skip:
            skip -= 1
            continue
        if c in firsts:
            keys.append(firsts[c])
            skip = table.vectors[firsts[c]] - 1
        else:
            keys.append(c)
    return keys


def jsonl_blocks(table: TableFile, progress: Callable[[int], None] | None) -> Iterator[Block]:
    """The file's rows in order, a block of whole lines at a time; `progress` is told the bytes read."""
    rows = line = 0
    dates: set[str] = set()  # columns pyarrow took for timestamps: read as strings from then on
    offset = 0  # text bytes read (UTF-8)
    with table_reader.open_text(Path(table.path), table.encoding) as (f, raw):
        while body := f.read(table_reader.BLOCK_BYTES) + f.readline():
            if not offset:
                body = _unmarked(body)
            table_reader.refuse_nul(table.path, body, line)
            block = _block(table, body, line, dates)
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


def _block(table: TableFile, body: bytes, line: int, dates: set[str]) -> Block:
    """One block's rows as text cells; `line` lines of the file come before it.
    `dates` (updated): the columns pyarrow would take for timestamps, read as the strings they are."""
    lines = _row_lines(body, line)
    if not len(lines):
        return Block(table.path, "line", lines, {}, csv=True)
    try:
        body.decode("utf-8")  # pyarrow's JSON reader keeps bytes that are not UTF-8 in its strings
    except UnicodeDecodeError as e:
        raise table_reader._not_utf8(table.path, body, e.start, line) from None
    cells = _arrow_cells(table, body, lines, dates)
    if cells is None:
        return _python_block(table, body, line)
    return Block(table.path, "line", lines, cells, csv=True)


def _arrow_cells(table: TableFile, body: bytes, lines: np.ndarray, dates: set[str]) -> dict[str, Any] | None:
    """The block's columns as text, read by pyarrow (a list column's elements spread by
    `_spread`); None when it cannot (`_python_block` can). `lines`: each row's line."""
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
    rows = len(lines)
    keys = _keys(table)
    if parsed.num_rows != rows or not set(parsed.column_names) <= set(keys):
        return None
    cells = {}
    for name in keys:
        col = parsed.column(name).combine_chunks() if name in parsed.column_names else pa.nulls(rows)
        if name in table.vectors and not pa.types.is_null(col.type):
            if not (pa.types.is_list(col.type) and (_is_number(col.type.value_type))):
                return None  # not lists of numbers: named by the line-by-line read
            cells.update(table_reader._spread(table, name, col.cast(pa.list_(pa.string())), lines))
            continue
        if not (_as_text(col.type) or pa.types.is_null(col.type)):
            return None  # a nested value: named by the line-by-line read
        for c in table_reader.vector_columns(name, table.vectors[name]) if name in table.vectors else [name]:
            cells[c] = col.cast(pa.string())
    return cells


def _is_number(t: Any) -> bool:
    """A list's element type pyarrow reads numbers (or only nulls) as."""
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t))


def _as_text(t: Any) -> bool:
    """A pyarrow type whose values a cast to string writes as JSON did."""
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t))


def _python_block(table: TableFile, body: bytes, line: int) -> Block:
    """The block read line by line: each number's text as written, and every refusal named."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {name: [] for name in _keys(table)}
    known = set(columns)
    rows = []
    for at, record in _records(table.path, body, line):
        extra = [k for k in record if k not in known]
        if extra:
            raise InvalidDataset(
                f"{table.path}: line {at} has key {extra[0]!r}, which the file's first records do not: "
                f"its columns are {', '.join(map(repr, table.columns))} (a record may leave a key out, "
                "an empty cell, but not add one)"
            )
        for name, values in columns.items():
            read = _list if name in table.vectors else _text
            values.append(read(table.path, at, name, record.get(name)))
        rows.append(at)
    lines = np.array(rows, np.int64)
    cells = {}
    for name, values in columns.items():
        if name in table.vectors:
            cells.update(table_reader._spread(table, name, pa.array(values, pa.list_(pa.string())), lines))
        else:
            cells[name] = pa.array(values, pa.string())
    return Block(table.path, "line", lines, cells, csv=True)


def _records(path: str, body: bytes, line: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record) for each non-blank line of `body`, which starts after `line` lines; numbers
    keep their text as written (`_Number`). Bytes not UTF-8 are refused as a CSV's are
    (`table_reader._not_utf8`: line, character, key, and the value read as Windows-1252)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise table_reader._not_utf8(path, body, e.start, line) from None
    for i, row in enumerate(text.split("\n"), start=line + 1):
        if not row.strip(" \t\r"):
            continue
        try:
            record = json.loads(row, parse_float=_Number, parse_int=_Number, parse_constant=_Number)
        except json.JSONDecodeError as e:
            spread = row.strip(" \t\r") in ("{", "[", "[{") or row.rstrip(" \t\r").endswith(("{", "["))
            hint = (
                ": a record spread over several lines (pretty-printed JSON)? JSON Lines holds each record on one "
                "line: write it without an indent (json.dumps(record), jq -c)"
                if spread
                else ""
            )
            raise InvalidDataset(f"{path}: line {i} is not JSON ({e.msg} at character {e.colno}){hint}") from None
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
    if isinstance(value, list):
        raise InvalidDataset(
            f"{path}: column {column!r}, line {line} holds a JSON array, where the file's first records hold single "
            f"values: a key is a column of lists of numbers (an embedding: {column}[0], {column}[1], ...) when its "
            "first value not null is one; otherwise write a list's values in keys of their own"
        )
    raise InvalidDataset(
        f"{path}: column {column!r}, line {line} holds a JSON {_kind(value)}: a cell is a number, a string, "
        f"true/false or null, or a list of numbers (an embedding: a column per element, {column}[0], {column}[1], "
        "...); flatten nested values into keys of their own"
    )


def _list(path: str, line: int, column: str, value: Any) -> list[str | None] | None:
    """A list column's cell: its numbers' text as written (null where null), null for a JSON null;
    anything else is refused (a list's length is `_spread`'s to check)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidDataset(
            f"{path}: column {column!r}, line {line} holds a JSON {_kind(value)}, where the file's first records "
            f"hold lists of numbers (its columns {column}[0], {column}[1], ...): every cell of the column is a list "
            "of numbers or null"
        )
    bad = next((v for v in value if not (v is None or isinstance(v, _Number))), None)
    if bad is None:
        return value
    what = "text" if isinstance(bad, str) else "true/false" if isinstance(bad, bool) else f"JSON {_kind(bad)}s"
    raise InvalidDataset(
        f"{path}: column {column!r}, line {line} holds a list of {what} ({json.dumps(bad)}): a list of numbers (an "
        f"embedding) is a column per element, {column}[0], {column}[1], ...; a list of anything else is not "
        "(join it into one string, or write each value in a key of its own)"
    )


def _kind(value: Any) -> str:
    if isinstance(value, _Number):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) else type(value).__name__
