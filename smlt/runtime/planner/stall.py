"""The run's own evidence that it stopped improving: a stall of its validation metric beyond the
split's noise (giving up), and one while every round trained on several workers (averaging
stops short, so n is capped at one). numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

from smlt.runtime.evaluation import PROPORTIONS, lower_is_better
from smlt.runtime.job import Job
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.types import RunHistory, noise_rows


def stalled(job: Job, history: RunHistory, val_rows: int, window: int | None = None) -> bool:
    """The run's own evidence that it stopped improving: over the last `window` validation points
    the best metric rose no more than the split's noise above the best before them. The
    model's P(out of reach) alone is not enough: its curve family saturates too early on real curves."""
    window = cfg().stall_rounds if window is None else window
    metric = job.training.target_metric
    ys = [float(v) for r in history.rounds if (v := getattr(r, metric)) is not None]
    if len(ys) <= window:
        return False
    sign = -1.0 if lower_is_better(metric) else 1.0
    before, recent = ys[:-window], ys[-window:]
    rows = noise_rows(metric, val_rows, history.val_class_rows)
    return _no_rise(metric, sign, max(sign * y for y in before), max(sign * y for y in recent), rows)


def stalled_averaging(job: Job, history: RunHistory, val_rows: int, window: int | None = None) -> bool:
    """The run stalled (`stalled`) at some point while every round it evaluated in that stretch
    had trained on more than one worker: the run's own evidence that averaging stops short.
    (A round's metric is of the model it started from, so evaluation i judges round i - 1.)
    One pass over the history: the planner asks this every round of a long run."""
    window = cfg().averaging_stall_rounds if window is None else window
    metric = job.training.target_metric
    sign = -1.0 if lower_is_better(metric) else 1.0
    evals = [(i, sign * float(v)) for i, r in enumerate(history.rounds) if (v := getattr(r, metric)) is not None]
    rows = noise_rows(metric, val_rows, history.val_class_rows)
    best_before = -math.inf  # the best of the evaluations before the stretch judged
    for end in range(window + 1, len(evals) + 1):
        best_before = max(best_before, evals[end - window - 1][1])
        shown = evals[end - window : end]
        trained = [history.rounds[i - 1] for i, _ in shown if i > 0]
        if not trained or min(r.workers_ok or r.workers for r in trained) <= 1:
            continue
        if _no_rise(metric, sign, best_before, max(y for _, y in shown), rows):
            return True
    return False


def _no_rise(metric: str, sign: float, best_before: float, best_recent: float, rows: float) -> bool:
    """The recent best (signed: higher is better) is within the split's noise of the best before."""
    return best_recent - best_before <= cfg().stall_z * math.sqrt(2.0) * _metric_sd(metric, sign * best_before, rows)


def _metric_sd(metric: str, value: float, rows: float) -> float:
    """The sd of one validation measurement of `metric` at `value`: a proportion's (accuracy,
    balanced accuracy) binomial on `rows` (`types.noise_rows`), else 1 % of the value."""
    if metric in PROPORTIONS:
        return math.sqrt(max(value * (1.0 - value), 1e-4) / max(rows, 1.0))
    return 0.01 * max(abs(value), 1e-3)
