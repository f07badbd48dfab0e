"""The study controller's Lambda events (discriminated on `op`), as the study state machine
sends them (`infra/stacks/study.py`), and the environment the controller reads."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic_settings import BaseSettings

from smlt.runtime.config import ENV


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InitEvent(_Event):
    op: Literal["init"]
    study: dict[str, Any]  # the study file (validated by the controller: named errors)
    execution: str | None = None


class AdmitEvent(_Event):
    op: Literal["admit"]
    study_id: str
    trial: int


class EndedEvent(_Event):
    op: Literal["ended"]
    study_id: str
    trial: int
    error: dict[str, Any] | None = None  # the Catch's {Error, Cause} when the execution failed


class WatchEvent(_Event):
    op: Literal["watch"]
    study_id: str


class FinishEvent(_Event):
    op: Literal["finish"]
    study_id: str


StudyEvent = Annotated[InitEvent | AdmitEvent | EndedEvent | WatchEvent | FinishEvent, Field(discriminator="op")]
STUDY_EVENTS: TypeAdapter[StudyEvent] = TypeAdapter(StudyEvent)


class _Answer(BaseModel):
    """What a step answers the study machine (dumped without the fields it did not set)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class InitAnswer(_Answer):
    study_id: str
    trials: list[int]  # the Map's items
    concurrency: int
    poll_seconds: int  # the Wait state's SecondsPath: whole seconds


class AdmitAnswer(_Answer):
    start: bool
    run_id: str | None = None  # start: the trial's execution name and its job
    job: dict[str, Any] | None = None
    reason: str | None = None  # not started: why


class EndedAnswer(_Answer):
    trial: int
    status: str
    cost_usd: float | None = None
    metric: float | None = None


class WatchAnswer(_Answer):
    done: bool  # every trial ended
    running: int
    stopped: int
    poll_seconds: int  # the wait before the next look (the Wait state's SecondsPath: whole seconds)


class FinishAnswer(_Answer):
    """The study's result (the execution's output; `study/<id>/best/metrics.json` without `status`)."""

    study_id: str
    status: Literal["SUCCEEDED", "FAILED"]
    spent_usd: float
    best_trial: int | None = None
    best_run_id: str | None = None
    metric: str | None = None
    value: float | None = None
    params: dict[str, Any] | None = None
    budget_usd: float | None = None


class StudySettings(BaseSettings):
    """The controller's environment: `smlt.runtime.config.Settings`' fields read by STUDY, and only those
    (a deployed function has no cdk.json for the other fields' defaults)."""

    model_config = ENV

    artifacts_bucket: str
    table: str
