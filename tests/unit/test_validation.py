"""A pydantic ValidationError in a user's words (smlt/runtime/validation.py), and the one place
that reads pydantic's errors: every other place reports through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from smlt.runtime.validation import describe, field_errors, field_path

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "smlt" / "runtime" / "validation.py"


class Worker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory_mb: int

    @field_validator("memory_mb")
    @classmethod
    def _tier(cls, v: int) -> int:
        if v < 128:
            raise ValueError(f"memory_mb: {v} is below Lambda's least, 128")
        return v


class Plan(BaseModel):
    workers: list[Worker]
    grid: dict[str, list[int]] = {}


def _error(raw: object) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        Plan.model_validate(raw)
    return e.value


def test_a_path_puts_list_indexes_in_brackets():
    assert field_path(("workers", 2, "memory_mb")) == "workers[2].memory_mb"
    assert field_path(("grid", "a", 0)) == "grid.a[0]"
    assert field_path((0, "x")) == "[0].x"
    assert field_path((), "job") == "job" and field_path(()) == ""


def test_nested_models_list_indexes_and_our_own_words():
    e = _error({"workers": [{"memory_mb": 512}, {"memory_mb": 64}, {"memory_mb": "x", "cpu": 1}]})
    errors = field_errors(e)
    assert [(x.path, x.type) for x in errors] == [
        ("workers[1].memory_mb", "value_error"),
        ("workers[2].memory_mb", "int_parsing"),
        ("workers[2].cpu", "extra_forbidden"),
    ]
    # a validator's ValueError without pydantic's "Value error, " prefix
    assert errors[0].message == "memory_mb: 64 is below Lambda's least, 128"
    assert errors[0].input == 64 and errors[1].input == "x"
    assert describe(e, first=True) == "workers[1].memory_mb: memory_mb: 64 is below Lambda's least, 128"
    assert describe(e).split("; ")[1:] == [
        "workers[2].memory_mb: Input should be a valid integer, unable to parse string as an integer",
        "workers[2].cpu: Extra inputs are not permitted",
    ]


def test_an_error_about_the_whole_input_takes_its_name():
    e = _error([1])
    assert describe(e, "plan") == "plan: Input should be a valid dictionary or instance of Plan"
    assert (
        describe(e, lambda t: f"plan ({t})")
        == "plan (model_type): Input should be a valid dictionary or instance of Plan"
    )
    assert field_errors(e)[0].path == ""


def _reads_pydantic_errors(source: str) -> list[int]:
    """Lines that read a ValidationError's errors themselves: `.errors()` (no arguments: a run
    table's `errors(round)` is another thing) or `err["loc"]`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "errors":
            if not node.args and not node.keywords:
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "loc":
            lines.append(node.lineno)
    return lines


def test_only_the_helper_reads_pydantic_errors():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in ("smlt", "lambdas", "infra")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != HELPER
        for line in _reads_pydantic_errors(path.read_text())
    ]
    assert not found, "report a ValidationError through smlt.runtime.validation:\n" + "\n".join(found)


def test_the_check_sees_a_hand_formatted_error():
    source = "errors = table.errors(3)\ntry:\n    f()\nexcept ValidationError as e:\n    err = e.errors()[0]\n    print(err['loc'])\n"
    assert _reads_pydantic_errors(source) == [5, 6]
    assert _reads_pydantic_errors(HELPER.read_text())  # the helper itself reads them
