"""report.png: loss and the task's metric (accuracy, or RMSE and R²) against time and rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smlt.runtime.evaluation import summary_text
from smlt.runtime.items import FinalMetrics, RoundItem


def write_report(metrics: dict[str, Any], path: Path) -> None:
    """Plot metrics.json (finalize writes it: its rounds are ROUND items' views, its final the run's result)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r for r in map(RoundItem.model_validate, metrics["rounds"]) if r.val_loss is not None]
    if not rounds:
        return
    t0 = min(r.finished_at - r.round_s for r in rounds)
    xs_round: list[float] = [r.round for r in rounds]
    xs_time = [r.finished_at - t0 for r in rounds]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    for col, (xs, label) in enumerate(((xs_round, "round"), (xs_time, "seconds since start"))):
        ax = axes[0][col]
        ax.plot(xs, [r.val_loss for r in rounds], "o-", label="validation loss")
        train = [(x, r.train_loss) for x, r in zip(xs, rounds) if r.train_loss is not None]
        if train:
            ax.plot(*zip(*train), "s--", label="train loss")
        ax.set_xlabel(label), ax.set_ylabel("loss"), ax.set_yscale("log"), ax.legend()
        _plot_metric(axes[1][col], xs, rounds, label)
    final = FinalMetrics.model_validate(metrics["final"])
    fig.suptitle(
        f"smlt run {final.run_id}: {final.rounds} rounds, {summary_text(final.model_dump())}, "
        f"est. ${final.estimated_cost_usd:.4f}"
    )
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_metric(ax: Any, xs: list[float], rounds: list[RoundItem], xlabel: str) -> None:
    """The task's metric: accuracy, or for regression RMSE (the user's units) with R² beside it."""
    ax.set_xlabel(xlabel)
    if any(r.val_rmse is not None for r in rounds):
        ax.plot(xs, [r.val_rmse for r in rounds], "o-", color="tab:green", label="validation RMSE")
        ax.set_ylabel("RMSE"), ax.legend(loc="upper left")
        if any(r.val_r2 is not None for r in rounds):
            r2 = ax.twinx()
            r2.plot(xs, [r.val_r2 for r in rounds], "s--", color="tab:purple", label="validation R²")
            r2.set_ylabel("R²"), r2.legend(loc="upper right")
        return
    if any(r.val_accuracy is not None for r in rounds):
        ax.plot(xs, [r.val_accuracy for r in rounds], "o-", color="tab:green", label="validation accuracy")
    ax.set_ylabel("accuracy"), ax.legend()
