"""The planner's words: amounts of time and money as a reason writes them (`fmt_s`, `fmt_usd`),
and what changed since the last plan, the part of a plan's reason that says why this round's plan
differs from (or keeps) the last one.

The last round's measured per-step time against what the model predicted before it, whether its
workers were cut, how its cost compares with its plan's prediction, how the metric moved, and the
plan before and now. numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner.timing import JobShape, TimingModel
from smlt.runtime.planner.types import RoundRecord, RunHistory
from smlt.runtime.prices import Prices


def fmt_s(s: float) -> str:
    if s is None or not math.isfinite(s):
        return "never"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_usd(c: float) -> str:
    if c is None or not math.isfinite(c):
        return "unbounded"
    if c < 0.01:
        return f"${c:.5f}"
    if c < 10:
        return f"${c:.4f}"
    return f"${c:,.2f}"


def measured_step_s(r: RoundRecord) -> float | None:
    """The round's mean per-step compute seconds over the steps its workers actually took."""
    if r.local_steps <= 0:
        return None
    c = [
        t.compute_s / t.steps_done(r.local_steps, r.batch_size)
        for t in r.timings
        if (t.error is None or t.error == "TimeLimit") and t.compute_s > 0
    ]
    return float(np.mean(c)) if c else None


def _step_before(shape: JobShape, history: RunHistory, prices: Prices, arch: str, sizes: FunctionSizes | None):
    """What the timing model predicted for the last round's tier from the rounds before it."""
    last = history.rounds[-1]
    before = history.model_copy(update={"rounds": history.rounds[:-1]})
    tm = TimingModel(shape, prices, arch, sizes).fit(before)
    return float(tm.step_seconds(np.array([float(last.memory_mb)]))[0][0])


def _metric_moved(job: Job, history: RunHistory) -> str | None:
    name = job.training.target_metric
    seen = [(r.round, getattr(r, name)) for r in history.rounds if getattr(r, name) is not None]
    if not seen:
        return None
    if len(seen) == 1:
        return f"{name} {seen[-1][1]:.4f}"
    return f"{name} {seen[-2][1]:.4f} -> {seen[-1][1]:.4f}"


def since_last(
    job: Job,
    history: RunHistory,
    shape: JobShape,
    plan: tuple[int, int, int],
    prices: Prices,
    arch: str,
    sizes: FunctionSizes | None = None,
) -> str | None:
    """'since round r: ...' for a plan made after round r, or None before the first round."""
    if not history.rounds:
        return None
    last = history.rounds[-1]
    said = []
    step = measured_step_s(last)
    if step is not None:
        before = _step_before(shape, history, prices, arch, sizes)
        cut = " (workers cut at the limit)" if last.cut else ""
        said.append(
            f"step time measured {1e3 * step:.1f} ms at {last.memory_mb} MB vs {1e3 * before:.1f} ms predicted{cut}"
        )
    said.append(f"round took {last.round_s:.1f} s and ${last.cost_usd:.5f}")
    moved = _metric_moved(job, history)
    if moved:
        said.append(moved)
    was = (last.workers, last.memory_mb, last.local_steps)
    if last.local_steps > 0:
        said.append(
            "plan kept" if was == plan else f"plan changed from {was[0]} workers x {was[1]} MB x {was[2]} steps"
        )
    return f"since round {last.round}: " + ", ".join(said)
