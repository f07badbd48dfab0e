"""The adaptive planner: (n, m, k) chosen every round from the run's timing and progress models,
as named steps over a `Choice`: stops, candidates, evaluation, hard guards, levels, the pick, and
the reason. See docs/planner.md, "The decision rule". numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import numpy as np

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner.candidates import Hold, candidates
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.evaluate import Choice, evaluate, fitted_timing, progress_model
from smlt.runtime.planner.feasibility import nothing_fits
from smlt.runtime.planner.guards import hard_guards
from smlt.runtime.planner.levels import candidate_levels, round_length_hedge
from smlt.runtime.planner.pick import Pick, fewest_workers, pick
from smlt.runtime.planner.reasons import train_decision
from smlt.runtime.planner.stops import final_stop, terminal
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices


def decide_adaptive(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    arch: str,
    sizes: FunctionSizes | None = None,
    hold: Hold | None = None,
) -> Decision:
    """The adaptive planner, a `Policy`: the plan of the next round (`hold`: dimensions held fixed,
    the ablations'), or the stop a rule calls for."""
    tr = job.training
    tm = fitted_timing(job, history, prices, arch, sizes)
    shape = tm.shape
    done = terminal(job, history, tm, prices, arch)
    if done:
        return done
    pm = progress_model(job, history, shape)
    assert pm.forecast is not None, "ProgressModel.fit sets the forecast"
    if tr.target_value is None and pm.forecast.p_done > 0.5 and history.rounds:
        return final_stop(
            job,
            history,
            tm,
            prices,
            arch,
            f"planned work done: the progress of {tr.max_rounds} rounds of {job.workers.initial} "
            f"workers x {tr.local_steps} steps has been made (no target set)",
            "max_rounds",
            "work_done",
        )
    cand = candidates(job, history, tiers, hold, shape.val_rows)
    x = Choice(job, history, tm, pm, prices, arch, cand, evaluate(job, history, cand, tm, pm, prices, arch))
    base = x.ev.valid.copy()
    # hard guards: the next round must be affordable in the worst case, and finish before the deadline
    guard = hard_guards(x, base & cand.reach & round_length_hedge(x))
    if isinstance(guard, Decision):
        return guard
    reachable = float(np.max(x.ev.R["p_never"])) < cfg().p_never_give_up
    first_fit = next(((ok, q, j) for ok, q, j in candidate_levels(x, guard, reachable) if ok.any()), None)
    if first_fit is not None:
        chosen, level, backup = first_fit
        p = Pick(chosen, level, backup, job.constraints.objective, "")
    else:
        fallback = nothing_fits(x, base, guard, reachable)
        if isinstance(fallback, Decision):
            return fallback
        chosen, level, objective, note = fallback
        p = Pick(chosen, level, None, objective, note)
    return train_decision(x, guard, pick(x, fewest_workers(x, p), guard))


def planning_history(history: RunHistory) -> RunHistory:
    """The history a training round is planned on. Before round 0 a built-in model's computed
    footprint decides admission only (`decide`'s refusal); round 0 itself is planned as the probe of
    an unmeasured model, long and cut by its limit where the model is slow (the limit, not the model,
    bounds its bill): planned on the footprint it was timid (benchmark, seeds 0-2: the ResNet-18 and
    transformer deadline jobs met 17 of 36 instead of 29)."""
    if history.rounds or (history.flops_per_sample is None and not history.param_count):
        return history
    return history.model_copy(update={"flops_per_sample": None, "param_count": 0})
