"""The run's controller, behind the planner Lambda: validate the job, plan each round, finalize.

`plan_next` is idempotent: the round number comes from what DynamoDB says is aggregated, and the
PLAN item is written once; a repeated call returns the stored plan.
"""

from __future__ import annotations

import json
import time
from typing import Any

from smlt import keys
from smlt.config import Settings
from smlt.data.shards import load_manifest
from smlt.errors import Infeasible, InvalidJob
from smlt.job import Job, parse_job
from smlt.planner import decide
from smlt.planner.types import Decision, RoundRecord, RunHistory, WorkerTiming
from smlt.records import RunTable
from smlt.roundspec import RoundSpec
from smlt.store import S3Store


def _check_resources(job: Job, settings: Settings) -> dict[str, Any]:
    """Everything that can be checked before the first write. Raises a named error."""
    tiers = sorted(settings.train_functions)
    if job.workers.memory_mb is not None and job.workers.memory_mb not in tiers:
        raise InvalidJob(f"workers.memory_mb: {job.workers.memory_mb} is not a deployed memory tier "
                         f"(deployed: {', '.join(map(str, tiers))})")
    manifest = load_manifest(job.dataset.uri)
    if manifest.task == "regression" and job.training.target_metric == "val_accuracy" and job.training.target_value is not None:
        raise InvalidJob("training.target_metric: val_accuracy needs a classification dataset; use val_loss")
    if job.warm_start:
        try:
            bucket, key = keys.parse_s3_uri(job.warm_start)
        except ValueError as e:
            raise InvalidJob(f"warm_start: {e}") from None
        if not S3Store(bucket).exists(key):
            raise InvalidJob(f"warm_start: no model at {job.warm_start}")
    return {"train_rows": manifest.train.rows, "features": manifest.features, "outputs": manifest.outputs,
            "task": manifest.task}


def _history(rounds: list[dict], meta: dict) -> RunHistory:
    records = []
    for r in rounds:
        records.append(RoundRecord(
            round=r["round"], workers=r["workers"], memory_mb=r["memory_mb"], local_steps=r["local_steps"],
            batch_size=r["batch_size"], workers_ok=r["workers_ok"],
            timings=[WorkerTiming(**t) for t in r.get("timings", [])],
            aggregate_s=r["aggregate_s"], round_s=r["round_s"], train_loss=r.get("train_loss"),
            val_loss=r.get("val_loss"), val_accuracy=r.get("val_accuracy"), cost_usd=r["cost_usd"]))
    return RunHistory(rounds=records, elapsed_s=time.time() - float(meta["created_at"]),
                      cost_total_usd=float(rounds[-1]["cost_total_usd"]) if rounds else 0.0,
                      param_count=int(rounds[-1]["param_count"]) if rounds else int(meta.get("param_count", 0)),
                      train_rows=int(meta["train_rows"]))


def _result(item: dict[str, Any], settings: Settings) -> dict[str, Any]:
    if item["action"] == "stop":
        return {"action": "stop", "run_id": item["run_id"], "round": item["round"], "reason": item["reason"]}
    n = int(item["workers"])
    return {"action": "train", "run_id": item["run_id"], "round": item["round"], "workers": list(range(n)),
            "function_name": item["function_name"], "memory_mb": item["memory_mb"],
            "local_steps": item["local_steps"], "max_concurrency": min(n, settings.max_concurrency),
            "reason": item["reason"]}


