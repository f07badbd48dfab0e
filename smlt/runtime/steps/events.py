"""The events the state machine sends its Lambda functions and the answers it reads back
(`infra/stacks/workflow.py`; docs/architecture.md, "Payload shapes").

Events are discriminated on `op`. The state machine sends `op` to some tasks and not others
(Aggregate, TrainWorker): where it is absent the function's default op applies, here in the model.
Answers dump (`model_dump(mode="json")`) to exactly the JSON the state machine reads (`$.plan.*`,
`$.agg.*`): a key that is there only sometimes (`retry`, `duplicate`) is left out when unset.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator

from smlt.runtime.errors import SmltError
from smlt.runtime.fanout import Kind
from smlt.runtime.validation import describe


class InvalidEvent(SmltError):
    """A Lambda event that does not validate; the message names the field."""


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt payload key fails, naming it


def _op_or(default: str):
    """A discriminator reading `op`, or `default` when the state machine sent none."""

    def op(v: Any) -> str:
        return v.get("op", default) if isinstance(v, dict) else getattr(v, "op", default)

    return Discriminator(op)


# --- planner: plan (default), chain, finalize ---


class PlanEvent(_Event):
    op: Literal["plan"] = "plan"
    # The execution input: a job, or an upload trigger's {"trigger": ...}; plan_next validates it
    # (a bad job is InvalidJob, naming the job's field).
    job: Any = None
    execution: str = "run"
    # The state machine's ARN ($$.StateMachine.Id): where the run's driving execution is looked up.
    state_machine: str | None = None

    @field_validator("execution", mode="before")
    @classmethod
    def _execution(cls, v: Any) -> Any:
        return v or "run"


class ChainEvent(_Event):
    op: Literal["chain"]
    job: dict[str, Any]
    run_id: str
    round: int
    state_machine: str  # the state machine's ARN


class FinalizeEvent(_Event):
    op: Literal["finalize"]
    run_id: str


PlannerEvent = Annotated[
    Annotated[PlanEvent, Tag("plan")] | Annotated[ChainEvent, Tag("chain")] | Annotated[FinalizeEvent, Tag("finalize")],
    _op_or("plan"),
]


class PlanTrain(BaseModel):
    """A round to train: the Map's items, concurrency and function, the aggregators' slices."""

    action: Literal["train"] = "train"
    run_id: str
    round: int
    workers: list[int]
    function_name: str
    memory_mb: int
    local_steps: int
    max_concurrency: int
    fanout: Kind  # the Map that runs the workers: HowToTrain follows it (smlt.runtime.fanout)
    aggregators: int
    slices: list[int]
    worker_timeout_s: int  # Step Functions stops waiting for a straggler after this
    reason: str


class PlanOther(BaseModel):
    """Nothing to train: stop (Finalize), chain (a fresh execution) or duplicate (another owns the run)."""

    action: Literal["stop", "chain", "duplicate"]
    run_id: str
    round: int
    reason: str


PlanAnswer = PlanTrain | PlanOther


class ChainAnswer(BaseModel):
    execution_arn: str
    name: str


class FinalizeAnswer(BaseModel):
    run_id: str
    val_accuracy: float | None
    rounds: int
    estimated_cost_usd: float


# --- aggregate: aggregate (default), prepare, slice, finish ---


class AggregateEvent(_Event):
    op: Literal["aggregate"] = "aggregate"
    run_id: str
    round: int
    # The Map's outcomes travel in the event for the execution history; what counts is DynamoDB.
    outcomes: list[dict[str, Any]] = Field(default_factory=list)


class PrepareEvent(_Event):
    op: Literal["prepare"]
    run_id: str
    round: int


class SliceEvent(_Event):
    op: Literal["slice"]
    run_id: str
    round: int
    slice: int  # j
    of: int  # k aggregators


class FinishEvent(_Event):
    op: Literal["finish"]
    run_id: str
    round: int


AggregateFunctionEvent = Annotated[
    Annotated[AggregateEvent, Tag("aggregate")]
    | Annotated[PrepareEvent, Tag("prepare")]
    | Annotated[SliceEvent, Tag("slice")]
    | Annotated[FinishEvent, Tag("finish")],
    _op_or("aggregate"),
]


class RoundAnswer(BaseModel):
    """Aggregate's and finish's answer; Continue reads `stop`. Metrics rounded to 6 decimals."""

    round: int
    stop: bool
    # A quorum retry: Continue goes back to Plan, which returns the same round's plan.
    retry: bool = Field(default=False, exclude_if=operator.not_)
    reason: str = ""
    val_accuracy: float | None = None
    val_loss: float | None = None
    cost_usd: float | None = None


class Prepared(BaseModel):
    """prepare's answer when the slices should run (Prepared reads `proceed`)."""

    round: int
    proceed: Literal[True] = True
    stop: Literal[False] = False
    accepted: int
    aggregators: int


class NotPrepared(RoundAnswer):
    """prepare's answer for a quorum retry or a round already aggregated: the round answer."""

    proceed: Literal[False] = False


class SliceAnswer(BaseModel):
    """A slice's answer (discarded by the state machine): a non-finite slice wrote nothing."""

    slice: int
    finite: bool
    seconds: float | None = Field(default=None, exclude_if=lambda v: v is None)
    skipped: bool | None = Field(default=None, exclude_if=lambda v: v is None)  # already written


