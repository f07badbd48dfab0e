"""Finalize: the last state of a run (planner Lambda, op "finalize").

Publishes the newest measured model as final/model.safetensors, the run's metrics as
final/metrics.json, marks the run SUCCEEDED and, for a pipeline run, points latest.json at it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from smlt import keys
from smlt.aggregate.model_store import read_model_blob
from smlt.config import Settings
from smlt.records import RunTable
from smlt.store import S3Store
from smlt.trigger import latest_key


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
        src = keys.model_key(run_id, final_round["round"])
        if artifacts.exists(src):
            artifacts.copy(src, keys.final_model_key(run_id))
        else:  # written as slices by sharded aggregators: assemble one safetensors object
            artifacts.put(keys.final_model_key(run_id), read_model_blob(artifacts, run_id, final_round["round"]))
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
        # Reports that arrived before the round closed but were not applied (a diverged round
        # rejects its updates on purpose: not a loss).
        "lost_updates": sum(r["workers_ok"] - len(r["accepted"]) for r in trained if not r.get("diverged")),
        "double_counted_updates": double,
        "model_key": keys.final_model_key(run_id) if final_round else None,
    }
    metrics = {
        "run_id": run_id,
        "job": meta.get("job"),
        "rounds": [_round_view(r, plans.get(r["round"], {})) for r in rounds],
        "final": final,
    }
    artifacts.put(keys.final_metrics_key(run_id), json.dumps(metrics, indent=1, default=float).encode())
    table.update(keys.META, {"status": "SUCCEEDED", "final": final})
    pipeline = (meta.get("job") or {}).get("pipeline")
    if pipeline and final_round is not None:
        model_uri = f"s3://{settings.artifacts_bucket}/{keys.final_model_key(run_id)}"
        artifacts.put(latest_key(pipeline), json.dumps({"run_id": run_id, "model": model_uri}).encode())
    return {
        "run_id": run_id,
        "val_accuracy": final["val_accuracy"],
        "rounds": final["rounds"],
        "estimated_cost_usd": round(final["estimated_cost_usd"], 6),
    }


def _round_view(r: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "round",
        "workers",
        "workers_ok",
        "workers_failed",
        "memory_mb",
        "local_steps",
        "batch_size",
        "eval_only",
        "samples",
        "accepted",
        "train_loss",
        "val_loss",
        "val_accuracy",
        "round_s",
        "aggregate_s",
        "cost_usd",
        "cost_total_usd",
        "stop",
        "reason",
        "finished_at",
    )
    view = {k: r.get(k) for k in keep}
    view["plan"] = {k: plan.get(k) for k in ("reason", "bound", "predicted_round_s", "predicted_round_cost_usd")}
    return view
