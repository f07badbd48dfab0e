"""A study's DynamoDB items, in the run table beside the runs: partition STUDY#<id>, the study's
META and one TRIAL#<n> per trial. Each trial is an ordinary run (its own RUN#<run id> partition,
execution and ledger); its TRIAL item says which run it is, its parameters and where it stands.

The study controller writes these; the dashboard and `smlt tune` read them (`list_studies`,
`StudyTable`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from smlt.runtime import keys
from smlt.runtime.items import Item
from smlt.runtime.records import RunTable, from_item, to_item

STUDY_PREFIX = "STUDY#"

# SKIPPED: never started (the budget or the time left could not pay for it); STOPPED: stopped
# early by the study (ASHA or the deadline) or by a user, its model evaluated and published.
TrialStatus = Literal["PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED", "SKIPPED"]
ENDED = ("STOPPED", "SUCCEEDED", "FAILED", "SKIPPED")


def study_pk(study_id: str) -> str:
    return f"{STUDY_PREFIX}{study_id}"


def trial_sk(trial: int) -> str:
    return f"TRIAL#{trial:05d}"


class StudyItem(Item):
    """The study: what it optimises, its limits, its spend and its best trial so far."""

    study_id: str
    metric: str  # a TrainingSpec target metric: val_accuracy, val_balanced_accuracy, val_loss, val_rmse, val_r2
    direction: Literal["max", "min"]
    search: str  # "random", "grid" or "asha"
    trials: int  # trials the study will run in all
    status: Literal["RUNNING", "SUCCEEDED", "FAILED", "STOPPED"]
    created_at: float  # epoch seconds
    budget_usd: float | None = None
    deadline_s: float | None = None
    spent_usd: float = 0.0  # the sum of the trials' ledgers so far
    best_trial: int | None = None
    best_run_id: str | None = None
    best_metric: float | None = None
    best_model_key: str | None = None  # the study's result: the best trial's final model
    execution: str | None = None  # the study state machine's execution (deployed path)
    # The budget held: running trials' shares plus ended trials' ledgers (smlt.runtime.study.budget).
    reserved_usd: float = 0.0
    # The study's own bill (its controller's invocations and its machine's transitions), written by
    # its sequential steps (init, watch, finish); the trials' admit/ended steps are on their TRIAL items.
    overhead_usd: float = 0.0
    watch_usd: float = 0.0  # of it, the watcher's looks
    watches: int = 0
    overhead_reserve_usd: float = 0.0  # held back from the trials' shares for it
    total_usd: float = 0.0  # the full bill: the trials' ledgers and every controller step
    started: int = 0  # trials started so far
    version: int = 0  # bumped by every change of reserved_usd/started (a conditional write)
    # Each admitted trial's share as admit reserved it (0.0: skipped), and the trials whose ledger
    # replaced their share (ended): written with reserved_usd, so a retried admit or ended step
    # (its first invocation died after that write) finds it done and does not take it twice.
    shares: dict[str, float] = Field(default_factory=dict)
    settled: list[int] = Field(default_factory=list)
    ended_at: float | None = None


study_key = keys.study_key
best_prefix = keys.study_best_prefix


def trial_run_id(study_id: str, trial: int) -> str:
    return f"{study_id}-t{trial:03d}"


class TrialItem(Item):
    """One trial: its run, its parameters, its rung (ASHA) and how it ended."""

    trial: int
    run_id: str
    params: dict[str, Any]  # the sampled point of the search space
    status: TrialStatus
    rung: int = 0  # the highest ASHA rung it reached
    rounds: int = 0  # training rounds done so far
    metric: float | None = None  # its newest value of the study's metric
    cost_usd: float = 0.0  # its ledger so far
    controller_usd: float = 0.0  # its admit and ended steps (the study's own bill)
    budget_usd: float | None = None  # the share of the study's budget it was given
    stop_reason: str | None = None  # why it ended (e.g. "stopped at rung 1: 0.81 below the top third")
    # ASHA: the trial's value at each rung it was judged at ({"1": 0.93, "3": 0.96}).
    rung_values: dict[str, float] = {}
    started_at: float | None = None
    ended_at: float | None = None
    execution: str | None = None  # the trial's training execution (its name is the run id)


class StudyTable(RunTable):
    """A study's partition, read and written like a run's (`get`, `put_once`, `update`, `query`)."""

    def __init__(self, table: str, study_id: str, client: Any = None):
        super().__init__(table, study_id, client)
        self.study_id = study_id
        self.pk = study_pk(study_id)

    def study(self) -> StudyItem | None:
        return self.get("META", StudyItem)

    def trials(self) -> list[TrialItem]:
        return [TrialItem.model_validate(i) for i in self.query("TRIAL#")]


def list_studies(table: str, client: Any = None) -> list[StudyItem]:
    """Every study in the table, newest first (a Scan for STUDY# META items: studies are few)."""
    table_ = RunTable(table, "-", client)
    kwargs: dict[str, Any] = dict(
        TableName=table,
        FilterExpression="begins_with(pk, :p) AND sk = :m",
        ExpressionAttributeValues=to_item({":p": STUDY_PREFIX, ":m": "META"}),
    )
    found: list[StudyItem] = []
    while True:
        resp = table_.client.scan(**kwargs)
        found.extend(StudyItem.model_validate(from_item(i)) for i in resp.get("Items", []))
        if "LastEvaluatedKey" not in resp:
            return sorted(found, key=lambda s: -s.created_at)
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