# --- train_step: one event ---


class TrainEvent(_Event):
    run_id: str
    round: int
    worker: int


class TrainAnswer(BaseModel):
    """TrainWorker's ResultSelector reads `worker`."""

    worker: int
    samples: int
    duplicate: bool = Field(default=False, exclude_if=operator.not_)  # answered from the stored record


# --- prepare: a raw upload's Prepare step (smlt.runtime.steps.prepare) ---


class PrepareDataEvent(_Event):
    op: Literal["prepare_data"] = "prepare_data"
    trigger: dict[str, Any]  # the upload trigger's {bucket, key, etag, sequencer}
    execution: str


class PrepareFailedEvent(_Event):
    """PrepareData failed for good (its error caught by the state machine after its retries):
    the upload's refusal told to the team's topic unless PrepareData told it already."""

    op: Literal["prepare_failed"] = "prepare_failed"
    trigger: dict[str, Any]
    execution: str
    error: dict[str, Any]  # the Catch's {Error, Cause}


class PartItem(BaseModel):
    """One part of a table in many files: an item of the parts' Distributed Maps."""

    part: int
    key: str  # the part's object in the data bucket


class DataPrepared(BaseModel):
    """PrepareData's answer; the DataPrepared Choice reads `action` ("duplicate": another
    execution owns the run, which ends here; "plan": on to Plan, which trains on `dataset`;
    "parts": a table in many files, prepared by the parts' Maps over `parts`)."""

    action: Literal["plan", "duplicate", "parts"]
    run_id: str
    dataset: str  # s3:// URI of the prepared dataset
    reason: str
    rows: int | None = Field(default=None, exclude_if=lambda v: v is None)
    # What preparing said (a new column ignored, files skipped), for the execution's history.
    notes: list[str] = Field(default_factory=list, exclude_if=operator.not_)
    # action "parts": the items of the Maps, and what their steps read (smlt.runtime.steps.prepare_parts)
    parts: list[PartItem] = Field(default_factory=list, exclude_if=operator.not_)
    bucket: str | None = Field(default=None, exclude_if=lambda v: v is None)
    folder: str | None = Field(default=None, exclude_if=lambda v: v is None)  # the prepared dataset's key prefix
    text: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)  # columns read as text


class _PartsStep(_Event):
    """A step of a table in parts (smlt.runtime.steps.prepare_parts): the run, its bucket and the
    prepared dataset's folder (its scratch is `<folder>/_parts/`)."""

    run_id: str
    bucket: str
    folder: str
    execution: str


class PartStatsEvent(_PartsStep):
    op: Literal["part_stats"]
    part: int
    key: str
    text: list[str] = []  # columns read as text in every part (a part held text in them)


class PartMomentsEvent(_PartsStep):
    op: Literal["part_moments"]
    part: int
    key: str


class PartShardsEvent(_PartsStep):
    op: Literal["part_shards"]
    part: int
    key: str


class MergeEvent(_PartsStep):
    """After a Map: its children's answers (a failed child's error and cause, caught in the child)."""

    op: Literal["merge_stats", "merge_moments", "finish_parts"]
    results: list[dict[str, Any]]


class StatsMerged(BaseModel):
    """MergeStats' answer: `again` (with `text`) when a column held text in some part and numbers
    in another, so every part is read again with it as text."""

    again: bool
    text: list[str] = []


PrepareFunctionEvent = Annotated[
    Annotated[PrepareDataEvent, Tag("prepare_data")]
    | Annotated[PrepareFailedEvent, Tag("prepare_failed")]
    | Annotated[PartStatsEvent, Tag("part_stats")]
    | Annotated[PartMomentsEvent, Tag("part_moments")]
    | Annotated[PartShardsEvent, Tag("part_shards")]
    | Annotated[MergeEvent, Tag("merge_stats")]
    | Annotated[MergeEvent, Tag("merge_moments")]
    | Annotated[MergeEvent, Tag("finish_parts")],
    _op_or("prepare_data"),
]

E = TypeVar("E")

PLANNER_EVENTS: TypeAdapter[PlanEvent | ChainEvent | FinalizeEvent] = TypeAdapter(PlannerEvent)
AGGREGATE_EVENTS: TypeAdapter[AggregateEvent | PrepareEvent | SliceEvent | FinishEvent] = TypeAdapter(
    AggregateFunctionEvent
)
TRAIN_EVENTS: TypeAdapter[TrainEvent] = TypeAdapter(TrainEvent)
PREPARE_DATA_EVENTS: TypeAdapter[PrepareDataEvent] = TypeAdapter(PrepareDataEvent)
PREPARE_EVENTS: TypeAdapter[
    PrepareDataEvent | PrepareFailedEvent | PartStatsEvent | PartMomentsEvent | PartShardsEvent | MergeEvent
] = TypeAdapter(PrepareFunctionEvent)


def parse_event(adapter: TypeAdapter[E], event: Any) -> E:
    """The event as its model, or InvalidEvent naming each bad field (`op.field: message`)."""
    try:
        return adapter.validate_python(event)
    except ValidationError as e:
        raise InvalidEvent(describe(e, _whole)) from None


def _whole(error_type: str) -> str:
    """What an error without a location is about: an unknown op is the op; any other, the event."""
    return "op" if error_type.startswith("union_tag") else "event"
