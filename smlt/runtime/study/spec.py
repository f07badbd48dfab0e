"""The study file: a job, a search space over its training and model parameters, and the
study's limits. One pydantic model (`Study`), validated like the job: `parse_study` turns any
failure into `InvalidJob` whose message names the field (`study.space.training.learning_rate`,
`study.job.training.batch_size`, ...).

    {"name": "digits-study", "job": {...}, "trials": 12, "metric": "val_accuracy",
     "space": {"training.learning_rate": {"log_range": [0.003, 0.3]},
               "training.batch_size": {"choices": [16, 32, 64]},
               "model.params.hidden": {"choices": [[32], [64], [128, 64]]}},
     "budget_usd": 0.2, "deadline_seconds": 900, "concurrency": 4,
     "search": {"kind": "asha", "min_rounds": 1, "reduction_factor": 3}, "seed": 0}
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from smlt.runtime.errors import InvalidJob
from smlt.runtime.evaluation import TargetMetric, lower_is_better
from smlt.runtime.job import Job, json_object, parse_job, problems
from smlt.runtime.strict import PlainUserModel, UserModel, no_bool_for_number
from smlt.runtime.study.budget import DEADLINE_MARGIN_S
from smlt.runtime.validation import field_errors

_STUDY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")
# What a study may search: the job's training section and its model's parameters.
SEARCHABLE = ("training.", "model.params.")
# Trials one study may run: each is an execution, a META and a TRIAL item.
MAX_TRIALS = 1000
# The study execution's history (25,000 events for a Standard execution): ~20 events per trial
# (its Map iteration: Admit, RunTrial, TrialEnded) and 9 per watcher loop, at most
# deadline / poll_seconds loops; the rest is Init, Run and Finish.
HISTORY_EVENTS, EVENTS_PER_TRIAL, EVENTS_PER_POLL, EVENTS_FIXED = 25_000, 20, 9, 50
MIN_POLL_S = 2  # the shortest default poll (smlt.runtime.study.budget.MIN_POLL_S)


class _Strict(UserModel):
    pass


class Choices(_Strict):
    """One of the listed values (any JSON: numbers, strings, lists such as layer widths)."""

    choices: list[Any] = Field(min_length=1)


class Range(_Strict):
    """A uniform value in [low, high]; whole numbers when `integer`. Grid search takes `points`
    evenly spaced values (the ends included)."""

    range: tuple[float, float]
    integer: bool = False
    points: PositiveInt = 3

    @field_validator("range")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError(f"range: need low < high, got {list(v)}")
        return v


class LogRange(_Strict):
    """A log-uniform value in [low, high] (both > 0): learning rates, weight decays. Grid search
    takes `points` values evenly spaced in log."""

    log_range: tuple[PositiveFloat, PositiveFloat]
    integer: bool = False
    points: PositiveInt = 3

    @field_validator("log_range")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError(f"log_range: need low < high, got {list(v)}")
        return v


Param = Choices | Range | LogRange


class Random(PlainUserModel):
    kind: Literal["random"] = "random"


class Grid(PlainUserModel):
    """Every combination of the space's values (choices; a range's `points`), in order; a study
    with fewer trials than combinations runs the first ones."""

    kind: Literal["grid"]


class Asha(PlainUserModel):
    """Asynchronous successive halving over randomly sampled trials: a trial that reaches a rung
    (a number of training rounds) goes on only if its metric there is in the best
    1/reduction_factor of the values recorded at that rung so far; otherwise it is stopped and the
    budget it did not spend returns to the study. Rungs: `rungs` as given, or min_rounds x
    reduction_factor^k below the job's max_rounds."""

    kind: Literal["asha"]
    min_rounds: PositiveInt = 1
    reduction_factor: int = Field(default=3, ge=2)
    rungs: list[PositiveInt] | None = None
    _no_bool = field_validator("min_rounds", "reduction_factor", mode="before")(classmethod(no_bool_for_number))

    @field_validator("rungs")
    @classmethod
    def _increasing(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(a >= b for a, b in zip(v, v[1:], strict=False))):
            raise ValueError("rungs: a non-empty list of increasing round counts")
        return v


Search = Annotated[Random | Grid | Asha, Field(discriminator="kind")]


class WarmStart(_Strict):
    """Start every trial from another study's best model (`studies/<id>/best/` of the stack's
    artifacts bucket, published when that study ended)."""

    study: str = Field(pattern=_STUDY_ID.pattern)


