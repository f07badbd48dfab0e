"""The first plan's forecast as a range: what `smlt quote` reports before any spend.

Read-only over the adaptive planner's own steps (`candidates`, `evaluate`, `feasibility`): the
same timing and progress models, candidates and evaluation the first plan is chosen from, so the
quote and the run agree. Nothing here changes a decision.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner.adaptive import decide_adaptive, planning_history
from smlt.runtime.planner.candidates import Candidates, candidates
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.evaluate import evaluate, fitted_timing, progress_model
from smlt.runtime.planner.feasibility import infeasible
from smlt.runtime.planner.fixed import fixed_plan
from smlt.runtime.planner.policy import decide
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices

LOW_Q, HIGH_Q = 0.1, 0.9  # the range: the held plan's time and cost at p10 and p90 of the rounds needed


class Outlook(BaseModel):
    """Time and cost to the target of one plan held for the whole run (`_held_plan`), at p10 / p50
    / p90 of the rounds needed (conditional on the target being reachable; `p_never` is the rest)."""

    workers: int
    memory_mb: int
    local_steps: int
    rounds: tuple[float, float, float]
    seconds: tuple[float, float, float]
    cost_usd: tuple[float, float, float]
    round_s: float
    round_cost_usd: float


class FirstForecast(BaseModel):
    """What the first plan knows: the decision, its plan's outlook, the limits that would work,
    and the sequential steps the progress model expects one worker to need (for a one-VM price)."""

    decision: Decision
    outlook: Outlook | None
    earliest_deadline_s: float | None
    min_budget_usd: float | None
    p_never: float
    sequential_steps: float | None  # median local steps one worker needs (min over the step grid)


def _finite(x: float) -> float:
    return float(x) if math.isfinite(float(x)) else math.inf


UNBOUNDED = 1e12  # a limit the job leaves unset, for the limits that would work (never binds)


def _bounded(job: Job) -> Job:
    """`job` with any unset deadline or budget taken as unbounded, so the refusal's arithmetic gives
    the earliest deadline and the smallest budget of every job (with no budget, the fastest plan's
    time; with no deadline, the cheapest plan's cost)."""
    c = job.constraints
    bounded = c.model_copy(
        update={"deadline_seconds": c.deadline_seconds or UNBOUNDED, "budget_usd": c.budget_usd or UNBOUNDED}
    )
    return job.model_copy(update={"constraints": bounded})


def _runs(job: Job, cand: Candidates, tiers: list[int]) -> np.ndarray:
    """The candidates the job's planner may run: all of them (adaptive), or its one plan (fixed)."""
    if job.workers.planner != "fixed":
        return np.ones(len(cand.n), bool)
    n, m, k = fixed_plan(job, tiers)
    return (cand.n == n) & (cand.m == m) & (cand.k == k)


def _held_plan(
    job: Job,
    history: RunHistory,
    first: Decision,
    tiers: list[int],
    prices: Prices,
    architecture: str,
    sizes: FunctionSizes,
) -> Decision:
    """The plan the run is expected to hold to the target. A fixed planner's one plan; the adaptive
    planner's plan on the model's footprint (admission's, `decide`'s first look): round 0,
    planned without the footprint (`planning_history`), probes the model, and from round 1
    the planner plans on what round 0 measured, which the footprint predicts. Held to the target,
    the probe's plan was a poor forecast: its rounds timed on the footprint are not the ones the
    run goes on with (benchmark, bench/experiments/2026-12-06-quote-calibration.md)."""
    if first.action != "train" or job.workers.planner == "fixed" or planning_history(history) is history:
        return first
    held = decide_adaptive(job, history, tiers, prices, architecture, sizes)
    return held if held.action == "train" else first


def first_forecast(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str = "x86_64",
    sizes: FunctionSizes | None = None,
) -> FirstForecast:
    """The first plan of `job` (`decide`) with its p10-p90 outlook, the earliest deadline and
    smallest budget that work (the refusal's numbers, computed for every job; of its one plan for a
    fixed planner), from `history` (before round 0: the dataset's rows and bytes, the built-in
    model's footprint)."""
    sizes = sizes or FunctionSizes()
    tiers = sorted(tiers) or [job.workers.memory_mb or 2048]
    decision = decide(job, history, tiers, prices, architecture, sizes)
    tm = fitted_timing(job, history, prices, architecture, sizes)
    pm = progress_model(job, history, tm.shape)
    cand = candidates(job, history, tiers, None, tm.shape.val_rows)
    ev = evaluate(job, history, cand, tm, pm, prices, architecture)
    limits = infeasible(_bounded(job), history, cand, ev, ev.valid & _runs(job, cand, tiers))

    held = _held_plan(job, history, decision, tiers, prices, architecture, sizes)
    outlook = None
    if held.action == "train":
        hit = np.flatnonzero((cand.n == held.workers) & (cand.m == held.memory_mb) & (cand.k == held.local_steps))
        if hit.size:
            i = int(hit[0])
            qs = (LOW_Q, 0.5, HIGH_Q)
            outlook = Outlook(
                workers=held.workers,
                memory_mb=held.memory_mb,
                local_steps=held.local_steps,
                rounds=tuple(_finite(ev.R[q][i]) for q in qs),  # type: ignore[arg-type]
                seconds=tuple(_finite(ev.T[q][i]) for q in qs),  # type: ignore[arg-type]
                cost_usd=tuple(_finite(ev.C[q][i]) for q in qs),  # type: ignore[arg-type]
                round_s=float(ev.f.round_s[i]),
                round_cost_usd=float(ev.f.cost[i]),
            )
    assert pm.forecast is not None, "ProgressModel.fit sets the forecast"
    ks = np.asarray(cfg().k_set, dtype=float)
    one = pm.forecast.summary(np.ones_like(ks), ks, qs=(0.5,))
    steps = one[0.5] * ks
    finite = steps[np.isfinite(steps)]
    return FirstForecast(
        decision=decision,
        outlook=outlook,
        earliest_deadline_s=limits.earliest_deadline_s,
        min_budget_usd=limits.min_budget_usd,
        p_never=float(np.min(one["p_never"])),
        sequential_steps=float(finite.min()) if finite.size else None,
    )
