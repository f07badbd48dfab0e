"""A pydantic ValidationError in the words a user reads: each error as the field it is about
(`workers[2].memory_mb`) and its message (our validators' own words, without pydantic's
"Value error, " prefix). Every place that reports a ValidationError reads its errors here; each
place keeps its own frame around them (which file, what to do next)."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

# What an error with no location (about the whole input) is named: a fixed name, or one per
# error type (an event's unknown op is about its `op`, any other about the event).
Whole = str | Callable[[str], str]


class FieldError(NamedTuple):
    path: str  # workers[2].memory_mb; the whole input's name when the error has no location
    message: str
    type: str  # pydantic's error type: missing, extra_forbidden, value_error, json_invalid, ...
    input: Any  # the value that did not validate
    loc: tuple[int | str, ...] = ()  # pydantic's location of it (`path` is its words)

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
            tuple(err["loc"]),
        )
        for err in e.errors()
    ]


def describe(e: ValidationError, whole: Whole = "", *, first: bool = False) -> str:
    """`path: message` for each error joined by "; ", or for the first only."""
    errors = field_errors(e, whole)
    return str(errors[0]) if first else "; ".join(map(str, errors))


def unknown_field_hint(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """For an unknown field at `loc` of `model`'s input: where a field of that name belongs
    (`memory_mb` under `training`: "it belongs in workers"), or the closest name its section takes
    ("did you mean 'learning_rate'?"); "" when neither."""
    *parent, name = [p for p in loc if isinstance(p, str)] or [""]
    section: type[BaseModel] | None = model
    for part in parent:
        field = section.model_fields.get(part) if section is not None else None
        section = next(iter(_models_in(field.annotation)), None) if field is not None else None
    if section is None:
        return ""
    close = difflib.get_close_matches(name, list(section.model_fields), n=1, cutoff=0.75)
    if close:
        return f" (did you mean {close[0]!r}?)"
    homes = sorted(_sections_with(model, name))
    return f" (it belongs in {' or '.join(homes)})" if homes else ""


def _models_in(t: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (Optional, lists and unions looked into)."""
    if isinstance(t, type) and issubclass(t, BaseModel):
        return [t]
    return [m for arg in typing.get_args(t) for m in _models_in(arg)]


def _sections_with(model: type[BaseModel], name: str, path: str = "") -> set[str]:
    """The paths of `model`'s sections that take a field called `name` (the top level is "the job's top level")."""
    found = {path or "the top level"} if name in model.model_fields else set()
    for key, field in model.model_fields.items():
        for sub in _models_in(field.annotation):
            found |= _sections_with(sub, name, f"{path}.{key}" if path else key)
    return found
