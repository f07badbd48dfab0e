"""The dataset manifest: schema, counts, shards, split and normalisation statistics."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from smlt.errors import InvalidDataset

# Final: mypy reads it as the Literal the `format` field requires.
FORMAT: Final = "smlt-dataset/1"


class ShardInfo(BaseModel):
    key: str  # relative to the dataset prefix
    rows: int
    bytes: int
    sha256: str  # checked on load: a corrupt shard is an error, never silent garbage


class SplitInfo(BaseModel):
    rows: int
    shards: list[ShardInfo]


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["smlt-dataset/1"] = FORMAT
    name: str
    source: str
    task: Literal["classification", "regression"]
    features: int
    # Number of classes (classification) or of regression targets.
    outputs: int
    train: SplitInfo
    validation: SplitInfo
    # Features are stored already normalised with these statistics (computed on train).
    normalization: dict[str, list[float]]


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes, or InvalidDataset naming `where` and the first bad field."""
    try:
        return Manifest.model_validate_json(raw)
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "json_invalid":
            problem = f"not valid JSON ({err['msg']})"
        else:
            field = ".".join(str(p) for p in err["loc"]) or "manifest"
            problem = f"not an smlt dataset manifest: {field}: {err['msg']}"
        raise InvalidDataset(
            f"{where} is {problem}; prepare the dataset again with `smlt data prepare SOURCE --out FOLDER`"
        ) from None
