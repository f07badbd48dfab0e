"""The adaptive planner: (n, m, k) chosen every round from the run's timing and progress models,
as named steps over a `Choice`: stops, candidates, evaluation, hard guards, levels, the pick, and
the reason. See docs/planner.md, "The decision rule". numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner.candidates import Hold, candidates
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.config import using
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
    c = cfg()
    if not (c.setting_plateau and c.plateau_move_room_rounds > 0):
        return _decide(job, history, tiers, prices, arch, sizes, hold)[0]
    # A plateau per setting with the move-room test: its plan where it is the one-plateau model's,
    # else only where the deadline has room for a cold start and `plateau_move_room_rounds` rounds
    # of it on top of a forecast to the target: its own median (bench/experiments/
    # 2026-12-07-plateau-slack.md) or, with `plateau_move_room_main`, the one-plateau model's p90 of
    # its own plan (experimental, bench/experiments/2026-12-07-plateau-slack-2.md).
    d, fc = _decide(job, history, tiers, prices, arch, sizes, hold)
    with using(c.model_copy(update={"plateau_k_sd": 0.0, "plateau_n_sd": 0.0})):
        d_one, fc_one = _decide(job, history, tiers, prices, arch, sizes, hold)
    same = (d.action, d.workers, d.memory_mb, d.local_steps) == (
        d_one.action,
        d_one.workers,
        d_one.memory_mb,
        d_one.local_steps,
    )
    if c.plateau_move_room_main and not same and d.action == d_one.action == "train" and not c.plateau_move_room_k:
        # a change of k alone (the same workers and tier) is no move
        same = (d.workers, d.memory_mb) == (d_one.workers, d_one.memory_mb)
    deadline = job.constraints.deadline_seconds
    if deadline is None or same:
        room = True
    elif fc is None:
        room = False
    elif c.plateau_move_room_main:
        # the detour (its next round, cold start included, and r - 1 warm rounds), then the
        # one-plateau model's own plan to the target at its p90 (its median where the p90 is infinite)
        t_main = None if fc_one is None else (fc_one.t90 if np.isfinite(fc_one.t90) else fc_one.t50)
        room = t_main is not None and bool(np.isfinite(t_main)) and fc.elapsed_s + fc.detour_s + t_main <= deadline
    else:
        room = fc.elapsed_s + fc.t50 + fc.detour_s <= deadline
    return d if same or (d.action == "train" and room) else d_one


class _Forecast(NamedTuple):
    """A training decision's forecast, for the move-room test: the run's elapsed seconds, the plan's
    seconds to the target (median, p90), and its detour: its next round (cold start included) and
    `plateau_move_room_rounds` - 1 warm rounds."""

    elapsed_s: float
    t50: float
    t90: float
    detour_s: float


def _decide(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    arch: str,
    sizes: FunctionSizes | None,
    hold: Hold | None,
) -> tuple[Decision, _Forecast | None]:
    """`decide_adaptive`'s decision, and for a round to train its forecast (`_Forecast`)."""
    tr = job.training
    tm = fitted_timing(job, history, prices, arch, sizes)
    shape = tm.shape
    done = terminal(job, history, tm, prices, arch)
    if done:
        return done, None
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
        ), None
    cand = candidates(job, history, tiers, hold, shape.val_rows)
    x = Choice(job, history, tm, pm, prices, arch, cand, evaluate(job, history, cand, tm, pm, prices, arch))
    base = x.ev.valid.copy()
    # hard guards: the next round must be affordable in the worst case, and finish before the deadline
    guard = hard_guards(x, base & cand.reach & round_length_hedge(x))
    if isinstance(guard, Decision):
        return guard, None
    p_never = x.ev.R["p_never"][guard] if cfg().setting_plateau and guard.any() else x.ev.R["p_never"]
    reachable = float(np.min(p_never) if cfg().setting_plateau else np.max(p_never)) < cfg().p_never_give_up
    first_fit = next(((ok, q, j) for ok, q, j in candidate_levels(x, guard, reachable) if ok.any()), None)
    if first_fit is not None:
        chosen, level, backup = first_fit
        p = Pick(chosen, level, backup, job.constraints.objective, "")
    else:
        fallback = nothing_fits(x, base, guard, reachable)
        if isinstance(fallback, Decision):
            return fallback, None
        chosen, level, objective, note = fallback
        p = Pick(chosen, level, None, objective, note)
    picked = pick(x, fewest_workers(x, p), guard)
    rounds, i = cfg().plateau_move_room_rounds, picked.i
    fc = (
        _Forecast(
            history.elapsed_s,
            float(x.ev.T[0.5][i]),
            float(x.ev.T[0.9][i]),
            float(x.f.round_s[i] + (rounds - 1) * x.f.round_s_warm[i]),
        )
        if rounds > 0
        else None
    )
    return train_decision(x, guard, picked), fc


def planning_history(history: RunHistory) -> RunHistory:
    """The history a training round is planned on. Before round 0 a built-in model's computed
    footprint decides admission only (`decide`'s refusal); round 0 itself is planned as the probe of
    an unmeasured model, long and cut by its limit where the model is slow (the limit, not the model,
    bounds its bill): planned on the footprint it was timid (benchmark, seeds 0-2: the ResNet-18 and
    transformer deadline jobs met 17 of 36 instead of 29)."""
    if history.rounds or (history.flops_per_sample is None and not history.param_count):
        return history
    return history.model_copy(update={"flops_per_sample": None, "param_count": 0})
