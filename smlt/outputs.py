"""Fetch a run's results into a folder: model.safetensors, model.json (its model card), metrics.json,
report.png, history.json, and tensorboard/<run id>/; with the tracking extra (smlt.tracking) the
run is also logged to MLflow when its job (or MLFLOW_TRACKING_URI) names a tracking URI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from smlt.report import write_report
from smlt.runtime import keys
from smlt.runtime.errors import RunNotFinished
from smlt.runtime.evaluation import ValMetrics, metrics_text
from smlt.runtime.items import PlanItem, RoundItem
from smlt.runtime.modelcard import card_key, parse_card
from smlt.runtime.progress import notice
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.usercode import code_key
from smlt.tracking import log_fetched, write_tensorboard


def fetch_outputs(artifacts: S3Store, run_id: str, out: Path, history: list[dict] | None = None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    try:
        metrics = json.loads(artifacts.get(keys.final_metrics_key(run_id)))
    except NotFound:
        raise RunNotFinished(f"run {run_id} has no final metrics yet (is it finished?)") from None
    if metrics["final"].get("model_key"):
        (out / "model.safetensors").write_bytes(artifacts.get(keys.final_model_key(run_id)))
        _fetch_card(artifacts, run_id, out)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if history is not None:
        (out / "history.json").write_text(json.dumps(history, indent=1, default=str))
    write_report(metrics, out / "report.png")
    _tensorboard(artifacts, run_id, metrics, out / "tensorboard" / run_id)
    log_fetched(metrics, out)  # a warning, never an error: the run and its model are stored
    return metrics


def _tensorboard(artifacts: S3Store, run_id: str, metrics: dict[str, Any], folder: Path) -> None:
    """The run's event files (the tracking extra), also under its prefix when this user may write there."""
    for f in write_tensorboard(metrics, folder):
        try:
            artifacts.put(f"runs/{run_id}/tensorboard/{f.relative_to(folder).as_posix()}", f.read_bytes())
        except ClientError as e:  # a read-only user still gets the local curves
            notice.info(f"tensorboard: kept in {folder} only ({e.response.get('Error', {}).get('Code', e)})")
            return


def _fetch_card(artifacts: S3Store, run_id: str, out: Path) -> None:
    """model.json and, for a model built by the user's code, that code as code.zip (what
    `smlt.load_model` imports it from, checked against the card's sha256)."""
    try:
        raw = artifacts.get(card_key(run_id))
    except NotFound:  # published before smlt wrote model cards
        return
    (out / "model.json").write_bytes(raw)
    code = parse_card(raw, str(out / "model.json")).code
    if code is not None and code.sha256 is not None:
        try:
            (out / "code.zip").write_bytes(artifacts.get(code_key(code.sha256)))
        except NotFound:
            pass


def _band(p50: float, p70: float | None, fmt: str) -> str:
    """A median with its p70, when the band is wider than the rounding."""
    return fmt.format(p50) + (f" (p70 {fmt.format(p70)})" if p70 is not None and p70 > p50 * 1.005 else "")


def forecast_text(plan: PlanItem, took_s: float = 0.0, took_usd: float = 0.0, rounds_done: int = 0) -> str:
    """The plan's forecast of the rest of the run (the dashboard's plans table), less `rounds_done`
    rounds that took `took_s` and `took_usd` since it was made; empty when it has none."""
    if plan.eta_rounds is None or plan.eta_s is None or plan.eta_cost_usd is None:
        return ""

    def left(v: float | None, took: float) -> float | None:
        return None if v is None else max(v - took, 0.0)

    rounds = _band(max(plan.eta_rounds - rounds_done, 0.0), left(plan.eta_rounds_p70, rounds_done), "{:.0f}")
    secs = _band(max(plan.eta_s - took_s, 0.0), left(plan.eta_s_p70, took_s), "{:.0f} s")
    usd = _band(max(plan.eta_cost_usd - took_usd, 0.0), left(plan.eta_cost_usd_p70, took_usd), "${:.4f}")
    return f"{rounds} rounds, {secs}, {usd}"


def eta_text(r: RoundItem, plan: PlanItem | None) -> str:
    """The planner's forecast of the rest of the run after round r, against the deadline and the
    budget left: the forecast of round r's plan (which counted round r) less what round r took.
    Empty when the plan has none (the fixed planner, a stop)."""
    if plan is None:
        return ""
    text = forecast_text(plan, r.round_s, r.cost_usd, 1)
    if not text:
        return ""
    rounds, secs, usd = text.split(", ")
    c = plan.spec.job.constraints if plan.spec is not None else None
    if c is not None and c.deadline_seconds is not None and plan.elapsed_s is not None:
        secs += f" of {max(c.deadline_seconds - plan.elapsed_s - r.round_s, 0.0):.0f} s left"
    if c is not None and c.budget_usd is not None:
        usd += f" of ${max(c.budget_usd - r.cost_total_usd, 0.0):.4f} left"
    return f"ETA {rounds}, {secs}, {usd}"


def _steps_text(r: RoundItem) -> str:
    """The round's local steps, and how many workers the compute limit cut short (a step slower
    than the plan expected: the planner sees FLOPs, not a sleep or a Python loop in a model)."""
    if r.eval_only:
        return "eval only"
    cut = sorted(t.steps for t in r.timings if t.cut and t.error is None)
    if not cut:
        return f"k {r.local_steps}"
    took = f"{cut[0]}" if cut[0] == cut[-1] else f"{cut[0]}-{cut[-1]}"
    return f"k {r.local_steps} ({len(cut)} cut to {took} at the time limit)"


def progress_line(r: RoundItem, plan: PlanItem | None = None, target: str | None = None) -> str:
    """A round's line; `target`: the run's target metric (its balanced accuracy is shown when it
    is the target)."""
    balanced = target == "val_balanced_accuracy"
    whole = ValMetrics.model_validate(r.model_dump(include=set(ValMetrics.model_fields)))
    partial = ValMetrics.model_validate({k: getattr(r, f"{k}_partial") for k in ValMetrics.model_fields})
    measured = whole.val_loss is not None or partial.val_loss is None
    loss = r.train_loss
    parts = [
        f"round {r.round:3d}",
        f"workers {r.workers_ok}/{r.workers}",
        f"{r.memory_mb} MB",
        _steps_text(r),
        f"train loss {loss:.4f}" if loss is not None else "train loss   -   ",
        metrics_text(whole, balanced=balanced)
        if measured
        else f"{metrics_text(partial, 'val partial', balanced)} ({r.val_rows}/{r.val_rows_total} rows)",
        f"{r.round_s:5.2f} s",
        f"cost ${r.cost_total_usd:.5f}",
    ]
    eta = eta_text(r, plan) if not r.stop else ""
    return " | ".join(parts + ([eta] if eta else []))
