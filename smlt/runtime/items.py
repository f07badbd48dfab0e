"""The DynamoDB items of a run, one pydantic model each (their keys: `smlt/runtime/keys.py`; reads and
writes: `smlt/runtime/records.py`).

| sk | model | written by |
| --- | --- | --- |
| `META` | `MetaItem` | the first plan (`put_once`); `lr_scale` by a diverged round, `status`/`final` by finalize |
| `PLAN#r` | `PlanItem` | the planner, once per round; `attempts` by the aggregator's quorum retries |
| `WORKER#r#w` | `WorkerItem` | a worker, once, unless the round is sealed |
| `ERROR#r#w` | `ErrorItem` | a worker that failed for good (bad data, a shard it could not read, model too large) |
| `SEAL#r` | `SealItem` | the aggregator, when it closes round r |
| `ROUND#r` | `RoundItem` | the aggregator, once per round |
| `PREPARE` | `PrepareItem` | a raw upload's Prepare step (`put_once`), before the run's first plan |

Stored attribute names are the field names. None is not stored (`Item.attrs`): a missing
attribute reads back as None or the field's default, so a stop plan has no `workers` and items
written before a field existed still read. DynamoDB numbers come back as int or float
(`records.from_item`); the models validate either.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, field_serializer, field_validator

from smlt.runtime.data.manifest import TargetScaling
from smlt.runtime.job import Job
from smlt.runtime.roundspec import RoundSpec

STORED = {"stored": True}  # model_dump's context when an item is written to the table


class Item(BaseModel):
    """Base of the items: the attributes besides `pk` and `sk` (which the table adds)."""

    model_config = ConfigDict(extra="ignore")  # pk and sk come back with every item

    def attrs(self) -> dict[str, Any]:
        """The attributes to store: every field but those that are None or not finite. DynamoDB
        stores no Infinity or NaN (a forecast of "never", say, would fail the write): such a
        number is stored as unknown."""
        return {k: v for k, v in _finite(self.model_dump(exclude_none=True, context=STORED)).items() if v is not None}


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


class FinalMetrics(BaseModel):
    """The run's result: META's `final` (written by finalize) and metrics.json's `final`."""

    run_id: str
    task: str = "classification"  # which of the metrics below it has (smlt.runtime.evaluation)
    val_accuracy: float | None = None  # classification only
    val_loss: float | None = None
    val_rmse: float | None = None  # regression only, in the user's units (smlt.runtime.evaluation)
    val_r2: float | None = None
    val_balanced_accuracy: float | None = None  # the mean of the classes' recalls (classification)
    val_class_recall: list[float | None] | None = None  # by class index: the share of its rows predicted as it
    val_rows: int = 0  # validation rows the final metric was measured on (the whole split)
    rounds: int  # training rounds that led to the final model
    samples: int
    wall_seconds: float
    estimated_cost_usd: float
    stop_reason: str
    # Reports that arrived before their round closed but were not applied.
    model_key: str | None = None
    model_sha256: str | None = None  # of final/model.safetensors, as published
    # Of the training split's rows, the fraction in train shards that an applied update covered
    # (None: not measured); the shards never trained, by index.
    trained_fraction: float | None = None
    untrained_shards: list[int] = []


class MetaItem(Item):
    """The run: its validated job, who owns it, what the planner checked of the dataset."""

    run_id: str
    # The execution that drives the run: the first claims it, Chain hands it to the execution it
    # starts, a resume takes it over from one that has ended (steps/plan.py, `_claim`).
    execution: str
    job: Job
    status: Literal["RUNNING", "SUCCEEDED"]
    created_at: float  # epoch seconds
    train_rows: int
    train_shards: int
    val_rows: int = 0
    # classification: the validation rows of each class (the manifest's), the noise of balanced accuracy
    val_class_rows: list[int] | None = None
    dataset_bytes: int = 0
    shard_bytes: int = 0  # the largest shard (train or validation): what a worker holds at once
    features: int
    outputs: int
    task: str
    target: TargetScaling | None = None  # regression: the manifest's target scaling (the metrics' units)
    lr_scale: float = 1.0  # halved once when a round diverges
    model0_sha256: str | None = None  # round 0's model: the first worker to write or read it records it
    manifest_sha256: str | None = None  # the dataset's manifest.json as the run started on it
    # The account's unreserved Lambda concurrency, read at the run's first plan (None: not read).
    account_concurrency: int | None = None
    final: FinalMetrics | None = None

    @field_serializer("job")
    def _job(self, job: Job) -> dict[str, Any]:
        return job.model_dump(mode="json")  # as validated, None fields included (chain restarts from it)