class Study(_Strict):
    """A hyper-parameter study: many ordinary runs of `job` under one budget and deadline."""

    name: str = Field(default="study", max_length=48)
    # The study's id (STUDY#<id>); defaults to the name and the start time.
    study_id: str | None = Field(default=None, pattern=_STUDY_ID.pattern)
    job: Job
    space: dict[str, Param] = Field(min_length=1)
    trials: int = Field(ge=1, le=MAX_TRIALS)
    # Which way it improves: smlt.runtime.evaluation.lower_is_better. Default: the job's target metric.
    metric: TargetMetric | None = None
    budget_usd: PositiveFloat
    deadline_seconds: PositiveFloat
    concurrency: PositiveInt = 4
    search: Search = Field(default_factory=Random)
    seed: NonNegativeInt = 0
    warm_start: WarmStart | None = None
    # How often the study's watcher reads the trials' curves (ASHA, deadline); a shorter wait
    # stops a bad trial sooner and costs more state transitions. None (the default): once per
    # round of the running trials (smlt.runtime.study.budget.next_poll), within the reserve for it.
    poll_seconds: int | None = Field(default=None, ge=1, le=3600)
    # A trial is started only while at least this long is left before the study's deadline
    # (besides its rounds: the planner's start, one evaluation round and the finalize).
    min_trial_seconds: PositiveFloat = 30.0

    @field_validator("space")
    @classmethod
    def _searchable(cls, v: dict[str, Param]) -> dict[str, Param]:
        for path in v:
            if not path.startswith(SEARCHABLE) or path in SEARCHABLE or ".." in path or path.endswith("."):
                raise ValueError(
                    f"{path!r}: a study searches the job's training and model parameters: "
                    "'training.<field>' or 'model.params.<name>'"
                )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Study:
        least = self.min_trial_seconds + DEADLINE_MARGIN_S
        if self.deadline_seconds < least:
            raise ValueError(
                f"deadline_seconds: {self.deadline_seconds:g} s leaves no trial time to run: a trial starts only while "
                f"min_trial_seconds ({self.min_trial_seconds:g} s) and {DEADLINE_MARGIN_S:g} s for its stop and "
                f"finalize are left: give at least {least:g} s"
            )
        if self.job.run_id is not None:
            raise ValueError("job.run_id: leave it out; every trial gets its own run id (<study id>-t<n>)")
        polls = self.deadline_seconds / (self.poll_seconds or MIN_POLL_S)
        events = EVENTS_FIXED + EVENTS_PER_TRIAL * self.trials + EVENTS_PER_POLL * polls
        if events > HISTORY_EVENTS:
            raise ValueError(
                f"poll_seconds: {self.poll_seconds} s over a {self.deadline_seconds:g} s deadline and {self.trials} "
                f"trials could write ~{events:,.0f} events into the study execution's history, more than Step "
                f"Functions' {HISTORY_EVENTS:,}: raise poll_seconds (or shorten deadline_seconds)"
            )
        if isinstance(self.search, Asha):
            if not self.asha_rungs():
                raise ValueError(
                    f"search.min_rounds: {self.search.min_rounds} leaves no rung below the job's "
                    f"training.max_rounds ({self.job.training.max_rounds})"
                )
        return self

    @property
    def metric_name(self) -> str:
        return self.metric or self.job.training.target_metric

    @property
    def direction(self) -> Literal["max", "min"]:
        return "min" if lower_is_better(self.metric_name) else "max"

    def asha_rungs(self) -> list[int]:
        """The rungs (training rounds) where ASHA compares trials: below the job's max_rounds."""
        if not isinstance(self.search, Asha):
            return []
        top = self.job.training.max_rounds
        if self.search.rungs is not None:
            return [r for r in self.search.rungs if r < top]
        rungs, r = [], self.search.min_rounds
        while r < top:
            rungs.append(r)
            r *= self.search.reduction_factor
        return rungs


def set_path(job: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path of a job dict, creating the sections on the way."""
    *parents, last = path.split(".")
    node = job
    for p in parents:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, dict):
            raise InvalidJob(f"study.space.{path}: {p} is not a section of the job")
        node = child
    node[last] = value


def trial_job(study: Study, params: dict[str, Any]) -> dict[str, Any]:
    """The study's job with a trial's parameters set (as JSON-able dict, not yet validated)."""
    job = copy.deepcopy(study.job.model_dump(mode="json", exclude_none=True))
    for path, value in params.items():
        set_path(job, path, value)
    return job


def parse_study(raw: Any) -> Study:
    """Validate raw input (dict or JSON text) into a Study, or raise InvalidJob naming the field."""
    raw = json_object(raw, "study")
    if "dataset" in raw and "job" not in raw:
        raise InvalidJob(
            "study: this is a job (it has `dataset`), not a study: run it with `smlt run` or `smlt start`, or put it "
            "under a study's `job` with a `space` to search (docs/studies.md)"
        )
    try:
        study = Study.model_validate(raw)
    except ValidationError as e:
        # The study-wide checks (no location) name their field themselves; the others get theirs.
        whole = [err.message for err in field_errors(e) if not err.path and err.type == "value_error"]
        raise InvalidJob("; ".join(f"study.{part}" for part in whole or problems(e, Study))) from None
    check_space(study)
    return study


def grid_values(p: Param) -> list[Any]:
    """A parameter's grid: its choices, or `points` values evenly spaced (log-spaced for a log range)."""
    if isinstance(p, Choices):
        return list(p.choices)
    if isinstance(p, Range):
        values = np.linspace(p.range[0], p.range[1], p.points)
    else:
        values = np.exp(np.linspace(math.log(p.log_range[0]), math.log(p.log_range[1]), p.points))
    return [as_value(p, float(v)) for v in values]


def as_value(p: Range | LogRange, v: float) -> float | int:
    """A drawn or grid value as the job gets it: an integer, or a float to 6 significant digits."""
    return int(round(v)) if p.integer else float(f"{v:.6g}")  # 6 significant digits: readable ids


def corner_points(study: Study) -> list[dict[str, Any]]:
    """A few points that together use every choice and both ends of every range (checks)."""
    names = list(study.space)
    columns = [
        grid_values(study.space[n]) if isinstance(study.space[n], Choices) else _ends(study.space[n]) for n in names
    ]
    longest = max(len(c) for c in columns)
    return [{n: col[i % len(col)] for n, col in zip(names, columns, strict=True)} for i in range(longest)]


def _ends(p: Param) -> list[Any]:
    assert isinstance(p, Range | LogRange)
    lo, hi = p.range if isinstance(p, Range) else p.log_range
    return [as_value(p, lo), as_value(p, hi)]


def check_space(study: Study) -> None:
    """Every value of the space makes a valid job (the first of a range, each choice): a typo in a
    path or a value out of the job's bounds is named now, not when a trial starts."""
    for params in corner_points(study):
        try:
            parse_job(trial_job(study, params))
        except InvalidJob as e:
            shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in params.items())
            raise InvalidJob(f"study.space: with {shown} the job is invalid: {e}") from None
