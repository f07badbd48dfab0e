"""Aggregate one round: average the updates that arrived into the next global model, combine
the workers' evaluation of this round's model, price the round, decide whether to stop.

Idempotent: the ROUND item is written once (conditional) and a repeated call returns it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from smlt import keys
from smlt.aggregate.reduce import apply_update, decode, encode, is_finite, param_count, weighted_average
from smlt.config import Settings
from smlt.records import RunTable
from smlt.roundspec import RoundSpec
from smlt.store import S3Store


def _target_reached(spec: RoundSpec, val_loss: float | None, val_acc: float | None) -> bool:
    t = spec.job.training
    if t.target_value is None:
        return False
    if t.target_metric == "val_accuracy":
        return val_acc is not None and val_acc >= t.target_value
    return val_loss is not None and val_loss <= t.target_value


def round_cost(settings: Settings, spec: RoundSpec, records: list[dict], failed: int,
               plan_s: float, aggregate_s: float) -> float:
    """Everything billed for one round: worker, planner and aggregator GB-s and requests,
    Step Functions transitions and S3 requests."""
    p, arch = settings.prices, settings.architecture
    cost = sum(p.lambda_cost(r["memory_mb"], r["total_s"], arch) for r in records)
    if failed:  # a failed worker was billed too; charge it the longest time seen this round
        worst = max((r["total_s"] for r in records), default=spec.time_limit_s or 60.0)
        cost += failed * p.lambda_cost(spec.memory_mb, worst, arch)
    cost += p.lambda_cost(1024, plan_s, arch) + p.lambda_cost(3008, aggregate_s, arch)
    n = spec.workers
    cost += p.round_overhead(n, s3_puts=n + 2, s3_gets=3 * n + 2)
    return cost


def aggregate_round(settings: Settings, run_id: str, rnd: int, outcomes: list[dict] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    table = RunTable(settings.table, run_id)
    done = table.get(keys.round_sk(rnd))
    if done is not None:  # a repeated aggregation returns the first one's answer
        return _result(done)
    artifacts = S3Store(settings.artifacts_bucket)
    spec = RoundSpec.model_validate_json(artifacts.get(keys.plan_key(run_id, rnd)))
    plan_item = table.plan(rnd) or {}
    records = sorted(table.workers(rnd), key=lambda r: r["worker"])
    failed = max(0, spec.workers - len(records))

    global_blob = artifacts.get(keys.model_key(run_id, rnd))
    global_state = decode(global_blob)
    accepted = [r for r in records if r["samples"] > 0 and not r.get("late")]
    ledger: list[dict] = []
    if spec.eval_only or not accepted:
        new_blob = global_blob
    else:
        updates = [decode(artifacts.get(keys.update_key(run_id, rnd, r["worker"]))) for r in accepted]
        weights = [r["samples"] for r in accepted]
        avg = weighted_average(updates, weights)
        new_state = apply_update(global_state, avg, spec.job.training.server_lr)
        if not is_finite(new_state):
            raise FloatingPointError(f"round {rnd}: the averaged model has NaN or Inf")
        new_blob = encode(new_state)
        ledger = [{"worker": r["worker"], "samples": r["samples"]} for r in accepted]
    artifacts.put(keys.model_key(run_id, rnd + 1), new_blob, if_absent=True)

    val_count = sum(r["val_count"] for r in records)
    val_loss = sum(r["val_loss_sum"] for r in records) / val_count if val_count else None
    val_acc = sum(r["val_correct"] for r in records) / val_count if val_count else None
    samples = sum(r["samples"] for r in accepted)
    train_loss = sum(r["train_loss"] * r["samples"] for r in accepted) / samples if samples else None

    if spec.eval_only:
        stop, reason = True, plan_item.get("stop_reason") or "final evaluation"
    elif _target_reached(spec, val_loss, val_acc):
        stop, reason = True, f"target {spec.job.training.target_metric} {spec.job.training.target_value} reached"
    else:
        stop, reason = False, ""

    aggregate_s = time.perf_counter() - t0
    cost = round_cost(settings, spec, records, failed, float(plan_item.get("plan_s", 0.0)), aggregate_s)
    earlier = [r for r in table.rounds() if r["round"] < rnd]
    item = {
        "round": rnd, "workers": spec.workers, "workers_ok": len(records), "workers_failed": failed,
        "memory_mb": spec.memory_mb, "local_steps": spec.local_steps, "batch_size": spec.job.training.batch_size,
        "eval_only": spec.eval_only, "samples": samples, "accepted": ledger,
        "train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc,
        "aggregate_s": aggregate_s, "round_s": time.time() - spec.planned_at,
        "cost_usd": cost, "cost_total_usd": cost + sum(r["cost_usd"] for r in earlier),
        "param_count": param_count(global_state), "stop": stop, "reason": reason,
        "plan_reason": spec.reason, "finished_at": time.time(),
        "timings": [{k: r[k] for k in ("worker", "memory_mb", "samples", "load_s", "eval_s", "compute_s",
                                       "upload_s", "total_s", "cold")} for r in records],
    }
    _, stored = table.put_once(keys.round_sk(rnd), item)
    return _result(stored)


def _result(item: dict[str, Any]) -> dict[str, Any]:
    def num(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)

    return {"round": int(item["round"]), "stop": bool(item["stop"]), "reason": item.get("reason", ""),
            "val_accuracy": num(item.get("val_accuracy")), "val_loss": num(item.get("val_loss")),
            "cost_usd": num(item.get("cost_usd"))}
