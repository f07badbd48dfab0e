"""The fixed planner: the job's own (workers.initial, memory, local_steps) every round, under the
same stops and the budget and deadline guards as the adaptive planner. `fixed_plan_guard` lends
its budget guard to plans fixed outside the planner (the benchmark's guarded oracle).
numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math
from typing import Any

from smlt.runtime.capacity import FULL_VCPU_MB
from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.evaluate import fitted_timing
from smlt.runtime.planner.explain import fmt_s, fmt_usd
from smlt.runtime.planner.guards import budget_guard
from smlt.runtime.planner.stops import final_stop, stop, terminal
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices


def default_tier(tiers: list[int]) -> int:
    above = [t for t in sorted(tiers) if t >= FULL_VCPU_MB]
    return above[0] if above else max(tiers)


def fixed_plan(job: Job, tiers: list[int]) -> tuple[int, int, int]:
    """(workers, memory MB, local steps) of the fixed planner's one plan."""
    return job.workers.initial, job.workers.memory_mb or default_tier(tiers), job.training.local_steps


def fixed_plan_guard(
    job: Job,
    history: RunHistory,
    n: int,
    m: int,
    k: int,
    prices: Prices,
    arch: str,
    sizes: FunctionSizes | None = None,
) -> tuple[bool, float]:
    """`budget_guard` for a plan fixed from outside the planner (the benchmark's guarded oracle):
    whether the round fits, and the workers' limit (s)."""
    tm = fitted_timing(job, history, prices, arch, sizes)
    f, _, fits = budget_guard(job, history, tm, n, m, k, prices, arch)
    return fits, float(f.time_limit_s[0])


def decide_fixed(
    job: Job, history: RunHistory, tiers: list[int], prices: Prices, arch: str, sizes: FunctionSizes | None = None
) -> Decision:
    """The fixed planner, a `Policy`: `fixed_plan` every round, or the stop a rule calls for."""
    tm = fitted_timing(job, history, prices, arch, sizes)
    done = terminal(job, history, tm, prices, arch)
    if done:
        return done
    n, m, k = fixed_plan(job, tiers)
    c = job.constraints
    f, fin_ub, fits = budget_guard(job, history, tm, n, m, k, prices, arch)
    left = (c.budget_usd - history.cost_total_usd) if c.budget_usd is not None else math.inf
    common: dict[str, Any] = dict(predicted_round_s=float(f.round_s[0]), predicted_round_cost_usd=float(f.cost[0]))
    if not fits:
        return stop(
            f"budget: {fmt_usd(left)} left cannot pay the worst case of one more round "
            f"({fmt_usd(float(f.cost_ub[0]))}) plus finalisation ({fmt_usd(fin_ub)})",
            "budget",
            "budget_guard",
            infeasible=not history.rounds,  # not even round 0 fits: the job is refused, not "done"
            **common,
        )
    if c.deadline_seconds is not None and not c.best_effort:
        t_left = c.deadline_seconds - history.elapsed_s
        if float(f.round_s[0]) + P.FINALIZE_S > t_left:
            return final_stop(
                job,
                history,
                tm,
                prices,
                arch,
                f"deadline: {fmt_s(max(t_left, 0))} left, a round takes ~{fmt_s(float(f.round_s[0]))}",
                "deadline",
                "deadline",
                infeasible=not history.rounds,
                **common,
            )
    budget_txt = f"; budget left {fmt_usd(left)}" if math.isfinite(left) else ""
    return Decision(
        action="train",
        workers=n,
        memory_mb=m,
        local_steps=k,
        bound="none",
        rule="fixed",
        reason=(
            f"fixed plan: {n} workers x {m} MB x {k} steps; predicted round {fmt_s(float(f.round_s[0]))}, "
            f"{fmt_usd(float(f.cost[0]))} (worst case {fmt_usd(float(f.cost_ub[0]))}){budget_txt}"
        ),
        worker_time_limit_s=round(float(f.time_limit_s[0]), 1),
        **common,
    )