class PlanItem(Item):
    """The planner's decision for a round. A train plan carries the round spec the workers and
    aggregators read (`spec`, stored as its JSON text)."""

    run_id: str
    round: int
    action: Literal["train", "stop"]
    reason: str
    bound: str = "none"
    # The planner's rule and notes (`planner.types.Rule`, `Note`; plain strings here: the items
    # do not import the planner); None / [] in items stored before they were recorded.
    rule: str | None = None
    notes: list[str] = Field(default_factory=list)
    predicted_round_s: float | None = None
    predicted_round_cost_usd: float | None = None
    planned_at: float
    execution: str
    execution_rounds: int = 1  # rounds planned by this execution so far (chain after rounds_per_execution)
    execution_events: int = 0  # Step Functions history events this execution has used so far
    plan_s: float = 0.0
    # Train plans only (the spec's values, kept at top level for readers of the table):
    workers: int | None = None
    memory_mb: int | None = None
    local_steps: int | None = None
    function_name: str | None = None
    aggregators: int = 1
    spec: RoundSpec | None = None
    stop_reason: str | None = None  # an evaluation-only round: why the run stops after it
    stop_rule: str | None = None  # and by which rule
    attempts: int = 0  # the aggregator's quorum retries of this round
    # The quorum attempt the Map runs now: Plan hands the stored plan out again after a quorum
    # retry and sets it to `attempts`. An Aggregate that finds `attempts` past it counted this
    # attempt already (its earlier invocation died after counting) and does not count it again.
    handed_out: int = 0
    # The planner's forecast of the rest of the run at this plan (adaptive planner; the ETA):
    # rounds, seconds and dollars to the end (the target, or max_rounds), median and 70th
    # percentile of the rounds needed; `elapsed_s` since the run started, at planning.
    eta_rounds: float | None = None
    eta_rounds_p70: float | None = None
    eta_s: float | None = None
    eta_s_p70: float | None = None
    eta_cost_usd: float | None = None
    eta_cost_usd_p70: float | None = None
    elapsed_s: float | None = None

    @field_validator("spec", mode="before")
    @classmethod
    def _spec_from_json(cls, v: Any) -> Any:
        return RoundSpec.model_validate_json(v) if isinstance(v, str | bytes) else v

    @field_serializer("spec")
    def _spec_to_json(self, spec: RoundSpec | None) -> str | None:
        return None if spec is None else spec.model_dump_json()


class WorkerItem(Item):
    """A worker's record of its round: what it trained, its evaluation of model r, its timings."""

    worker: int
    samples: int
    train_loss: float | None = None  # None when not finite
    finite: bool = True
    val_loss_sum: float = 0.0
    val_correct: int = 0
    val_count: int = 0
    # by class index (classification with up to evaluation.MAX_CLASS_SUMS classes, else empty)
    val_class_correct: list[int] = Field(default_factory=list)
    val_class_count: list[int] = Field(default_factory=list)
    memory_mb: int
    cold: bool = False
    update_bytes: int = 0
    load_s: float = 0.0
    eval_s: float = 0.0
    compute_s: float = 0.0
    upload_s: float = 0.0
    total_s: float = 0.0
    finished_at: float = 0.0
    cache_miss: bool = False
    steps: int = 0  # local steps actually taken (fewer than planned when `cut`)
    cut: bool = False  # stopped early at the plan's compute limit (its partial update still counts)
    # Seconds from the process's start to its first handler call (what AWS bills as INIT); set on
    # the cold invocation only, 0 on a warm one.
    init_s: float = 0.0
    update_sha256: str | None = None  # hex sha256 of the update object this record describes
    # Measured once per process on one batch (smlt.runtime.train.measure): training FLOPs per sample and
    # the activations the job's batch keeps for the backward pass. None in older records.
    flops_per_sample: float | None = None
    activation_mb: float | None = None


class ShardRef(BaseModel):
    """A dataset shard a worker could not read (a CorruptShard): which split, its index, its key."""

    split: Literal["train", "validation"]
    index: int
    key: str
    reason: str = ""  # "digest", "missing" or "unreadable"


class ErrorItem(Item):
    """A worker's non-transient error, re-raised by the aggregator under its own name."""

    error: str  # the class name in smlt.runtime.errors ("WorkerError": any other exception)
    message: str
    # The shard a CorruptShard names, or the train shard a worker was reading when another
    # exception came (a WorkerError): the planner moves it to another worker for the next round,
    # and the aggregator fails the run when it fails there too (CorruptShard, DataError).
    shard: ShardRef | None = None
    exception: str | None = None  # the exception's own type (IndexError, ...)
    worker: int | None = None
    round: int | None = None
    attempt: int = 0  # the round's quorum attempt it failed in


class StopItem(Item):
    """A request to stop the run cleanly (`RunTable.request_stop`): first request wins."""

    requested_at: float  # epoch seconds
    reason: str
    by: str = "user"  # "user" (the dashboard, `smlt stop`) or "study:<id>" (an early-stopped trial)


