"""What the dashboard shows, read from a stack's table through boto3 (a deployed stack, or the
local console's endpoint): the runs and studies, a run's curves, plans, ledger and current
workers, and the stop request. No web code here (the page is `smlt/dashboard/app.py`).

Reads are the run's own partition (Query) except the two lists (a Scan for META items: runs and
studies are few next to their rounds), so a dashboard polling every few seconds costs a few
requests per poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import EndpointConnectionError
from pydantic import BaseModel

from smlt.cloud import Stack
from smlt.runtime import clients, keys
from smlt.runtime.errors import AwsNotConfigured, InvalidJob, RunNotFound
from smlt.runtime.evaluation import TASK_METRICS
from smlt.runtime.items import ErrorItem, MetaItem, PlanItem, RoundItem, StopItem, WorkerItem
from smlt.runtime.records import RunTable, from_item, to_item
from smlt.runtime.study.items import StudyItem, StudyTable, TrialItem, list_studies
from smlt.runtime.usercode import read_user_message


@dataclass
class Source:
    """A stack's outputs and the clients that read it (``endpoint_url``: the local console's)."""

    stack: Stack
    ddb: Any
    label: str

    @classmethod
    def open(cls, stack_name: str = "Smlt", endpoint_url: str | None = None, region: str | None = None) -> Source:
        kw: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url else {}
        if region:
            kw["region_name"] = region
        session = boto3.session.Session()
        try:
            stack = Stack.lookup(stack_name, cfn=clients.make("cloudformation", session, **kw))
        except EndpointConnectionError:
            raise AwsNotConfigured(
                f"cannot reach {endpoint_url or 'AWS'}: is the local console up (`smlt local up`)?"
            ) from None
        where = endpoint_url or f"AWS {session.region_name}"
        return cls(stack=stack, ddb=clients.make("dynamodb", session, **kw), label=f"stack {stack_name} on {where}")

    def run(self, run_id: str) -> RunTable:
        return RunTable(self.stack.table, run_id, client=self.ddb)


class RunRow(BaseModel):
    """A line of the run list."""

    run_id: str
    name: str
    status: str  # RUNNING, SUCCEEDED, or STOPPING (RUNNING with a stop request)
    created_at: float
    rounds: int
    cost_usd: float
    budget_usd: float | None
    metric: str
    value: float | None


class CurvePoint(BaseModel):
    """One aggregated round as the charts plot it (validation metrics are those of model r)."""

    round: int
    elapsed_s: float  # from the run's creation to the round's aggregation
    cost_usd: float  # the ledger after the round
    train_loss: float | None
    val_loss: float | None
    metric: float | None  # the task's main metric (accuracy; R² for regression)


class RunFailure(BaseModel):
    """The user's code ended the run: a worker's UserCodeError (the run's FATAL record), as the CLI
    and `smlt status` print it."""

    error: str  # "UserCodeError"
    exception: str | None  # the exception's own type (TypeError, ...)
    message: str  # "your code raised TypeError: ..."
    frames: list[str]  # in the user's files, "file:line in function: source", innermost last
    round: int | None
    worker: int | None
    text: str  # the whole message

    @classmethod
    def of(cls, item: ErrorItem) -> RunFailure:
        message, frames = read_user_message(item.message)
        return cls(
            error=item.error,
            exception=item.exception,
            message=message,
            frames=frames,
            round=item.round,
            worker=item.worker,
            text=item.message,
        )


class RunView(BaseModel):
    meta: MetaItem
    rounds: list[RoundItem]
    plans: list[PlanItem]
    workers: list[WorkerItem]  # of the newest round with worker records
    workers_round: int | None
    stop: StopItem | None
    failure: RunFailure | None = None

    @property
    def metric(self) -> str:
        return main_metric(self.meta.task)

    @property
    def spent_usd(self) -> float:
        return self.rounds[-1].cost_total_usd if self.rounds else 0.0

    @property
    def budget_usd(self) -> float | None:
        return self.meta.job.constraints.budget_usd

    @property
    def status(self) -> str:
        return _status(self.meta, self.stop, self.failure is not None)

    def curve(self) -> list[CurvePoint]:
        metric = self.metric
        return [
            CurvePoint(
                round=r.round,
                elapsed_s=max(0.0, r.finished_at - self.meta.created_at) if r.finished_at else 0.0,
                cost_usd=r.cost_total_usd,
                train_loss=r.train_loss,
                val_loss=r.val_loss,
                metric=getattr(r, metric),
            )
            for r in self.rounds
        ]


def main_metric(task: str) -> str:
    """The metric a run's charts show beside the loss: accuracy, or R² for regression."""
    return "val_accuracy" if task == "classification" else TASK_METRICS.get(task, ("val_loss",))[-1]


def _status(meta: MetaItem, stop: StopItem | None, failed: bool = False) -> str:
    """RUNNING, SUCCEEDED, FAILED (the user's code failed it: its FATAL record), or STOPPING."""
    if meta.status == "RUNNING" and failed:
        return "FAILED"
    return "STOPPING" if meta.status == "RUNNING" and stop is not None else meta.status


def _scan_meta(source: Source, prefix: str) -> list[dict[str, Any]]:
    kwargs: dict[str, Any] = dict(
        TableName=source.stack.table,
        FilterExpression="begins_with(pk, :p) AND sk = :m",
        ExpressionAttributeValues=to_item({":p": prefix, ":m": keys.META}),
    )
    found: list[dict[str, Any]] = []
    while True:
        resp = source.ddb.scan(**kwargs)
        found.extend(from_item(i) for i in resp.get("Items", []))
        if "LastEvaluatedKey" not in resp:
            return found
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _newest(table: RunTable, prefix: str) -> dict[str, Any] | None:
    """The item of the partition with the greatest sort key under ``prefix`` (one Query)."""
    resp = table.client.query(
        TableName=table.table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
        ExpressionAttributeValues=to_item({":pk": table.pk, ":p": prefix}),
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )
    items = resp.get("Items", [])
    return from_item(items[0]) if items else None


def list_runs(source: Source) -> list[RunRow]:
    """Every run of the stack, newest first, with its newest round's ledger and metric."""
    rows = []
    for raw in _scan_meta(source, "RUN#"):
        meta = MetaItem.model_validate(raw)
        table = source.run(meta.run_id)
        last = _newest(table, "ROUND#")
        newest = RoundItem.model_validate(last) if last else None
        metric = main_metric(meta.task)
        value = getattr(meta.final, metric) if meta.final else (getattr(newest, metric) if newest else None)
        stop, failed = None, False
        if meta.status == "RUNNING":  # a stop request, or the user's error that failed it (one request)
            got = table.get_many(keys.STOP, keys.FATAL)
            stop, failed = got.item(keys.STOP, StopItem), got.item(keys.FATAL, ErrorItem) is not None
        rows.append(
            RunRow(
                run_id=meta.run_id,
                name=meta.job.name,
                status=_status(meta, stop, failed),
                created_at=meta.created_at,
                rounds=meta.final.rounds if meta.final else (newest.round + 1 if newest else 0),
                cost_usd=newest.cost_total_usd if newest else 0.0,
                budget_usd=meta.job.constraints.budget_usd,
                metric=metric,
                value=value,
            )
        )
    return sorted(rows, key=lambda r: -r.created_at)


def run_view(source: Source, run_id: str) -> RunView | None:
    """A run's META, rounds, plans, stop request, the user's error that failed it and the workers of
    its current round (one Query of the partition: a run has a few hundred items at most)."""
    table = source.run(run_id)
    items = table.query("")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        by_kind.setdefault(item["sk"].split("#", 1)[0], []).append(item)
    meta = by_kind.get(keys.META)
    if not meta:
        return None
    plans = [PlanItem.model_validate(i) for i in by_kind.get("PLAN", [])]
    # The current round's workers as far as they have reported: the newest round with WORKER
    # records (a round just planned has none yet; rounds are short, so that is most of the time).
    records = by_kind.get("WORKER", [])
    newest = max((int(i["sk"].split("#")[1]) for i in records), default=None)
    prefix = keys.worker_prefix(newest) if newest is not None else None
    workers = [WorkerItem.model_validate(i) for i in records if prefix and i["sk"].startswith(prefix)]
    stop = by_kind.get(keys.STOP)
    fatal = by_kind.get(keys.FATAL)
    return RunView(
        meta=MetaItem.model_validate(meta[0]),
        rounds=[RoundItem.model_validate(i) for i in by_kind.get("ROUND", [])],
        plans=plans,
        workers=workers,
        workers_round=newest,
        stop=StopItem.model_validate(stop[0]) if stop else None,
        failure=RunFailure.of(ErrorItem.model_validate(fatal[0])) if fatal else None,
    )


def request_stop(table: RunTable, reason: str) -> StopItem:
    """The stop button and `smlt stop RUN`: the run's next Plan stops it, evaluates the newest
    model and Finalize publishes it. The first request stands (it is returned)."""
    meta = table.meta()
    if meta is None:
        raise RunNotFound(f"no run {table.run_id!r} in table {table.table}: check the run id")
    if meta.status != "RUNNING":
        raise InvalidJob(f"run_id: run {table.run_id!r} has finished ({meta.status}): nothing to stop")
    return table.request_stop(reason.strip() or "no reason given", by="user")


def studies(source: Source) -> list[StudyItem]:
    return list_studies(source.stack.table, client=source.ddb)


def study_view(source: Source, study_id: str) -> tuple[StudyItem, list[TrialItem]] | None:
    table = StudyTable(source.stack.table, study_id, client=source.ddb)
    study = table.study()
    return None if study is None else (study, table.trials())
