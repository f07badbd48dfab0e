"""The stops every planner keeps: the target met, max_rounds, and the final evaluation a stop buys.

A stop after which the controller evaluates the newest model (target, max_rounds, deadline) is
made only if the budget can pay that evaluation round's worst case plus finalisation's; otherwise
it is reported as a budget stop. numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

from smlt.runtime.bill import finalize_usd
from smlt.runtime.config import FunctionSizes
from smlt.runtime.evaluation import lower_is_better, target_reached
from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.explain import fmt_usd
from smlt.runtime.planner.timing import TimingModel
from smlt.runtime.planner.types import Decision, Rule, RunHistory
from smlt.runtime.prices import Prices


def finalize_cost_ub(prices: Prices, arch: str, sizes: FunctionSizes | None = None) -> float:
    """Finalize's worst case: 3x its seconds, its requests twice."""
    return float(finalize_usd(prices, arch, (sizes or FunctionSizes()).planner_memory_mb, 3 * P.FINALIZE_S, 2.0))


def finalize_cost(prices: Prices, arch: str, sizes: FunctionSizes | None = None) -> float:
    return float(finalize_usd(prices, arch, (sizes or FunctionSizes()).planner_memory_mb, P.FINALIZE_S))


def _metric_value(job: Job, history: RunHistory):
    if not history.rounds:
        return None
    return getattr(history.rounds[-1], job.training.target_metric)


def target_met(job: Job, history: RunHistory) -> bool:
    """The last round's model reached the target (the aggregator's rule, `target_reached`)."""
    if not history.rounds:
        return False
    last = history.rounds[-1]
    return target_reached(job.training, last)


def stop(reason: str, bound: str, rule: Rule, **kw) -> Decision:
    return Decision(action="stop", reason=reason, bound=bound, rule=rule, **kw)


def final_stop(
    job: Job,
    history: RunHistory,
    tm: TimingModel,
    prices: Prices,
    arch: str,
    reason: str,
    bound: str,
    rule: Rule,
    **kw,
) -> Decision:
    """A stop after which the controller evaluates the newest model (deadline, max_rounds,
    target): only if the budget can pay that evaluation round in the worst case; otherwise the
    stop is reported as a budget stop (its rule kept), which skips it."""
    if history.rounds and history.rounds[-1].local_steps > 0:
        last = history.rounds[-1]
        f = tm.forecast([last.workers], [last.memory_mb], [0], history)
        c = job.constraints
        left = (c.budget_usd - history.cost_total_usd) if c.budget_usd is not None else math.inf
        need = float(f.eval_round_ub[0]) + finalize_cost_ub(prices, arch, tm.sizes)
        if need > left:
            return stop(
                f"{reason}; the final evaluation is skipped: {fmt_usd(left)} left < its worst case {fmt_usd(need)}",
                "budget",
                rule,
                **kw,
            )
        kw.setdefault("worker_time_limit_s", round(float(f.eval_limit_s[0]), 1))
    return stop(reason, bound, rule, **kw)


def terminal(job: Job, history: RunHistory, tm: TimingModel, prices: Prices, arch: str) -> Decision | None:
    r = len(history.rounds)
    if target_met(job, history):
        v = _metric_value(job, history)
        op = "<=" if lower_is_better(job.training.target_metric) else ">="
        return final_stop(
            job,
            history,
            tm,
            prices,
            arch,
            f"target reached: {job.training.target_metric} {v:.4f} {op} {job.training.target_value} "
            f"(model of round {r - 1})",
            "target",
            "target_reached",
        )
    if r >= job.training.max_rounds:
        return final_stop(
            job,
            history,
            tm,
            prices,
            arch,
            # a repeated final evaluation round is in the history too: it trained nothing
            f"max_rounds reached: {min(r, job.training.max_rounds)} of {job.training.max_rounds} rounds trained",
            "max_rounds",
            "max_rounds",
        )
    return None
