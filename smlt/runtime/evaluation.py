"""The metric rule: a round's validation metrics from the workers' sums, and which target
metrics a task has and which way they improve.

Workers report sums over their validation slice (`val_loss_sum`, `val_correct`, `val_count`);
the aggregator turns the sums of a round into its metrics here, once, and stores them in the
ROUND item, where finalize, the progress line and the report read them.

Classification: `val_loss` (mean cross-entropy), `val_accuracy`, and each class's recall (the share
of its rows predicted as it: `val_class_recall`, from per-class sums, for up to MAX_CLASS_SUMS
classes) with their mean, `val_balanced_accuracy`: a model that predicts the most common class for
every row has a fine accuracy on imbalanced classes and a balanced accuracy of 1/k. Regression: `val_loss` (the
mean over samples of the squared error summed over targets, on the stored, standardised scale),
`val_rmse` and `val_r2` in the user's units from the manifest's `TargetScaling`, never an
accuracy. With no scaling recorded (a dataset prepared before targets were scaled) the RMSE is on
the stored scale and there is no R².
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from smlt.runtime.data.manifest import TargetScaling

Task = Literal["classification", "regression"]
TargetMetric = Literal["val_accuracy", "val_balanced_accuracy", "val_loss", "val_rmse", "val_r2"]

# The target metrics a task can reach (val_loss: any task).
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("val_loss", "val_accuracy", "val_balanced_accuracy"),
    "regression": ("val_loss", "val_rmse", "val_r2"),
}
LOWER_IS_BETTER = frozenset({"val_loss", "val_rmse"})
# Fractions (accuracy, the mean of the classes' recalls); R² = 1 is a perfect fit.
AT_MOST_ONE = frozenset({"val_accuracy", "val_balanced_accuracy", "val_r2"})
# Fractions of validation rows (or the mean of per-class fractions): a proportion's noise.
PROPORTIONS = frozenset({"val_accuracy", "val_balanced_accuracy"})


# Classes a worker sums its validation rows per class for (more: no per-class metrics).
MAX_CLASS_SUMS = 1000


class ValMetrics(BaseModel):
    """A round's validation metrics (None: not measured, or not a metric of the task)."""

    val_loss: float | None = None
    val_accuracy: float | None = None
    val_rmse: float | None = None
    val_r2: float | None = None
    val_balanced_accuracy: float | None = None  # the mean of the classes' recalls
    val_class_recall: list[float | None] | None = None  # by class index; None for a class with no rows


def val_metrics(
    loss_sum: float,
    correct: int,
    count: int,
    *,
    task: str,
    outputs: int,
    target: TargetScaling | None,
    class_correct: Sequence[int] = (),
    class_count: Sequence[int] = (),
) -> ValMetrics:
    """The metrics of `count` evaluated rows from the workers' sums.

    Regression with k targets: the workers sum the squared errors over targets, so the scaled MSE
    of each target is taken as the sum's share `loss_sum / (count * k)` (exact for one target).
    Then MSE_j in the user's units is that times std_j², `val_rmse = sqrt(mean_j MSE_j)` and
    `val_r2 = mean_j (1 - MSE_j / val_var_j)`."""
    if count <= 0:
        return ValMetrics()
    loss = loss_sum / count
    if task == "classification":
        if not class_count or sum(class_count) != count:  # not summed per class (or not by every worker)
            return ValMetrics(val_loss=loss, val_accuracy=correct / count)
        recall = [c / n if n else None for c, n in zip(class_correct, class_count, strict=True)]
        present = [r for r in recall if r is not None]
        balanced = sum(present) / len(present) if present else None
        return ValMetrics(
            val_loss=loss, val_accuracy=correct / count, val_balanced_accuracy=balanced, val_class_recall=recall
        )
    k = len(target.std) if target is not None else max(outputs, 1)
    mse = loss_sum / (count * k)  # per target, standardised units
    if target is None:
        return ValMetrics(val_loss=loss, val_rmse=math.sqrt(mse))
    user_mse = [mse * s * s for s in target.std]
    rmse = math.sqrt(sum(user_mse) / k)
    if not all(v > 0 for v in target.val_var):  # a constant target: R² is not defined
        return ValMetrics(val_loss=loss, val_rmse=rmse)
    r2 = sum(1.0 - m / v for m, v in zip(user_mse, target.val_var, strict=True)) / k
    return ValMetrics(val_loss=loss, val_rmse=rmse, val_r2=r2)


def lower_is_better(metric: str) -> bool:
    return metric in LOWER_IS_BETTER


def metric_reaches(metric: str, target: float | None, value: float | None) -> bool:
    """The job's stop rule, the one the aggregator, the planner and the simulators apply:
    val_loss and val_rmse at or below the target, val_accuracy, val_balanced_accuracy and val_r2
    at or above it. A metric not measured (None: a round missing a worker's slice, or one
    without every worker's per-class sums for balanced accuracy) never reaches it."""
    if target is None or value is None:
        return False
    return value <= target if lower_is_better(metric) else value >= target


