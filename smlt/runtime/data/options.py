"""How a source is read: the options `smlt data prepare` takes and a job's `dataset` section
carries (one model, so the CLI, the job and the cache slug agree on them)."""

from __future__ import annotations

import codecs
from typing import Literal

from pydantic import PositiveInt, field_validator

from smlt.runtime.strict import UserModel

Task = Literal["classification", "regression"]


class SourceOptions(UserModel):
    # CSV/Parquet: the label column (default: one named label/target/y, else the last).
    label: str | None = None
    # Default: inferred from the labels (whole numbers with few distinct values are classes).
    task: Task | None = None
    # CSV/Parquet empty cells and nulls: imputed from the train split with a 0/1 indicator
    # feature, or refused with the column and row named.
    missing: Literal["impute", "refuse"] = "impute"
    # CSV/Parquet/JSONL: columns left out of the features (an id, a row number, a column that gives
    # the label away), so the file need not be edited.
    drop: list[str] = []
    # CSV/Parquet/JSONL: how a date column written with its day and month in numbers (`3/4/2024`) is
    # read when no day above 12 tells (table_reader.DATE_ORDER_UNTOLD: `/` month first, `.` and `-`
    # day first); a column whose days say otherwise is text.
    date_order: Literal["month_first", "day_first"] | None = None
    # CSV/TSV/TXT/JSON Lines: the text's encoding when it is not UTF-8 and the file has no byte-order mark (a
    # BOM says UTF-8, UTF-16 or UTF-32 itself): `cp1252` for Excel's "CSV (Comma delimited)" on
    # Windows; any name Python's codecs know, kept as their name for it (`windows-1252`: `cp1252`).
    # Without it such a file is refused, never guessed (table_reader.open_text).
    encoding: str | None = None
    # Image folders: every image resized to image_size x image_size, as RGB (3) or grayscale (1).
    image_size: PositiveInt | None = None
    channels: Literal[1, 3] | None = None
    # Token sequences: ids are in [0, vocab_size); default max id + 1.
    vocab_size: PositiveInt | None = None

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, v: str | None) -> str | None:
        return None if v is None else text_encoding(v)

    def options(self) -> SourceOptions:
        """Just the options (a DatasetSpec without its uri)."""
        return SourceOptions.model_validate(self.model_dump(include=set(SourceOptions.model_fields)))


def text_encoding(name: str) -> str:
    """A text encoding's name as Python's codecs name it (`Windows-1252`, `cp1252`: `cp1252`), or
    a ValueError naming the unknown one."""
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise ValueError(
            f"unknown encoding {name!r}: name one Python's codecs know (cp1252, latin-1, utf-16, shift_jis, ...)"
        ) from None
    if not getattr(info, "_is_text_encoding", True):  # base64, zlib, rot13: codecs, not text encodings
        raise ValueError(f"{name!r} is not a text encoding (cp1252, latin-1, utf-16, shift_jis, ...)")
    return info.name
