"""Aggregate one round: average the updates that arrived into the next global model, combine
the workers' evaluation of this round's model, price the round, decide whether to stop.

Idempotent: the ROUND item is written once (conditional) and a repeated call returns it.
"""

from __future__ import annotations

import math
import time
from typing import Any

from smlt import errors as smlt_errors
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


MAX_ATTEMPTS = 3  # a round whose quorum fails this many times fails the run


def _fatal_worker_error(table: RunTable, rnd: int) -> None:
    """Re-raise a worker's non-transient error (bad data, model too large) under its own name."""
    errors = table.query(f"ERROR#{rnd:06d}#")
    if errors:
        e = errors[0]
        cls = getattr(smlt_errors, e["error"], smlt_errors.SmltError)
        raise cls(f"worker {int(e['sk'].rsplit('#', 1)[1])}: {e['message']}")


def aggregate_round(settings: Settings, run_id: str, rnd: int, outcomes: list[dict] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    table = RunTable(settings.table, run_id)
    done = table.get(keys.round_sk(rnd))
    if done is not None:  # a repeated aggregation returns the first one's answer
        return _result(done)
    artifacts = S3Store(settings.artifacts_bucket)
    spec = RoundSpec.model_validate_json(artifacts.get(keys.plan_key(run_id, rnd)))
    plan_item = table.plan(rnd) or {}
    meta = table.meta() or {}

    needed = max(1, math.ceil(spec.job.training.quorum * spec.workers))
    if len(table.workers(rnd)) < needed and table.get(keys.seal_sk(rnd)) is None:
        _fatal_worker_error(table, rnd)
        attempts = int(plan_item.get("attempts", 0))
        table.update(keys.plan_sk(rnd), {"attempts": attempts + 1},
                     only_if="attribute_not_exists(#attempts) OR #attempts = :n", values={":n": attempts})
        if attempts + 1 >= MAX_ATTEMPTS:
            raise smlt_errors.QuorumNotReached(
                f"round {rnd}: fewer than {needed} of {spec.workers} workers reported, {MAX_ATTEMPTS} times; "
                f"resume the run with `smlt resume {run_id}` once the cause is fixed")
        return {"round": rnd, "stop": False, "retry": True, "reason": f"quorum not reached (attempt {attempts + 1})",
                "val_accuracy": None, "val_loss": None, "cost_usd": None}

    # Close the round: from here on a worker's record can no longer land (see put_unless_sealed),
    # so the records read after the seal are exactly the ones that count.
    table.put_once(keys.seal_sk(rnd), {"sealed_at": time.time()})
    records = sorted(table.workers(rnd), key=lambda r: r["worker"])
    failed = max(0, spec.workers - len(records))

    global_blob = artifacts.get(keys.model_key(run_id, rnd))
    global_state = decode(global_blob)
    accepted = [r for r in records if r["samples"] > 0]
    ledger: list[dict] = []
    diverged = ""
    new_blob = global_blob
    if not spec.eval_only and accepted:
        bad = [r["worker"] for r in accepted if not r.get("finite", True)]
        updates = [decode(artifacts.get(keys.update_key(run_id, rnd, r["worker"]))) for r in accepted]
        bad += [r["worker"] for r, u in zip(accepted, updates) if not is_finite(u) and r["worker"] not in bad]
        if bad:
            diverged = f"NaN/Inf loss or update from worker(s) {sorted(bad)}"
        else:
            avg = weighted_average(updates, [r["samples"] for r in accepted])
            new_state = apply_update(global_state, avg, spec.job.training.server_lr)
            if is_finite(new_state):
                new_blob = encode(new_state)
                ledger = [{"worker": r["worker"], "samples": r["samples"]} for r in accepted]
            else:
                diverged = "the averaged model has NaN/Inf"
    if diverged:
        # Fall back to the last good model (this round's) and halve the learning rate, once.
        if float(meta.get("lr_scale", 1.0)) < 1.0:
            raise smlt_errors.Diverged(f"round {rnd}: {diverged} again after halving the learning rate to "
                                       f"{spec.learning_rate:g}; lower training.learning_rate")
        table.update(keys.META, {"lr_scale": 0.5})
    artifacts.put(keys.model_key(run_id, rnd + 1), new_blob, if_absent=True)

    val_count = sum(r["val_count"] for r in records)
    val_loss = sum(r["val_loss_sum"] for r in records) / val_count if val_count else None
    val_acc = sum(r["val_correct"] for r in records) / val_count if val_count else None
    samples = sum(a["samples"] for a in ledger)
    by_worker = {r["worker"]: r for r in records}
    train_loss = sum(by_worker[a["worker"]]["train_loss"] * a["samples"] for a in ledger) / samples if samples else None

    if spec.eval_only:
        stop, reason = True, plan_item.get("stop_reason") or "final evaluation"
    elif _target_reached(spec, val_loss, val_acc):
        stop, reason = True, f"target {spec.job.training.target_metric} {spec.job.training.target_value} reached"
    elif diverged:
        stop, reason = False, f"diverged: {diverged}; back to the last good model, learning rate halved"
    else:
        stop, reason = False, ""

    aggregate_s = time.perf_counter() - t0
    cost = round_cost(settings, spec, records, failed, float(plan_item.get("plan_s", 0.0)), aggregate_s)
    previous = table.get(keys.round_sk(rnd - 1)) if rnd > 0 else None  # the ledger so far
    item = {
        "round": rnd, "workers": spec.workers, "workers_ok": len(records), "workers_failed": failed,
        "memory_mb": spec.memory_mb, "local_steps": spec.local_steps, "batch_size": spec.job.training.batch_size,
        "eval_only": spec.eval_only, "diverged": bool(diverged), "samples": samples, "accepted": ledger,
        "train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc,
        "aggregate_s": aggregate_s, "round_s": time.time() - spec.planned_at,
        "cost_usd": cost, "cost_total_usd": cost + (float(previous["cost_total_usd"]) if previous else 0.0),
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
