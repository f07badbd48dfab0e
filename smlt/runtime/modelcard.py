"""The model card: what a finished run's model is and how to feed it, so the model can be used
without the job, the dataset or smlt's source at hand.

Finalize writes it twice, from one `ModelCard`: inside `final/model.safetensors` (the safetensors
metadata key `smlt.model_card`, so a lone model file describes itself) and beside it as
`final/model.json`, which adds what is known only once the model is published: the run's final
metrics (with its whole bill) and the published file's sha256.
`read_card` is the one reader of both. The card holds:

- the model spec: a built-in name or the user's `package.module:fn`, its params and, for code
  sent with `--code`, the code zip's uri and sha256;
- what the model takes and gives: `input_shape`, `input_dtype`, `output_dim`, `vocab_size`, task;
- the class names (classification) and the dataset's feature spec: its manifest without the shard
  lists (the column transforms, the normalisation, the target scaling of a regression), which is
  what turns a new CSV row, image or array into the model's input (smlt.runtime.data.inputs);
- the dataset's uri, the sha256 of its manifest (which lists every shard's sha256) and, for a
  pipeline run, its data version;
- the final metrics (model.json).
"""

from __future__ import annotations

import json
import logging
import re
import struct
from typing import Any, Final, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from smlt.runtime.data.manifest import Manifest, SplitInfo, parse_manifest
from smlt.runtime.data.shards import dataset_store
from smlt.runtime.errors import SmltError
from smlt.runtime.items import FinalMetrics
from smlt.runtime.job import BUILTIN_MODELS, CodeSpec, Job, ModelSpec
from smlt.runtime.store import NotFound
from smlt.runtime.tensors.digest import sha256_hex
from smlt.runtime.tensors.format import header_length, parse_header
from smlt.runtime.validation import describe

log = logging.getLogger(__name__)

CARD_FORMAT: Final = "smlt-model/1"
METADATA_KEY = "smlt.model_card"  # the safetensors metadata entry holding the card's JSON
# A pipeline run's dataset lives under incoming/<pipeline>/<version>/ (smlt.runtime.trigger).
_PIPELINE_DATA = re.compile(r"/incoming/[^/]+/(?P<version>.+?)/?$")


class InvalidModel(SmltError):
    """A model file or card smlt cannot read (named, with what to do)."""


class DataRef(BaseModel):
    """Which data the model was trained on."""

    model_config = ConfigDict(extra="forbid")

    uri: str
    manifest_sha256: str | None = None  # of manifest.json, which lists every shard's sha256
    version: str | None = None  # a pipeline run's data version (incoming/<pipeline>/<version>/)


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["smlt-model/1"] = CARD_FORMAT
    run_id: str
    model: ModelSpec
    builtin: bool
    code: CodeSpec | None = None  # the user's code (`--code`): zip uri and sha256, and `transform`
    seed: int
    task: Literal["classification", "regression"]
    input_shape: list[int]
    input_dtype: Literal["float32", "int64"]
    output_dim: int
    vocab_size: int | None = None
    classes: list[str] | None = None
    # The dataset's manifest without its shard lists: the feature spec new data goes through.
    features: Manifest | None = None
    data: DataRef
    pipeline: str | None = None
    metrics: FinalMetrics | None = None
    model_sha256: str | None = None  # model.json only: the published model.safetensors

    @property
    def label(self) -> str | None:
        """The label column of a tabular dataset (the name predictions take in the user's units)."""
        return self.features.label if self.features else None


def build_card(
    run_id: str, job: Job, manifest: Manifest | None, manifest_raw: bytes | None, metrics: FinalMetrics | None
) -> ModelCard:
    """The card of a run's model, from its job and its dataset's manifest (None when the manifest
    could not be read: the card then says what the model is but not how to feed it new rows)."""
    features = None
    if manifest is not None:
        features = manifest.model_copy(
            update={
                "train": SplitInfo(rows=manifest.train.rows, shards=[]),
                "validation": SplitInfo(rows=manifest.validation.rows, shards=[]),
            }
        )
    found = _PIPELINE_DATA.search(job.dataset.uri) if job.pipeline else None
    return ModelCard(
        run_id=run_id,
        model=job.model,
        builtin=job.model.name in BUILTIN_MODELS,
        code=job.code,
        seed=job.seed,
        task=manifest.task if manifest else (metrics.task if metrics else "classification"),  # type: ignore[arg-type]
        input_shape=list(manifest.input_shape) if manifest else [],
        input_dtype="int64" if manifest and manifest.normalization.applied == "none" else "float32",
        output_dim=manifest.outputs if manifest else 0,
        vocab_size=manifest.vocab_size if manifest else None,
        classes=manifest.classes if manifest else None,
        features=features,
        data=DataRef(
            uri=job.dataset.uri,
            manifest_sha256=sha256_hex(manifest_raw) if manifest_raw is not None else None,
            version=found.group("version") if found else None,
        ),
        pipeline=job.pipeline,
        metrics=metrics,
    )


def card_of_run(run_id: str, job: Job, metrics: FinalMetrics | None = None) -> ModelCard:
    """The card of a finished run, its dataset's manifest read from `job.dataset.uri`. A manifest
    gone or unreadable by now leaves the card without the feature spec rather than failing the
    run's Finalize (the model is published all the same)."""
    try:
        raw: bytes | None = dataset_store(job.dataset.uri).get("manifest.json")
        manifest: Manifest | None = parse_manifest(raw or b"", f"{job.dataset.uri} manifest.json")
    except (NotFound, SmltError, ClientError, BotoCoreError) as e:
        log.warning("model card of %s: no feature spec, the dataset's manifest is unreadable (%s)", run_id, e)
        raw = manifest = None
    return build_card(run_id, job, manifest, raw, metrics)


def with_card(blob: bytes, card: ModelCard) -> bytes:
    """The safetensors blob with the card in its metadata (its other metadata kept); the tensors'
    bytes are copied as they are, never decoded."""
    tensors, meta, start = parse_header(blob[: 8 + header_length(blob)])
    header: dict[str, Any] = {"__metadata__": {**meta, METADATA_KEY: card.model_dump_json(exclude={"model_sha256"})}}
    header.update(tensors)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + blob[start:]


def card_json(card: ModelCard) -> bytes:
    """model.json's bytes."""
    return card.model_dump_json(indent=1).encode()


def parse_card(raw: bytes | str, where: str) -> ModelCard:
    """A card from model.json's bytes (or the metadata entry), or InvalidModel naming `where`."""
    try:
        return ModelCard.model_validate_json(raw)
    except ValidationError as e:
        raise InvalidModel(f"{where}: not an smlt model card ({describe(e, 'card', first=True)})") from None


def read_card(blob: bytes, where: str) -> ModelCard | None:
    """The card inside a model.safetensors blob, or None when it has none (a model published
    before smlt wrote cards); InvalidModel when the bytes are not a safetensors file."""
    try:
        _, meta, _ = parse_header(blob[: 8 + header_length(blob, where)], where)
    except ValueError as e:
        raise InvalidModel(str(e)) from None
    raw = meta.get(METADATA_KEY)
    return parse_card(raw, f"{where} (metadata {METADATA_KEY})") if raw is not None else None


def card_key(run_id: str) -> str:
    """model.json beside final/model.safetensors (smlt.runtime.keys.final_model_key)."""
    return f"runs/{run_id}/final/model.json"
