"""The hard guards: the next round's worst case plus finalisation's must fit the money left (the
budget is a promise), and the round must end before the deadline with time for the evaluation
after it; when nothing passes, the stop (after a last look at the newest model if it is affordable).
numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.evaluate import Choice
from smlt.runtime.planner.explain import fmt_s, fmt_usd
from smlt.runtime.planner.feasibility import infeasible
from smlt.runtime.planner.stops import finalize_cost_ub, stop
from smlt.runtime.planner.timing import Forecast, TimingModel
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices


def budget_guard(
    job: Job, history: RunHistory, tm: TimingModel, n: int, m: int, k: int, prices: Prices, arch: str
) -> tuple[Forecast, float, bool]:
    """The hard budget guard of one round of n workers x m MB x k steps: its forecast (with the
    workers' limit its worst case assumes), finalisation's worst case, and whether the round's
    worst case plus finalisation's fits in the money left."""
    f = tm.forecast([n], [m], [k], history)
    fin_ub = finalize_cost_ub(prices, arch, tm.sizes)
    b = job.constraints.budget_usd
    return f, fin_ub, b is None or float(f.cost_ub[0]) + fin_ub <= b - history.cost_total_usd


def _budget_guard_stop(x: Choice, base: np.ndarray) -> Decision:
    """No candidate's worst case fits the budget: infeasible in round 0, else a budget stop."""
    f = x.f
    i = int(np.argmin(np.where(base, f.cost_ub, np.inf)))
    fin_ub = finalize_cost_ub(x.prices, x.arch, x.tm.sizes)
    if x.first:
        d = infeasible(x.job, x.history, x.cand, x.ev, base)
        one = float(f.cost_ub[i] + fin_ub)
        d.reason += (
            f"; the budget cannot even pay the worst case of one round plus finalisation "
            f"({fmt_usd(one)}, {x.describe(i)})"
        )
        d.min_budget_usd = max(d.min_budget_usd or 0.0, one)
        d.bound = "budget"
        return d
    reason = (
        f"budget: {fmt_usd(x.budget - x.spent)} left cannot pay the worst case of one more round "
        f"({fmt_usd(float(f.cost_ub[i]))} for the cheapest, {x.describe(i)}) plus "
        f"finalisation ({fmt_usd(fin_ub)})"
    )
    return (
        _last_look(x, reason)
        or _out_of_time(x, reason)
        or stop(reason, "budget", "budget_guard", predicted_round_cost_usd=float(f.cost[i]))
    )


def _out_of_time(x: Choice, reason: str) -> Decision | None:
    """A budget stop that leaves no time for an evaluation-only round before the deadline either:
    the deadline binds too, so it is the deadline's stop, after which the controller evaluates the
    newest model if the budget pays that round's worst case (`final_stop`), as after every
    deadline stop. As a budget stop the last trained round was never measured: the tight-budget
    digits MLP jobs ended on round 0's starting metric (0.066) 2.7 s before a 13.7 s deadline,
    with the evaluation's worst case affordable and only its time missing."""
    h, c = x.history, x.job.constraints
    if c.deadline_seconds is None or c.best_effort or not h.rounds or h.rounds[-1].local_steps <= 0:
        return None
    last = h.rounds[-1]
    f = x.tm.forecast([last.workers], [last.memory_mb], [0], h)
    t_left = c.deadline_seconds - h.elapsed_s
    eval_s = float(f.eval_round_s[0])
    if eval_s + P.FINALIZE_S <= t_left:
        return None  # there was time: the budget alone refused the evaluation round
    return x.final_stop(
        f"{reason}; deadline: {fmt_s(max(t_left, 0.0))} left, an evaluation round takes ~{fmt_s(eval_s)}",
        "deadline",
        "budget_guard",
    )


def _last_look(x: Choice, reason: str) -> Decision | None:
    """Before a budget stop, an evaluation-only round of the newest model when its worst case and
    finalisation fit the budget (and it ends before the deadline): a round's metric is of the model
    it started from, so without it the last round's training would never be seen (a tight budget's
    round 0 was wasted so). On the fewest workers allowed if that is cheaper (a worker's cold start
    and limit are most of an evaluation's worst case). The stop after it evaluates nothing more."""
    h, c = x.history, x.job.constraints
    if not h.rounds or h.rounds[-1].local_steps <= 0:
        return None
    last = h.rounds[-1]
    ns = sorted({x.job.workers.min, last.workers})
    f = x.tm.forecast(ns, [last.memory_mb] * len(ns), [0] * len(ns), h)
    need = f.eval_round_ub + finalize_cost_ub(x.prices, x.arch, x.tm.sizes)
    deadline = c.deadline_seconds if c.deadline_seconds is not None else math.inf
    ok = (need <= x.budget - x.spent) & (h.elapsed_s + f.eval_round_s + P.FINALIZE_S <= deadline)
    if not ok.any():
        return None
    i = int(np.argmin(np.where(ok, need, np.inf)))
    return Decision(
        action="train",
        workers=ns[i],
        memory_mb=last.memory_mb,
        local_steps=0,
        reason=f"{reason}; first an evaluation of the newest model (worst case {fmt_usd(float(need[i]))} with finalisation)",
        bound="budget",
        rule="last_look",
        predicted_round_s=float(f.eval_round_s[i]),
        worker_time_limit_s=round(float(f.eval_limit_s[i]), 1),
    )


def hard_guards(x: Choice, base: np.ndarray) -> np.ndarray | Decision:
    """The candidates whose next round is affordable in the worst case and finishes before the
    deadline, or the stop when there are none."""
    c, f = x.job.constraints, x.f
    guard = base & x.ev.affordable
    if not guard.any():
        return _budget_guard_stop(x, base)
    if c.deadline_seconds is not None and not c.best_effort:
        timely = guard & x.ev.fits_time & _seen_in_time(x)
        if not timely.any():
            i = int(np.argmin(np.where(guard, f.round_s, np.inf)))
            t_left = c.deadline_seconds - x.history.elapsed_s
            if x.first:
                return infeasible(x.job, x.history, x.cand, x.ev, base)
            return x.final_stop(
                f"deadline: {fmt_s(max(t_left, 0.0))} left, the shortest round ({x.describe(i)}) "
                f"takes ~{fmt_s(float(f.round_s[i]))}",
                "deadline",
                "deadline",
                predicted_round_s=float(f.round_s[i]),
            )
        guard = timely
    return guard


def _seen_in_time(x: Choice) -> np.ndarray:
    """The plans whose round can still be evaluated before the deadline: a round's metric is of
    the model it started from, so what a round trains shows only in the next round's record, at
    the latest the final evaluation after the deadline's stop. A round that leaves no time for
    that evaluation ends the run late (or was trained for nothing)."""
    c, f = x.job.constraints, x.f
    assert c.deadline_seconds is not None
    return x.history.elapsed_s + f.round_s + f.eval_round_s + P.FINALIZE_S <= c.deadline_seconds
