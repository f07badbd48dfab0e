"""A version uploaded as many parts of one table (`part-00000.csv` ... `part-00199.csv`, or
Parquet parts; Spark's and `aws s3 sync`'s usual layout): which uploads are one, decided from the
version's listing, and the parts' headers checked against each other.

One data object stays PrepareData's single-function path (`smlt.runtime.steps.prepare.find_source`);
several table files of one format, beside nothing else, are the parts of one table, prepared part
by part (`smlt.runtime.data.parts`); anything else (a CSV beside a Parquet file, a table beside an
archive) is not decided here: `find_source` refuses it as `MixedUpload`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from smlt.runtime.data.jsonl_reader import is_jsonl
from smlt.runtime.data.table_reader import is_compressed, is_parquet, table_suffix
from smlt.runtime.data.tables import TABLE_SUFFIXES
from smlt.runtime.data.workbook import is_workbook
from smlt.runtime.steps.prepare_limits import (
    MAX_COMPRESSED_TABLE_BYTES,
    MAX_TABLE_BYTES,
    MAX_WORKBOOK_BYTES,
    MixedUpload,
    TooLargeForLambda,
    _size,
    ignored,
)

# The most parts one version has: the part list travels in the execution's state (256 KiB, at
# about 80 bytes a part) to the Distributed Maps' ItemsPath. With each part within what one
# function prepares (MAX_TABLE_BYTES, 4.2 GB), a version holds up to 1,000 x 4.2 GB = 4.2 TB.
MAX_PARTS = 1_000


@dataclass(frozen=True)
class TableParts:
    """The parts of one table (names relative to the version's folder, in name order: part i is
    the i-th), their format and their bytes in all."""

    # "csv" (comma-, tab-, ... separated), "txt" (the same, named .txt: not the parts of a .csv's table,
    # as notes.txt beside data.csv is not), "jsonl", "parquet" or "xlsx" (Excel workbooks)
    format: str
    names: tuple[str, ...]
    bytes: int


def part_format(name: str) -> str | None:
    """A table file's format as parts share one (`TableParts.format`), or None for another file."""
    if table_suffix(name) not in TABLE_SUFFIXES:
        return None
    if is_parquet(name) or is_jsonl(name) or is_workbook(name):
        return "parquet" if is_parquet(name) else "jsonl" if is_jsonl(name) else "xlsx"
    return "txt" if table_suffix(name) == ".txt" else "csv"


def part_limit(name: str) -> int:
    """The most bytes of one part: a compressed one unpacks to up to COMPRESSION_ALLOWANCE times its
    own; a workbook's cells are read slowly (prepare_limits.MAX_WORKBOOK_BYTES)."""
    if is_workbook(name):
        return MAX_WORKBOOK_BYTES
    return MAX_COMPRESSED_TABLE_BYTES if is_compressed(name) else MAX_TABLE_BYTES


def same_table(objects: Mapping[str, int]) -> TableParts | None:
    """The rule of a table in parts, wherever its files are (a version's objects; a machine's
    folder, smlt.runtime.data.sources.folder_parts): two or more table files of one format at the
    folder's top (`objects`: name relative to the folder -> bytes), beside nothing but names a
    source never includes (`ignored`: `_SUCCESS`, `.crc` checksums, dot-files); else None. No
    limit on their number or size: those are what the pipeline's functions prepare (`table_parts`)."""
    files = {n: s for n, s in objects.items() if not ignored(n)}
    if len(files) < 2 or any("/" in n for n in files):
        return None
    formats = {part_format(n) for n in files}
    if len(formats) != 1 or None in formats:
        return None
    (fmt,) = formats
    assert fmt is not None
    return TableParts(fmt, tuple(sorted(files)), sum(files.values()))


def table_parts(objects: Mapping[str, int], where: str) -> TableParts | None:
    """The parts of one table among `objects` (name relative to the version's folder -> bytes),
    or None when the upload is not several table files of one format at the folder's top
    (`same_table`; then `find_source` decides: one source, or its named refusal). A part over
    what one function prepares, or more parts than MAX_PARTS, is refused by name."""
    parts = same_table(objects)
    if parts is None:
        return None
    names = parts.names
    if len(names) > MAX_PARTS:
        raise MixedUpload(
            f"{where} holds {len(names):,} parts of a table, more than {MAX_PARTS:,}: upload it in larger "
            f"parts (each up to {_size(MAX_TABLE_BYTES)})"
        )
    big = [n for n in names if objects[n] > part_limit(n)]
    if big:
        packed = " compressed" if is_compressed(big[0]) else ""
        raise TooLargeForLambda(
            f"{where}{big[0]} is {_size(objects[big[0]])}: a{packed} part of a table is prepared by one function, "
            f"up to {_size(part_limit(big[0]))}; cut the table into smaller parts (same header in each)"
        )
    return parts


def check_headers(
    headers: Mapping[str, Sequence[str]],
    where: str,
    advice: str = "upload tables with other columns as versions of their own",
) -> None:
    """Every part's columns the first part's (same names, same order), else MixedUpload naming
    the first part that differs: parts are one table."""
    names = sorted(headers)
    first = list(headers[names[0]])
    for name in names[1:]:
        theirs = list(headers[name])
        if theirs != first:
            missing = [c for c in first if c not in theirs]
            extra = [c for c in theirs if c not in first]
            what = (
                f"no column {', '.join(map(repr, missing))}"
                if missing
                else f"column {', '.join(map(repr, extra))} that {names[0]} has not"
                if extra
                else "the same columns in another order"
            )
            raise MixedUpload(
                f"{where}{name} has {what}: the parts of one table have one header ({names[0]}'s: "
                f"{', '.join(first)}); {advice}"
            )
