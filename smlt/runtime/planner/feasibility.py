"""Whether the job can still be done: the refusal (which limit cannot be met, with the earliest
deadline and the smallest budget that would work), and what to do when no plan fits at any
percentile: give up when confidently infeasible, else a best-effort plan set.
numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.candidates import Candidates
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.evaluate import Choice, Evaluation, describe
from smlt.runtime.planner.explain import fmt_s, fmt_usd
from smlt.runtime.planner.stall import stalled
from smlt.runtime.planner.stops import finalize_cost, stop
from smlt.runtime.planner.types import Decision, RunHistory


def infeasible(job: Job, history: RunHistory, cand: Candidates, ev: Evaluation, base: np.ndarray) -> Decision:
    """The refusal (or, mid-run, the reason to stop): which constraint cannot be met, and the
    earliest deadline and the smallest budget that would work, each with its plan."""
    c, q = job.constraints, cfg().advise_q
    need_budget = history.cost_total_usd + ev.C[q] + (ev.f.cost_ub - ev.f.cost_warm)
    total_t = history.elapsed_s + ev.T[q]
    ok = base & ev.ok_rounds[q] & np.isfinite(ev.T[q])
    parts = []
    earliest = min_budget = None
    if c.deadline_seconds is not None:
        sel = ok & ev.ok_budget_mean[q] if c.budget_usd is not None else ok
        pool = sel if sel.any() else ok
        if pool.any():
            i = int(np.argmin(np.where(pool, total_t, np.inf)))
            earliest = float(total_t[i])
            parts.append(f"earliest feasible deadline ~{fmt_s(earliest)} ({describe(i, cand, ev)})")
            if earliest > c.deadline_seconds:
                parts[-1] += (
                    f": set constraints.deadline_seconds to at least {math.ceil(earliest):,} "
                    f"(now {c.deadline_seconds:,.{1 if c.deadline_seconds < 100 else 0}f})"  # not "now 15" for 14.5 s
                )
    if c.budget_usd is not None:
        sel = ok & ev.ok_deadline[q] if c.deadline_seconds is not None else ok
        pool = sel if sel.any() else ok
        if pool.any():
            i = int(np.argmin(np.where(pool, need_budget, np.inf)))
            min_budget = float(need_budget[i])
            parts.append(f"smallest budget that works ~{fmt_usd(min_budget)} ({describe(i, cand, ev)})")
            if min_budget > c.budget_usd:
                parts[-1] += (
                    f": set constraints.budget_usd to at least {_round_up_usd(min_budget)} (now {c.budget_usd:g})"
                )
    if not ok.any():
        rl = job.training.max_rounds - len(history.rounds)
        parts.append(
            f"the target is not predicted within the {rl} rounds max_rounds allows "
            f"(or is never reached by the curve so far)"
        )
    tgt = (
        f"{job.training.target_metric} {job.training.target_value}"
        if job.training.target_value is not None
        else f"{job.training.max_rounds} rounds of work"
    )
    have = []
    if c.deadline_seconds is not None:
        have.append(f"deadline {fmt_s(c.deadline_seconds)}")
    if c.budget_usd is not None:
        have.append(f"budget {fmt_usd(c.budget_usd)}")
    late = earliest is not None and c.deadline_seconds is not None and earliest > c.deadline_seconds
    reason = (
        f"infeasible: reaching {tgt} is predicted impossible with {' and '.join(have) or 'these limits'} "
        f"even optimistically (p{int(100 * cfg().admit_q)} of the rounds needed); " + "; ".join(parts)
    )
    return stop(
        reason,
        "deadline" if late else "budget",
        "infeasible",
        infeasible=True,
        earliest_deadline_s=earliest,
        min_budget_usd=min_budget,
    )


def _round_up_usd(x: float) -> str:
    """A budget to type in: x rounded up to two significant digits."""
    if x <= 0 or not math.isfinite(x):
        return f"{x:g}"
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return f"{math.ceil(x / step - 1e-9) * step:.{max(0, 1 - math.floor(math.log10(x)))}f}"


def _hopeful_midrun(x: Choice) -> np.ndarray:
    """Mid-run, the candidates that could still make it if the target came at midrun_optimism of
    the p10 rounds needed. The fitted curve's tail is not trusted fully: on curves measured here
    its 80 % interval covered only 62 %."""
    c, f, ev = x.job.constraints, x.f, x.ev
    r = np.ceil(cfg().midrun_optimism * ev.R[cfg().admit_q])
    t = f.round_s + np.maximum(r - 1, 0) * f.round_s_warm + P.FINALIZE_S
    cost = f.cost + np.maximum(r - 1, 0) * f.cost_warm + finalize_cost(x.prices, x.arch, x.tm.sizes)
    deadline = c.deadline_seconds if c.deadline_seconds is not None else math.inf
    ok = (x.history.elapsed_s + t <= deadline) & (x.spent + cost <= x.budget)
    return ok & (r <= x.job.training.max_rounds - len(x.history.rounds)) & np.isfinite(cost)


def nothing_fits(
    x: Choice, base: np.ndarray, guard: np.ndarray, reachable: bool
) -> Decision | tuple[np.ndarray, float, str, str]:
    """Nothing fits even at the 20th percentile: stop when confidently infeasible (even the 10th
    percentile of the progress forecast with the mean cost misses), else a best-effort plan set,
    its level, objective and note."""
    c, ev = x.job.constraints, x.ev
    q = cfg().admit_q
    hopeful = base & ev.ok_rounds[q] & ev.ok_deadline[q] & ev.ok_budget_mean[q] & np.isfinite(ev.C[q])
    if not x.first:
        hopeful |= base & _hopeful_midrun(x)
    evidence = x.first or (
        x.pm.n_obs >= cfg().min_obs_to_give_up and stalled(x.job, x.history, x.tm.shape.val_rows, cfg().plateau_rounds)
    )
    confident = (not hopeful.any() or not reachable) and evidence
    if confident and not c.best_effort:
        d = infeasible(x.job, x.history, x.cand, ev, base)
        if x.first:
            return d
        return x.final_stop(
            "stopping to save the budget: " + d.reason.replace("infeasible: ", "", 1),
            d.bound,
            "give_up",
            earliest_deadline_s=d.earliest_deadline_s,
            min_budget_usd=d.min_budget_usd,
        )
    # Not yet sure (or best effort): keep going within the hard guards, as well as possible.
    q = 0.5
    in_budget = guard & ev.ok_budget[q]
    if in_budget.any() and c.deadline_seconds is not None:
        return (
            in_budget,
            q,
            "speed",
            "best effort: the deadline is predicted to be missed, so the plan that makes the most "
            "progress by the deadline within budget",
        )
    return (
        guard,
        q,
        "cost",
        "best effort: the target is predicted out of reach within the budget, so the plan "
        "that buys the most progress with the time and money left",
    )