def plan_next(settings: Settings, raw_job: Any, execution: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    job = parse_job(raw_job)
    run_id = job.run_id or execution
    table = RunTable(settings.table, run_id)
    artifacts = S3Store(settings.artifacts_bucket)
    meta = table.meta()
    if meta is None:
        facts = _check_resources(job, settings)  # nothing is written for a bad job
        _, meta = table.put_once(keys.META, {"job": job.model_dump(mode="json"), "status": "RUNNING",
                                             "created_at": time.time(), "run_id": run_id, **facts})
        artifacts.put(keys.job_key(run_id), job.model_dump_json(indent=1).encode(), if_absent=True)
        if job.warm_start:
            bucket, key = keys.parse_s3_uri(job.warm_start)
            artifacts.put(keys.model_key(run_id, 0), S3Store(bucket).get(key), if_absent=True)

    rounds = sorted(table.rounds(), key=lambda r: r["round"])
    rnd = rounds[-1]["round"] + 1 if rounds else 0
    existing = table.plan(rnd)
    if existing is not None:
        return _result(existing, settings)

    tiers = sorted(settings.train_functions)
    decision: Decision = decide(job, _history(rounds, meta), tiers, settings.prices, settings.architecture)
    if decision.infeasible and not job.constraints.best_effort:
        raise Infeasible(decision.reason)
    item: dict[str, Any] = {"run_id": run_id, "round": rnd, "reason": decision.reason, "bound": decision.bound,
                            "predicted_round_s": decision.predicted_round_s,
                            "predicted_round_cost_usd": decision.predicted_round_cost_usd,
                            "planned_at": time.time()}
    if decision.action == "stop":
        measured = rounds and rounds[-1]["stop"] is False and decision.bound in ("max_rounds", "deadline", "target")
        if measured:
            # The newest model has not been evaluated yet: one evaluation-only round measures it.
            last = rounds[-1]
            decision = Decision(action="train", workers=last["workers"], memory_mb=last["memory_mb"], local_steps=0,
                                reason=f"final evaluation ({decision.reason})", bound=decision.bound)
            item["stop_reason"] = item["reason"]
            item["reason"] = decision.reason
        else:
            item["action"] = "stop"
    if decision.action == "train":
        lr = job.training.learning_rate
        spec = RoundSpec(run_id=run_id, round=rnd, workers=decision.workers, memory_mb=decision.memory_mb,
                         local_steps=decision.local_steps, function_name=settings.train_functions[decision.memory_mb],
                         planned_at=item["planned_at"], time_limit_s=decision.worker_time_limit_s,
                         learning_rate=lr, reason=decision.reason, job=job)
        item.update(action="train", workers=spec.workers, memory_mb=spec.memory_mb, local_steps=spec.local_steps,
                    function_name=spec.function_name, spec=spec.model_dump_json())
    item["plan_s"] = time.perf_counter() - t0
    _, stored = table.put_once(keys.plan_sk(rnd), item)
    if stored["action"] == "train":
        artifacts.put(keys.plan_key(run_id, rnd), stored["spec"].encode())
    return _result(stored, settings)


def finalize(settings: Settings, run_id: str) -> dict[str, Any]:
    """Publish the final model and metrics: the newest model whose metrics were measured."""
    table = RunTable(settings.table, run_id)
    artifacts = S3Store(settings.artifacts_bucket)
    meta = table.meta() or {}
    rounds = sorted(table.rounds(), key=lambda r: r["round"])
    plans = {p["round"]: p for p in table.plans()}
    measured = [r for r in rounds if r.get("val_loss") is not None]
    final_round = measured[-1] if measured else None
    if final_round is not None:
        artifacts.copy(keys.model_key(run_id, final_round["round"]), keys.final_model_key(run_id))
    trained = [r for r in rounds if not r["eval_only"] and final_round and r["round"] < final_round["round"]]
    double = sum(len(r["accepted"]) - len({a["worker"] for a in r["accepted"]}) for r in rounds)
    last_plan = plans.get(max(plans)) if plans else {}
    final = {
        "run_id": run_id,
        "val_accuracy": final_round.get("val_accuracy") if final_round else None,
        "val_loss": final_round.get("val_loss") if final_round else None,
        "rounds": len(trained),
        "samples": sum(r["samples"] for r in trained),
        "wall_seconds": time.time() - float(meta.get("created_at", time.time())),
        "estimated_cost_usd": float(rounds[-1]["cost_total_usd"]) if rounds else 0.0,
        "stop_reason": (rounds[-1]["reason"] if rounds and rounds[-1]["stop"] else last_plan.get("reason", "")),
        "lost_updates": sum(r["workers_ok"] - len(r["accepted"]) for r in trained if not r["eval_only"]),
        "double_counted_updates": double,
        "model_key": keys.final_model_key(run_id) if final_round else None,
    }
    metrics = {"run_id": run_id, "job": meta.get("job"), "rounds": [_round_view(r, plans.get(r["round"], {})) for r in rounds],
               "final": final}
    artifacts.put(keys.final_metrics_key(run_id), json.dumps(metrics, indent=1, default=float).encode())
    table.update(keys.META, {"status": "SUCCEEDED", "final": final})
    return {"run_id": run_id, "val_accuracy": final["val_accuracy"], "rounds": final["rounds"],
            "estimated_cost_usd": round(final["estimated_cost_usd"], 6)}


def _round_view(r: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    keep = ("round", "workers", "workers_ok", "workers_failed", "memory_mb", "local_steps", "batch_size", "eval_only",
            "samples", "accepted", "train_loss", "val_loss", "val_accuracy", "round_s", "aggregate_s", "cost_usd",
            "cost_total_usd", "stop", "reason", "finished_at")
    view = {k: r.get(k) for k in keep}
    view["plan"] = {k: plan.get(k) for k in ("reason", "bound", "predicted_round_s", "predicted_round_cost_usd")}
    return view
