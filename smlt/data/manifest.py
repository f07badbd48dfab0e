"""The dataset manifest: schema, counts, shards, split and normalisation statistics."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

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
