"""The job: one pydantic model for the execution input.

The Step Functions console input, the CLI's job file and the planner's event all validate
against `Job`, so a field means the same thing everywhere. `parse_job` turns any validation
failure into `InvalidJob` whose message names the offending field.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.errors import InvalidJob
from smlt.runtime.evaluation import AT_MOST_ONE, TargetMetric, balanced_problem, target_metric_problem
from smlt.runtime.strict import UserModel
from smlt.runtime.tensors.codec import Codec
from smlt.runtime.validation import FieldError, field_errors, unknown_field_hint

# Built-in model names (their builders: smlt.runtime.train.models.BUILTINS); anything else must look like
# "package.module:function".
BUILTIN_MODELS = ("mlp", "logreg", "lenet", "resnet18", "resnet34", "resnet50", "transformer")
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")
# Workers of one round: Lambda's default concurrency quota per region. More could never run at
# once on AWS, and on the local engine they queue for minutes on a few processes.
MAX_WORKERS = 1000
# Rows one worker samples in a round (batch_size x local_steps): its sample order is an int64
# array of this many entries (80 MB), and no Lambda finishes more steps within its 15 minutes.
MAX_ROUND_SAMPLES = 10_000_000


class _Strict(UserModel):
    pass


class DatasetSpec(SourceOptions):
    """Where the prepared (sharded) dataset lives, and how the CLI prepares a local source.

    `s3://bucket/prefix/` on AWS. The CLI also accepts a local folder holding a manifest, a
    .csv/.parquet/.xlsx/.npz file, an image folder, `sklearn:NAME` or `synthetic:...`; it prepares those
    with the options (`label`, `task`, `missing`, `drop`, `date_order`, `encoding`, `image_size`, `channels`,
    `vocab_size`: see `smlt.runtime.data.options`), uploads them and rewrites the URI.
    """

    uri: str = Field(min_length=1)


class ModelSpec(_Strict):
    """A built-in model (BUILTIN_MODELS; README "Models") or a user's `package.module:build_model`.

    The builder is called as `build_model(input_shape, output_dim, **params)` and returns a
    `torch.nn.Module`.
    """

    name: str = "mlp"
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v in BUILTIN_MODELS or _ENTRYPOINT.match(v):
            return v
        raise ValueError(
            f"unknown model {v!r}: use one of {', '.join(BUILTIN_MODELS)} "
            "or an entry point 'package.module:build_model'"
        )


class TrainingSpec(_Strict):
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    learning_rate: PositiveFloat = 0.05
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    batch_size: PositiveInt = 32
    # Local SGD steps per worker per round (k). The planner may change it round by round.
    local_steps: PositiveInt = 20
    max_rounds: PositiveInt = 50
    # val_loss: any task; val_accuracy, val_balanced_accuracy (the mean of the classes' recalls, up to
    # 1,000 classes): classification; val_rmse, val_r2: regression (smlt.runtime.evaluation).
    target_metric: TargetMetric = "val_accuracy"
    target_value: float | None = Field(default=None, ge=0.0)
    # Server-side step applied to the averaged delta (1.0 = plain FedAvg).
    server_lr: PositiveFloat = 1.0
    # Fraction of assigned workers whose updates must arrive for a round to count.
    quorum: float = Field(default=0.5, gt=0.0, le=1.0)
    mode: Literal["local_sgd", "sync"] = "local_sgd"
    compression: Codec = "none"  # smlt.runtime.tensors.codec: the one list of update codecs
    # Image augmentation of training batches (smlt.runtime.train.augment): random crop with padding, horizontal flip.
    augment: list[Literal["crop", "flip"]] = []
    # Classification: "balanced" weighs each class's rows in the training loss by
    # rows / (classes x its train rows) (scikit-learn's rule), so a rare class counts as much as a
    # common one; the validation loss stays unweighted.
    class_weights: Literal["none", "balanced"] = "none"
    # A run that ended without training some train shard at all fails (PartialData) unless this
    # is true; its final metrics report the fraction of the training split that was trained.
    allow_partial_data: bool = False

    @field_validator("local_steps")
    @classmethod
    def _bounded_round(cls, v: int, info: ValidationInfo) -> int:
        b = info.data.get("batch_size", 1)  # absent when batch_size itself failed
        if b * v > MAX_ROUND_SAMPLES:
            raise ValueError(
                f"{v} steps of batch_size {b} is {b * v:,} rows per worker per round, at most "
                f"{MAX_ROUND_SAMPLES:,}: lower local_steps (the adaptive planner chooses it for you)"
            )
        return v

    @field_validator("target_value")
    @classmethod
    def _fraction(cls, v: float | None, info: ValidationInfo) -> float | None:
        metric = info.data.get("target_metric")
        if v is not None and v > 1 and metric in AT_MOST_ONE:
            raise ValueError(
                "val_r2 is at most 1 (1 is a perfect fit, 0 no better than the mean)"
                if metric == "val_r2"
                else f"{metric} is a fraction of at most 1 (0.96 means 96 %)"
            )
        return v


class Constraints(_Strict):
    deadline_seconds: PositiveFloat | None = None
    budget_usd: PositiveFloat | None = None
    # "cost": cheapest plan that meets the deadline; "speed": fastest plan within the budget.
    objective: Literal["cost", "speed"] = "cost"
    # Train even when the planner predicts the constraints cannot be met.
    best_effort: bool = False


class WorkersSpec(_Strict):
    initial: PositiveInt = 4
    min: PositiveInt = 1
    max: PositiveInt = 64
    # Pin the memory tier (MB); None lets the planner choose among the deployed tiers.
    memory_mb: PositiveInt | None = None
    # Planner: "fixed" keeps (initial, memory, local_steps); "adaptive" optimises them.
    planner: Literal["fixed", "adaptive"] = "fixed"
    # Runs that share the account's Lambda concurrency at once (a study sets its trials' to its
    # `concurrency`): the planner gives this run its part of it (smlt.runtime.account.worker_slots).
    concurrent_runs: PositiveInt = 1

    @field_validator("initial", "min", "max")
    @classmethod
    def _at_most(cls, v: int) -> int:
        if v > MAX_WORKERS:
            raise ValueError(f"at most {MAX_WORKERS} workers (Lambda's default concurrency per region)")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> WorkersSpec:
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"need min <= initial <= max, got min={self.min}, initial={self.initial}, max={self.max}")
        return self


class CodeSpec(_Strict):
    """The user's own code (smlt.runtime.usercode): the zip the CLI stored for `--code DIR` (`uri`,
    `sha256`, set by the CLI) and an optional per-sample `transform` entry point. Without `uri`,
    entry points import from the worker's own path (PYTHONPATH locally; on AWS, only the image's)."""

    uri: str | None = Field(default=None, pattern=r"^s3://[^/]+/.+")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    transform: str | None = None

    @field_validator("transform")
    @classmethod
    def _entry_point(cls, v: str | None) -> str | None:
        if v is not None and not _ENTRYPOINT.match(v):
            raise ValueError(f"{v!r} is not an entry point 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _both(self) -> CodeSpec:
        if (self.uri is None) != (self.sha256 is None):
            raise ValueError("code: give both uri and sha256, or neither (pass --code DIR and the CLI sets them)")
        return self


class TrackingSpec(_Strict):
    """Where the client logs the run for a team's own tracking (smlt.tracking; client-side
    only: the runtime carries the field and never reads it). `mlflow_uri`: an MLflow tracking
    URI (`http(s)://...`, `file:///...`, `databricks`, a SageMaker MLflow ARN); without it, the
    MLFLOW_TRACKING_URI environment variable. `mlflow_experiment`: the experiment (default: the
    MLFLOW_EXPERIMENT_NAME environment variable, else the job's `name`)."""

    mlflow_uri: str | None = Field(default=None, min_length=1)
    mlflow_experiment: str | None = Field(default=None, min_length=1, max_length=256)


class Job(_Strict):
    """The execution input of a training run."""

    name: str = Field(default="job", max_length=64)
    # Run id; defaults to the Step Functions execution name. Must be S3-key and DynamoDB safe.
    run_id: str | None = None
    dataset: DatasetSpec
    model: ModelSpec = Field(default_factory=ModelSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    constraints: Constraints = Field(default_factory=Constraints)
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    code: CodeSpec | None = None
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    seed: NonNegativeInt = 0
    # Retraining pipeline this run belongs to (set by the upload trigger); its final model
    # becomes the pipeline's latest, which the next upload warm-starts from.
    pipeline: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # A pipeline's gate (smlt.runtime.pipeline): a retrained model is promoted only if its target
    # metric is not worse than the champion's on the same validation rows by more than this.
    promotion_margin: float = Field(default=0.0, ge=0.0)
    # ... and only when the version's validation split holds at least this many rows (a version's
    # first included: pipeline.MIN_GATE_ROWS, the default, is the line prepare warns at).
    promotion_min_rows: PositiveInt = 30
    # Start from this model (s3://.../model.safetensors) instead of a fresh initialisation.
    warm_start: str | None = None
    # Rounds one Step Functions execution runs before it chains into a fresh one that resumes
    # from the checkpoint (keeps each execution far below the 25,000-event history limit).
    rounds_per_execution: PositiveInt = Field(default=200, le=1000)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str | None) -> str | None:
        if v is not None and not _RUN_ID.match(v):
            raise ValueError("run_id must be 1-80 characters of letters, digits, '-' or '_'")
        return v


# The job's words for pydantic's common errors (finite_number: JSON's Infinity / NaN, which
# json.loads accepts).
_WORDS = {"missing": "field required", "extra_forbidden": "unknown field", "finite_number": "must be a finite number"}


def problems(e: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """Each bad field of a job (or a study, `model`) as `path: words (got value)`, an unknown
    field with where it belongs or the name it is closest to."""
    model = model or Job
    out = []
    for err in field_errors(e, "job"):
        hint = unknown_field_hint(model, err.loc) if err.type == "extra_forbidden" else ""
        out.append(f"{err.path}: {_WORDS.get(err.type, err.message)}{hint}{_got(err)}")
    return out


def _got(err: FieldError) -> str:
    """The value that did not validate, shortened: none for a missing field or a whole section."""
    if err.type == "missing" or isinstance(err.input, dict):
        return ""
    return f" (got {json.dumps(err.input, default=str)[:60]})"


def json_object(raw: Any, what: str) -> dict[str, Any]:
    """Raw input (dict, JSON text or bytes) as a JSON object, or InvalidJob naming `what` (a job,
    a study) and where the JSON is broken."""
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InvalidJob(f"{what}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(raw, dict):
        raise InvalidJob(f"{what}: expected a JSON object, got {type(raw).__name__}")
    return raw


def parse_job(raw: Any) -> Job:
    """Validate raw input (dict, JSON text or bytes) into a Job, or raise InvalidJob naming the field."""
    raw = json_object(raw, "job")
    if "job" in raw and "space" in raw and "dataset" not in raw:
        raise InvalidJob(
            "job: this is a study (it has `job` and `space`), not a job: run it with `smlt tune FILE` "
            "(docs/studies.md); its `job` section is a job"
        )
    try:
        return Job.model_validate(raw)
    except ValidationError as e:
        raise InvalidJob("; ".join(problems(e))) from None


def _check_balanced(tr: TrainingSpec, manifest: Manifest) -> None:
    """A val_balanced_accuracy target on a classification dataset: measured (at most 1,000
    classes), and not met by a model that predicts one class for every row (1/k)."""
    problem = balanced_problem(tr.target_metric, manifest.outputs)
    if problem:
        raise InvalidJob(problem)
    chance = 1.0 / max(manifest.outputs, 1)
    if tr.target_value is not None and tr.target_value <= chance:
        raise InvalidJob(
            f"training.target_value: val_balanced_accuracy {tr.target_value:g} is met by always predicting one "
            f"class ({chance:.4g} with {manifest.outputs} classes), so the run could stop with a model that "
            f"learned nothing: set a target above {chance:.4g}"
        )


def check_dataset(job: Job, manifest: Manifest) -> None:
    """What a job asks of its dataset that the dataset cannot give: InvalidJob naming the field."""
    ds, tr = job.dataset, job.training
    if ds.task is not None and ds.task != manifest.task:
        raise InvalidJob(f"dataset.task: {ds.task}, but {manifest.name} was prepared for {manifest.task}")
    if ds.label is not None and manifest.label is not None and ds.label != manifest.label:
        raise InvalidJob(f"dataset.label: {ds.label!r}, but {manifest.name} was prepared with label {manifest.label!r}")
    problem = target_metric_problem(tr.target_metric, manifest.task)
    # (val_accuracy is the default, so a regression job without a target may keep it; balanced
    # accuracy is always asked for: a pipeline's gate or a study compares it even without a target)
    if problem and (tr.target_value is not None or tr.target_metric == "val_balanced_accuracy"):
        raise InvalidJob(problem)
    if tr.target_metric == "val_balanced_accuracy":
        _check_balanced(tr, manifest)
    if tr.augment and len(manifest.x.shape) != 3:
        shape = "x".join(map(str, manifest.x.shape))
        raise InvalidJob(
            f"training.augment: {', '.join(tr.augment)} augment images (channels x height x width); "
            f"{manifest.name}'s samples are {shape}: leave training.augment empty"
        )
    if tr.class_weights == "balanced" and manifest.task != "classification":
        raise InvalidJob(
            f"training.class_weights: balanced weighs classes, and {manifest.name} is a {manifest.task} dataset; "
            'leave it "none"'
        )
    if tr.class_weights == "balanced" and manifest.train.class_counts is None:
        raise InvalidJob(
            f"training.class_weights: {manifest.name} was prepared before its class counts were recorded; "
            "prepare it again"
        )
    if tr.batch_size > manifest.train.rows:
        raise InvalidJob(
            f"training.batch_size: {tr.batch_size} is larger than the whole training split "
            f"({manifest.train.rows} rows of {manifest.name}): use at most {manifest.train.rows}"
        )
