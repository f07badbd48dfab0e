"""A pydantic ValidationError in the words a user reads: each error as the field it is about
(`workers[2].memory_mb`) and its message (our validators' own words, without pydantic's
"Value error, " prefix). Every place that reports a ValidationError reads its errors here; each
place keeps its own frame around them (which file, what to do next)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pydantic import ValidationError
from pydantic_core import ErrorDetails

# What an error with no location (about the whole input) is named: a fixed name, or one per
# error type (an event's unknown op is about its `op`, any other about the event).
Whole = str | Callable[[str], str]


class FieldError(NamedTuple):
    path: str  # workers[2].memory_mb; the whole input's name when the error has no location
    message: str
    type: str  # pydantic's error type: missing, extra_forbidden, value_error, json_invalid, ...
    input: Any  # the value that did not validate

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def field_path(loc: Sequence[int | str], whole: str = "") -> str:
    """('workers', 2, 'memory_mb') as workers[2].memory_mb: a list index in brackets, as the
    input's JSON reads; `whole` for an empty location."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or whole


def message(err: ErrorDetails) -> str:
    """Our validators' own words for a ValueError they raise (pydantic's message adds "Value
    error, "); pydantic's message otherwise."""
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])
    return err["msg"]


def field_errors(e: ValidationError, whole: Whole = "") -> list[FieldError]:
    """Each error of `e`, in pydantic's order, with its field path and message."""
    return [
        FieldError(
            field_path(err["loc"], whole if isinstance(whole, str) else whole(err["type"])),
            message(err),
            err["type"],
            err.get("input"),
        )
        for err in e.errors()
    ]


def describe(e: ValidationError, whole: Whole = "", *, first: bool = False) -> str:
    """`path: message` for each error joined by "; ", or for the first only."""
    errors = field_errors(e, whole)
    return str(errors[0]) if first else "; ".join(map(str, errors))