class PrepareItem(Item):
    """The execution that prepares a raw upload's run (smlt.runtime.steps.prepare): first writer
    wins, so a duplicated event's execution prepares nothing and ends as a duplicate."""

    execution: str
    key: str  # the upload's marker
    claimed_at: float  # epoch seconds


class SealItem(Item):
    sealed_at: float


class RoundTiming(BaseModel):
    """What a ROUND item keeps of each worker record (the planner's timing model reads these)."""

    worker: int
    memory_mb: int
    samples: int
    load_s: float = 0.0
    eval_s: float = 0.0
    compute_s: float = 0.0
    upload_s: float = 0.0
    total_s: float = 0.0
    cold: bool = False
    cache_miss: bool = False
    init_s: float = 0.0
    steps: int = 0
    cut: bool = False
    # A worker that left no record and that the Map reports failed: "TimeLimit" (cut off at the
    # task's timeout), "OutOfMemory", or the Step Functions error name. None: it reported.
    error: str | None = None

    @classmethod
    def of(cls, record: WorkerItem) -> RoundTiming:
        return cls.model_validate(record.model_dump(include=set(cls.model_fields)))


class Accepted(BaseModel):
    """An update the round applied (also the entries of a sharded round's accepted.json)."""

    worker: int
    samples: int


class Rejected(BaseModel):
    """An update the round read but did not apply, and why (its digest, its norm)."""

    worker: int
    reason: str


class RoundItem(Item):
    """An aggregated round: its plan's shape, the workers' combined evaluation of model r, the
    updates applied, the bill and the stop decision."""

    round: int
    workers: int  # planned
    workers_ok: int = 0  # reported before the seal
    workers_failed: int = 0
    memory_mb: int
    local_steps: int
    batch_size: int
    eval_only: bool = False
    diverged: bool = False
    samples: int = 0
    accepted: list[Accepted] = Field(default_factory=list)
    rejected: list[Rejected] = Field(default_factory=list)  # reported, read and refused (never averaged)
    train_loss: float | None = None
    # Of model r, the one the round started from, over the whole validation split only: None when
    # a worker's slice is missing (the partial values below), so no stop decision can read them.
    # (smlt.runtime.evaluation.val_metrics: accuracy for classification, RMSE and R² for regression.)
    val_loss: float | None = None
    val_accuracy: float | None = None
    val_rmse: float | None = None
    val_r2: float | None = None
    val_balanced_accuracy: float | None = None
    val_class_recall: list[float | None] | None = None
    val_rows: int = 0  # validation rows evaluated
    val_rows_total: int | None = None  # rows in the split (META's val_rows)
    val_loss_partial: float | None = None  # over the val_rows evaluated, when not the whole split
    val_accuracy_partial: float | None = None
    val_rmse_partial: float | None = None
    val_r2_partial: float | None = None
    val_balanced_accuracy_partial: float | None = None
    val_class_recall_partial: list[float | None] | None = None
    aggregate_s: float = 0.0
    aggregators: int = 1
    round_s: float = 0.0  # from plan to aggregated
    cost_usd: float = 0.0
    cost_total_usd: float = 0.0  # the ledger so far
    param_count: int = 0
    flops_per_sample: float | None = None  # training FLOPs per sample, as the workers measured them
    activation_mb: float | None = None  # a batch's activations, as the workers measured them
    stop: bool = False
    reason: str = ""
    plan_reason: str = ""
    time_limit_s: float | None = None  # the worker compute limit the plan set
    finished_at: float = 0.0
    timings: list[RoundTiming] = Field(default_factory=list)
    model_sha256: str | None = None  # hex sha256 of model r+1, the model this round wrote

    @field_serializer("timings")
    def _timings(self, timings: list[RoundTiming], info: SerializationInfo) -> list[dict[str, Any]]:
        # Stored without defaults (a warm, uncut worker): the item is priced per KB and grows with
        # n. Everywhere else (metrics.json, history) every field is there.
        stored = bool(info.context and info.context.get("stored"))
        return [t.model_dump(exclude_defaults=stored) for t in timings]


def data_error_message(now: ErrorItem, before: ErrorItem) -> str:
    """The DataError of one error seen twice on one shard: which shard, the exception, where."""
    shard = now.shard
    what = f"{shard.split} shard {shard.key or shard.index}" if shard else "the same shard"
    cause = ""
    if "out of bounds" in now.message and now.exception == "IndexError":
        cause = " (its labels are outside the dataset's classes)"
    return (
        f"{what} failed twice with {now.message}{cause}: on worker {before.worker} in round {before.round} "
        f"(attempt {before.attempt + 1}) and on worker {now.worker} in round {now.round} (attempt {now.attempt + 1}); "
        "the data, not the platform, is the cause: check that shard's rows and prepare the dataset again "
        "(`smlt data prepare SOURCE --out FOLDER`), then start the run again"
    )
