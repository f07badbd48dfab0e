"""Finalize: the last state of a run (planner Lambda, op "finalize").

Publishes the newest measured model as final/model.safetensors with its model card (the card
with the final metrics also as final/model.json: smlt.runtime.modelcard), the run's metrics as
final/metrics.json, marks the run SUCCEEDED and, for a pipeline run, passes its model through the
pipeline's gate (smlt.runtime.pipeline.conclude: promoted to latest.json, or kept rejected),
whose decision goes to the team's SNS topic when the stack has one (smlt.runtime.notify).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from smlt.runtime import keys, ledger
from smlt.runtime import pipeline as pipelines
from smlt.runtime.bill import ledger_round
from smlt.runtime.config import Settings
from smlt.runtime.data.shards import check_pinned, load_manifest
from smlt.runtime.errors import PartialData
from smlt.runtime.evaluation import ValMetrics
from smlt.runtime.items import FinalMetrics, MetaItem, PlanItem, RoundItem
from smlt.runtime.model_store import verified_model
from smlt.runtime.modelcard import ModelCard, card_json, card_key, card_of_run, with_card
from smlt.runtime.notify import publish_decision
from smlt.runtime.records import RunTable, raise_late_user_error
from smlt.runtime.steps.events import FinalizeAnswer, FinalizeEvent
from smlt.runtime.store import S3Store
from smlt.runtime.tensors.digest import sha256_hex

log = logging.getLogger(__name__)


def finalize(settings: Settings, event: FinalizeEvent) -> FinalizeAnswer:
    """Publish the final model and metrics: the newest model measured on the whole validation
    split (a round's val_loss is None when a slice was missing)."""
    run_id = event.run_id
    table = RunTable(settings.table, run_id)
    artifacts = S3Store(settings.artifacts_bucket)
    meta = table.meta()
    rounds = sorted(table.rounds(), key=lambda r: r.round)
    plans = {p.round: p for p in table.plans()}
    measured = [r for r in rounds if r.val_loss is not None]
    final_round = measured[-1] if measured else None
    card = card_of_run(run_id, meta.job) if meta and final_round is not None else None
    if card is not None and meta is not None:
        # the card describes the model with the dataset's features: the ones it was trained on
        check_pinned(meta.manifest_sha256, card.data.manifest_sha256, meta.job.dataset.uri)
    published = None
    if final_round is not None:
        published = _publish_model(
            artifacts, run_id, final_round.round, _model_digest(meta, rounds, final_round.round), card
        )
    pipeline = meta.job.pipeline if meta else None
    per_round, total = _run_ledger(settings, table, rounds, plans, pipeline is not None, card is not None)
    fraction, untrained, keys_of = _trained_split(meta, rounds, plans)
    final = _final(run_id, meta, rounds, plans, final_round).model_copy(
        update={
            "estimated_cost_usd": total.total_usd,
            "model_sha256": published,
            "trained_fraction": fraction,
            "untrained_shards": untrained,
        }
    )
    partial = _partial_data(run_id, meta, final.rounds, fraction, untrained, keys_of)
    if partial is not None and meta is not None and meta.job.training.allow_partial_data:
        final.stop_reason += f" ({partial.args[0].split(': ', 1)[0]}; allowed by training.allow_partial_data)"
        partial = None
    if card is not None:  # model.json: the card with the run's final metrics and the model's sha256
        artifacts.put(
            card_key(run_id), card_json(card.model_copy(update={"metrics": final, "model_sha256": published}))
        )
    metrics = {
        "run_id": run_id,
        "job": meta.job.model_dump(mode="json") if meta else None,
        "rounds": [_round_view(r, plans.get(r.round), per_round.get(r.round)) for r in rounds],
        "final": {
            **final.model_dump(),
            "cost_breakdown": total.model_dump(),
            "billed_invocations": total.lambda_invocations,
        },
    }
    artifacts.put(keys.final_metrics_key(run_id), json.dumps(metrics, indent=1, default=float).encode())
    raise_late_user_error(table)  # a late-recorded user error fails the run, never SUCCEEDED
    if partial is not None:  # metrics.json says what was trained; the run is not done, nor a pipeline's latest
        raise partial
    table.update(keys.META, MetaItem, status="SUCCEEDED", final=final)
    if pipeline and meta and final_round is not None:  # the gate: promoted, or kept as rejected
        metric = meta.job.training.target_metric
        decided = pipelines.conclude(
            artifacts,
            meta.job.dataset.uri,
            run_id,
            f"s3://{settings.artifacts_bucket}/{keys.final_model_key(run_id)}",
            metric,
            meta.job.promotion_margin,
            getattr(final, metric),
            getattr(rounds[0], metric) if rounds and rounds[0].val_loss is not None else None,
            final.estimated_cost_usd,
            published,
            pipelines.Validation(meta.val_rows, meta.val_class_rows, card.classes if card is not None else None),
            meta.job.promotion_min_rows,
        )
        if decided is not None and settings.notify_topic_arn:
            _notify(artifacts, settings.notify_topic_arn, decided)
    return FinalizeAnswer(
        run_id=run_id,
        val_accuracy=final.val_accuracy,
        rounds=final.rounds,
        estimated_cost_usd=round(final.estimated_cost_usd, 6),
    )


def _notify(artifacts: S3Store, topic_arn: str, record: pipelines.VersionRecord) -> None:
    """The decision published to the team's topic, once: the version's record keeps when it was
    (`notified_at`), so a retried Finalize does not publish it again; a failure kept on the record
    (`notify_error`; a retry publishes again), the run and the decision unchanged. At least once:
    a Finalize that dies between the publish and that record publishes again on its retry (a
    subscriber tells the two apart by the version's run_id), never not at all."""
    if record.notified_at is not None:
        return
    error = publish_decision(topic_arn, record)
    told = {"notify_error": error} if error is not None else {"notified_at": time.time(), "notify_error": None}
    try:
        key = keys.pipeline_version_key(record.pipeline, record.version)
        artifacts.put(key, record.model_copy(update=told).model_dump_json(indent=1).encode())
    except Exception as e:  # noqa: BLE001 - the record says the decision; the log says this
        log.warning("the notification was not recorded on %s %s: %s", record.pipeline, record.version, e)


def _trained_split(
    meta: MetaItem | None, rounds: list[RoundItem], plans: dict[int, PlanItem]
) -> tuple[float | None, list[int], dict[int, str]]:
    """(fraction of the training split's rows in shards that an applied update covered, the train
    shards no applied update covered, their keys): a shard counts once a worker that held it in
    some round had its update applied."""
    if meta is None or meta.train_shards <= 0:
        return None, [], {}
    n = meta.train_shards
    trained: set[int] = set()
    for r in rounds:
        plan = plans.get(r.round)
        if r.eval_only or r.diverged or plan is None or plan.spec is None:
            continue
        for a in r.accepted:
            if a.samples > 0 and a.worker < plan.spec.workers:
                trained.update(plan.spec.train_shards(a.worker, n))
    untrained = sorted(set(range(n)) - trained)
    try:
        shards = load_manifest(meta.job.dataset.uri).train.shards
    except Exception:  # noqa: BLE001 - the fraction falls back to counting shards
        shards = []
    if len(shards) != n:
        return (n - len(untrained)) / n, untrained, {}
    total = sum(sh.rows for sh in shards) or 1
    rows = sum(shards[i].rows for i in trained if i < n)
    return rows / total, untrained, {i: shards[i].key for i in untrained}


def _partial_data(
    run_id: str,
    meta: MetaItem | None,
    trained_rounds: int,
    fraction: float | None,
    untrained: list[int],
    keys_of: dict[int, str],
) -> PartialData | None:
    """PartialData when training rounds ran but some train shard was never trained. (A run the
    planner stopped before any round, for its budget or deadline, says so in its stop reason.)"""
    if not untrained or fraction is None or trained_rounds == 0:
        return None
    names = ", ".join(keys_of.get(i, f"#{i}") for i in untrained[:5]) + (" ..." if len(untrained) > 5 else "")
    return PartialData(
        f"run {run_id} trained {fraction:.1%} of the training split: {len(untrained)} train shard(s) never "
        f"trained ({names}); their workers failed in every round (see the recorded errors: `smlt status "
        f"{run_id}`). Fix the cause and start the run again, or set training.allow_partial_data: true to "
        "accept a model trained on part of the data"
    )


def _run_ledger(
    settings: Settings,
    table: RunTable,
    rounds: list[RoundItem],
    plans: dict[int, PlanItem],
    pipeline: bool,
    card: bool = False,
) -> tuple[dict[int, ledger.CostBreakdown], ledger.CostBreakdown]:
    """The run's bill from every ATTEMPT item (smlt.runtime.ledger), this Finalize included as it will
    end: model.json, metrics.json, META and a pipeline's gate still to write."""
    attempts = ledger.from_items(table.query(ledger.PREFIX))
    rest = {"s3.PutObject": 1 + pipelines.CONCLUDE_PUTS * pipeline + int(card), "dynamodb.UpdateItem": 1}
    if pipeline:
        rest["s3.GetObject"] = pipelines.CONCLUDE_GETS
    own = ledger.in_progress(settings.planner_memory_mb, rest, "finalize")
    shaped = [
        ledger.RoundOf(
            r.round,
            ledger_round(settings, r.workers, r.aggregators, r.eval_only),
        )
        for r in rounds
    ]
    executions = len({p.execution for p in plans.values()})
    everything = attempts + ([own] if own else [])
    return ledger.run_ledger(everything, shaped, executions, settings.prices, settings.architecture)


def _model_digest(meta: MetaItem | None, rounds: list[RoundItem], rnd: int) -> str | None:
    """The digest model rnd was recorded with: by round rnd-1's aggregator, or in META (round 0)."""
    if rnd == 0:
        return meta.model0_sha256 if meta else None
    return next((r.model_sha256 for r in rounds if r.round == rnd - 1), None)


def _publish_model(artifacts: S3Store, run_id: str, rnd: int, expected: str | None, card: ModelCard | None) -> str:
    """final/model.safetensors: model rnd read and checked against its digest first (a damaged
    model is DigestMismatch, never published), assembled into one object when it is sliced, with
    the model card in its metadata. Returns the published object's sha256 (`final.model_sha256`)."""
    model = verified_model(artifacts, run_id, rnd, expected)
    blob = with_card(model.blob, card) if card is not None else model.blob
    artifacts.put(keys.final_model_key(run_id), blob)
    return sha256_hex(blob)


# The final round's metrics the run reports (None where the task has none: smlt.runtime.evaluation).
_FINAL_METRICS = set(ValMetrics.model_fields)


def _final(
    run_id: str,
    meta: MetaItem | None,
    rounds: list[RoundItem],
    plans: dict[int, PlanItem],
    final_round: RoundItem | None,
) -> FinalMetrics:
    model = final_round.round if final_round else None
    trained = ledger.trained_into(rounds, model)
    last_plan = plans[max(plans)] if plans else None
    last = rounds[-1] if rounds else None
    return FinalMetrics(
        run_id=run_id,
        task=meta.task if meta else "classification",
        **(final_round.model_dump(include=_FINAL_METRICS) if final_round else {}),
        val_rows=final_round.val_rows if final_round else 0,
        rounds=len(trained),
        samples=sum(r.samples for r in trained),
        wall_seconds=time.time() - (meta.created_at if meta else time.time()),
        estimated_cost_usd=last.cost_total_usd if last else 0.0,
        stop_reason=last.reason if last and last.stop else (last_plan.reason if last_plan else ""),
        model_key=keys.final_model_key(run_id) if final_round else None,
    )


# What metrics.json shows of a round: the ROUND item but the planner's and aggregator's own
# fields, and the plan's reasoning.
_NOT_IN_METRICS = {"diverged", "aggregators", "param_count", "plan_reason", "time_limit_s", "timings"}
_PLAN_IN_METRICS = {"reason", "bound", "rule", "predicted_round_s", "predicted_round_cost_usd"}


def _round_view(r: RoundItem, plan: PlanItem | None, cost: ledger.CostBreakdown | None) -> dict[str, Any]:
    view = r.model_dump(exclude=_NOT_IN_METRICS)
    view["plan"] = plan.model_dump(include=_PLAN_IN_METRICS) if plan else dict.fromkeys(_PLAN_IN_METRICS)
    view["cost_breakdown"] = (cost or ledger.CostBreakdown()).model_dump()  # every attempt of the round
    return view
