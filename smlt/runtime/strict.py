"""The base of the models users write (the job, its dataset options, the study): unknown fields,
non-finite numbers (JSON's `Infinity`, `NaN`) and `true`/`false` where a number belongs are refused,
each naming its field; `"32"` or `32.0` for a whole number is still read as 32."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits a bool (bool itself, a union with it, Any)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_takes_bool(a) for a in typing.get_args(annotation) if not isinstance(a, (int, str)))


def no_bool_for_number(cls: type[BaseModel], v: Any, info: ValidationInfo) -> Any:
    """A before-validator: pydantic's lax mode reads true as 1 and false as 0, so `"local_steps":
    true` would train 1 step; a field whose type takes no bool refuses them."""
    if isinstance(v, bool) and info.field_name is not None:
        field = cls.model_fields.get(info.field_name)
        if field is not None and not _takes_bool(field.annotation):
            raise ValueError(f"expected {_expected(field.annotation)}, not a boolean")
    return v


class PlainUserModel(BaseModel):
    """Unknown fields and non-finite numbers refused (a model with a discriminator field, which
    takes no before-validator: it refuses booleans field by field with `no_bool_for_number`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class UserModel(PlainUserModel):
    _no_bool = field_validator("*", mode="before")(classmethod(no_bool_for_number))


def _expected(annotation: Any) -> str:
    literals = [a for a in _flat_args(annotation) if isinstance(a, (int, str))]
    if literals:
        return " or ".join(str(a) for a in literals)
    text = str(annotation)
    if "int" in text:
        return "a whole number"
    if "float" in text:
        return "a number"
    return "a value of its type"


def _flat_args(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    return [x for a in args for x in ([a] if isinstance(a, (int, str)) else _flat_args(a))]
