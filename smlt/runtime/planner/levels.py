"""Which candidates the adaptive planner may choose, in order: the round-length hedge, then the
levels (safe median plans with a way out, then the whole plan at p90 ... p20), each with its
progress percentile and its backup plan. numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.evaluate import Choice, Evaluation


def round_length_hedge(x: Choice) -> np.ndarray:
    """The candidates whose k is within the hedge on the round's length: k of the set up to the
    first whose compute (the round less the same round at k = 0) reaches overhead_x times that
    fixed overhead, in seconds when time is the scarcer limit, in dollars when money is (the share
    of the time left the fastest plan needs at the median vs the share of the money left the
    cheapest plan needs; time on a tie). Round 0 is exempt: its step time
    is a prior and its own limit caps it (`step_reach`)."""
    cand, f, ev = x.cand, x.f, x.ev
    if x.first:
        return np.ones(len(cand.k), bool)
    # the same round at k = 0 depends on (n, m) alone: forecast once per distinct pair
    nm, pair = np.unique(np.stack([cand.n, cand.m], 1), axis=0, return_inverse=True)
    f0 = x.tm.forecast(nm[:, 0], nm[:, 1], np.zeros(len(nm)), x.history)
    round0, cost0 = f0.round_s_warm[pair.ravel()], f0.cost_warm[pair.ravel()]
    # a k is allowed while the step count below it in the set stayed under the multiple
    ks = np.unique(cand.k)
    below = np.concatenate([[0.0], ks])[np.searchsorted(ks, cand.k)] / np.maximum(cand.k, 1.0)
    in_time = np.maximum(f.round_s_warm - round0, 0.0) * below < cfg().overhead_x * round0
    in_cost = np.maximum(f.cost_warm - cost0, 0.0) * below < cfg().cost_overhead_x * cost0
    c = x.job.constraints
    t_left = (c.deadline_seconds - x.history.elapsed_s) if c.deadline_seconds is not None else math.inf
    sel = ev.valid & cand.reach & (in_time | in_cost)
    need_t = float(np.min(np.where(sel, ev.T[0.5], np.inf))) / max(t_left, 1e-9)
    need_c = float(np.min(np.where(sel, ev.C[0.5], np.inf))) / max(x.spendable, 1e-12)
    return in_time if need_t >= need_c else in_cost


def _median_plan(x: Choice, guard: np.ndarray, finite: np.ndarray, safe) -> np.ndarray:
    ev = x.ev
    return guard & ev.ok_rounds[0.5] & ev.ok_deadline[0.5] & ev.ok_budget[cfg().budget_q] & finite & safe


def _fast_plan(x: Choice, guard: np.ndarray, safe: np.ndarray) -> np.ndarray:
    """The speed objective's plans at the median: the budget judged by `budget_safe` alone, so a
    fast plan whose own way to the target does not fit may train while, after its worst round, the
    cheapest plan could still pay its way (`_median_plan` also asks the plan to pay its own way,
    which left the way out unused: budget-bound speed runs dropped to 1,769 MB and ended with a
    fifth of their budget unspent)."""
    ev = x.ev
    return guard & ev.ok_rounds[0.5] & ev.ok_deadline[0.5] & np.isfinite(ev.T[0.5]) & safe


def deadline_safe(ev: Evaluation, qs: float, j: int, t_left: float) -> np.ndarray:
    """The plans that keep a way out if progress is slow (percentile qs): each finishes by the
    deadline itself, or after one round of it the fastest plan j still would. (Late in a run only
    the first holds for a long round: without it, "one round, then the fast plan from scratch"
    left only rounds of a few steps, each buying almost nothing.)"""
    f = ev.f
    after_one = f.round_s + ev.T[qs][j] + min(float(f.round_s_warm[j]), 0.05 * t_left) <= t_left
    return ev.ok_deadline[qs] | after_one


def budget_safe(ev: Evaluation, qs: float, j: int, left: float) -> np.ndarray:
    """The speed objective's mirror of `deadline_safe`: each plan pays its own way to the target
    if progress is slow, or after one round of it (worst case) the cheapest plan j still could;
    `left` is the budget left less finalisation's worst case."""
    return ev.ok_budget[qs] | (ev.f.cost_ub + ev.C[qs][j] <= left)


def candidate_levels(x: Choice, guard: np.ndarray, reachable: bool) -> list[tuple[np.ndarray, float, int | None]]:
    """The candidate sets to try in order, each with its progress percentile and its backup plan."""
    c, ev = x.job.constraints, x.ev
    levels: list[tuple[np.ndarray, float, int | None]] = []
    if not reachable:
        return levels
    if c.deadline_seconds is not None and c.objective == "cost":
        # Plan for the median, but only where a way out stays open: after one round of this plan,
        # the fastest affordable plan must still finish by the deadline if progress turns out slow
        # (p90, then p70). Re-planning every round makes this recourse real.
        t_left = c.deadline_seconds - x.history.elapsed_s
        for qs in cfg().backup_qs:
            fast = guard & ev.ok_rounds[qs] & ev.ok_budget_mean[qs] & np.isfinite(ev.T[qs])
            if not fast.any():
                continue
            j = int(np.argmin(np.where(fast, ev.T[qs], np.inf)))
            safe = deadline_safe(ev, qs, j, t_left)
            levels.append((_median_plan(x, guard, np.isfinite(ev.C[0.5]), safe), qs, j))
    if c.budget_usd is not None and c.objective == "speed":
        # The mirror image for speed: go fast at the median only while, after this round, the
        # cheapest plan could still pay its way to the target, judged at budget_q like every
        # budget test (the hard guard already makes overspending impossible). At p90/p70 the
        # way out pushed speed runs to cheap, slow tiers the oracle did not need.
        for qs in cfg().speed_backup_qs:
            cheap = guard & ev.ok_rounds[qs] & ev.ok_deadline[qs] & np.isfinite(ev.C[qs])
            if not cheap.any():
                continue
            j = int(np.argmin(np.where(cheap, ev.C[qs], np.inf)))
            safe = budget_safe(ev, qs, j, x.spendable)
            levels.append((_fast_plan(x, guard, safe), qs, j))
    for q in cfg().feasible_qs:
        qb = min(q, cfg().budget_q)
        levels.append((guard & ev.ok_rounds[q] & ev.ok_deadline[q] & ev.ok_budget[qb] & np.isfinite(ev.C[qb]), q, None))
    return levels