class Target(Protocol):
    """What the stop rule reads of a job's training spec (smlt.runtime.job.TrainingSpec)."""

    @property
    def target_metric(self) -> str: ...
    @property
    def target_value(self) -> float | None: ...


def target_reached(training: Target, metrics: object) -> bool:
    """`metric_reaches` for the job's target metric, given a round's metrics (a ROUND item, a
    RoundRecord or a `ValMetrics`: anything with the metric's attribute)."""
    value = getattr(metrics, training.target_metric, None)
    return metric_reaches(training.target_metric, training.target_value, value)


def target_metric_problem(metric: str, task: str, field: str = "training.target_metric") -> str | None:
    """Why a target on `metric` can never be reached on a `task` dataset (None: it can)."""
    if metric in TASK_METRICS[task]:
        return None
    if task == "regression":  # val_accuracy, val_balanced_accuracy
        return f"{field}: {metric} needs a classification dataset; use val_loss, val_rmse or val_r2"
    return f"{field}: {metric} needs a regression dataset; use val_accuracy, val_balanced_accuracy or val_loss"


def balanced_problem(metric: str, classes: int, field: str = "training.target_metric") -> str | None:
    """Why `val_balanced_accuracy` is not measured on a dataset of `classes` classes (None: it is):
    the workers sum per class for at most MAX_CLASS_SUMS classes, so no round would have it."""
    if metric != "val_balanced_accuracy" or classes <= MAX_CLASS_SUMS:
        return None
    return (
        f"{field}: val_balanced_accuracy is measured for at most {MAX_CLASS_SUMS:,} classes (per-class "
        f"sums) and the dataset has {classes:,}, so no round would have it: use val_accuracy or val_loss"
    )


def metrics_text(m: ValMetrics, prefix: str = "val", balanced: bool = False) -> str:
    """A round's metrics as its progress line prints them: `val acc 0.9721` (`val acc 0.9721 bal
    0.8120` with the balanced accuracy, when it is the run's target or BALANCE_GAP below the
    accuracy), or for regression `val rmse 52.10 r2 0.5120` (in the user's units); `val loss`
    when neither was measured."""
    if m.val_accuracy is not None:
        bal = m.val_balanced_accuracy
        shown = bal is not None and (balanced or bal < m.val_accuracy - BALANCE_GAP)
        return f"{prefix} acc {m.val_accuracy:.4f}" + (f" bal {bal:.4f}" if shown else "")
    if m.val_rmse is not None:
        return f"{prefix} rmse {m.val_rmse:.4g}" + ("" if m.val_r2 is None else f" r2 {m.val_r2:.4f}")
    return f"{prefix} loss {m.val_loss if m.val_loss is not None else math.nan:.4f}"


# Balanced accuracy this far below the accuracy is worth a word even when every class is predicted.
BALANCE_GAP = 0.1


def class_warning(final: Mapping[str, Any], classes: Sequence[str] | None = None) -> str | None:
    """A run's final metrics whose accuracy hides a class the model misses (some class's recall 0,
    or a balanced accuracy BALANCE_GAP below the accuracy): what to say, else None."""
    recall, balanced, accuracy = (
        final.get("val_class_recall"),
        final.get("val_balanced_accuracy"),
        final.get("val_accuracy"),
    )
    if not recall or balanced is None or accuracy is None:
        return None
    missed = [i for i, r in enumerate(recall) if r == 0]
    if not missed and balanced >= accuracy - BALANCE_GAP:
        return None

    def name(i: int) -> str:
        return repr(classes[i]) if classes is not None and i < len(classes) else f"#{i}"

    if missed:
        shown = ", ".join(name(i) for i in missed[:3]) + (f" and {len(missed) - 3} more" if len(missed) > 3 else "")
        what = f"no validation row of class {shown} is predicted as its class"
    else:
        low = min((r, i) for i, r in enumerate(recall) if r is not None)
        what = f"class {name(low[1])} has the lowest recall, {low[0]:.4f}"
    return (
        f"balanced accuracy {balanced:.4f} (the mean of the classes' recalls) against accuracy {accuracy:.4f}: "
        f"{what}; on imbalanced classes accuracy rewards predicting the common ones "
        '(training.class_weights "balanced" weighs the rare ones up)'
    )


def summary_text(final: Mapping[str, Any], metric: str | None = None) -> str:
    """A run's final metrics (FinalMetrics' dump, metrics.json's `final`) as its summary prints
    them: `val accuracy 0.9610`, or for regression `val rmse 53.2100, val r2 0.4800` (`n/a`
    where not measured); with the job's target `metric` val_balanced_accuracy, that too."""

    def num(name: str) -> str:
        v = final.get(name)
        return "n/a" if v is None else f"{v:.4f}"

    if final.get("task") == "regression":
        return f"val rmse {num('val_rmse')}, val r2 {num('val_r2')}"
    text = f"val accuracy {num('val_accuracy')}"
    if metric == "val_balanced_accuracy":
        text += f", val balanced accuracy {num('val_balanced_accuracy')}"
    return text
