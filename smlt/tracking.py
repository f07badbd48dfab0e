"""A finished run's curves as TensorBoard event files (`tensorboard --logdir OUT/tensorboard`).

Written from the run's metrics.json when its outputs are fetched (`smlt run`, `smlt fetch`), with
torch's `SummaryWriter` (the `tracking` extra: tensorboard): per round the losses and metrics,
workers, memory, local steps, round seconds and the spend against the budget; at the end the job's
hyper-parameters with the final metrics. The folder is rewritten on every fetch, so fetching a run
twice leaves one set of curves; the files are also stored under the run's prefix
(`runs/<run id>/tensorboard/`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# Per-round scalars: metrics.json's round field -> the tag TensorBoard shows.
ROUND_SCALARS = {
    "train_loss": "loss/train",
    "val_loss": "loss/validation",
    "val_accuracy": "metrics/val_accuracy",
    "val_rmse": "metrics/val_rmse",
    "val_r2": "metrics/val_r2",
    "workers": "plan/workers",
    "memory_mb": "plan/memory_mb",
    "local_steps": "plan/local_steps",
    "round_s": "time/round_s",
    "cost_total_usd": "cost/spent_usd",
}


def available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def write_tensorboard(metrics: dict[str, Any], folder: Path) -> list[Path]:
    """The run's event files in `folder` (replaced); returns them, or [] without tensorboard."""
    if not available():
        return []
    from torch.utils.tensorboard import SummaryWriter

    shutil.rmtree(folder, ignore_errors=True)
    job = metrics.get("job") or {}
    budget = (job.get("constraints") or {}).get("budget_usd")
    with SummaryWriter(log_dir=str(folder)) as w:
        for r in metrics.get("rounds", []):
            step = int(r["round"])
            for field, tag in ROUND_SCALARS.items():
                value = r.get(field)
                if value is not None and not (r.get("eval_only") and field in _TRAIN_ONLY):
                    w.add_scalar(tag, float(value), step)
            if budget:
                w.add_scalar("cost/spent_of_budget", float(r.get("cost_total_usd") or 0.0) / budget, step)
        final = metrics.get("final") or {}
        w.add_hparams(
            _hparams(job),
            {f"final/{k}": float(v) for k, v in final.items() if k in _FINAL and v is not None},
            run_name=".",
        )
    return sorted(p for p in folder.rglob("*") if p.is_file())


_TRAIN_ONLY = {"local_steps"}
_FINAL = ("val_accuracy", "val_loss", "val_rmse", "val_r2", "rounds", "estimated_cost_usd", "wall_seconds")


def _hparams(job: dict[str, Any]) -> dict[str, Any]:
    """The job's hyper-parameters as TensorBoard takes them (numbers, text, booleans)."""
    out: dict[str, Any] = {"model": (job.get("model") or {}).get("name", "")}
    for k, v in (job.get("training") or {}).items():
        if isinstance(v, (int, float, str, bool)):
            out[f"training.{k}"] = v
    for k, v in ((job.get("model") or {}).get("params") or {}).items():
        out[f"model.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    workers = job.get("workers") or {}
    out["workers.planner"] = workers.get("planner", "")
    return out
