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


class StudySettings(BaseSettings):
    """The controller's environment: `smlt.runtime.config.Settings`' fields read by STUDY, and only those
    (a deployed function has no cdk.json for the other fields' defaults)."""

    model_config = ENV

    artifacts_bucket: str
    table: str
