"""The adaptive planner's decision to train, in words: which limit bound the plan, how safe it is,
what else shaped it (notes), and its predictions. numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.evaluate import Choice
from smlt.runtime.planner.explain import fmt_s, fmt_usd, since_last
from smlt.runtime.planner.pick import Pick
from smlt.runtime.planner.types import Decision, Note


def _binding(x: Choice, guard: np.ndarray, p: Pick) -> tuple[str, float, int]:
    """Which constraint bound the choice, at which percentile, and the plan it kept out."""
    ev, i = x.ev, p.i
    qb = 0.5 if p.backup is not None else p.level
    qbud = min(qb, cfg().budget_q)
    free = guard & ev.ok_rounds[qb] & np.isfinite(ev.C[qb])
    i_free = (
        int(np.argmin(np.where(free, ev.C["mean"] if p.objective == "cost" else ev.T["mean"], np.inf)))
        if free.any()
        else i
    )
    if p.note:
        bound = "deadline" if p.objective == "speed" else "budget"
    elif p.objective == "cost":
        bound = (
            "deadline"
            if (not ev.ok_deadline[qb][i_free] or i_free != i and not p.chosen[i_free])
            else ("budget" if not ev.ok_budget[qbud][i_free] else "none")
        )
    else:
        bound = "budget" if not ev.ok_budget[qbud][i_free] else "none"
    if bound == "none" and not ev.ok_rounds[cfg().feasible_qs[0]][i]:
        bound = "max_rounds"
    return bound, qb, i_free


def _limits_text(x: Choice) -> str | None:
    c = x.job.constraints
    lim = []
    if c.deadline_seconds is not None:
        lim.append(f"{fmt_s(max(c.deadline_seconds - x.history.elapsed_s, 0))} left")
    if c.budget_usd is not None:
        lim.append(f"{fmt_usd(x.budget - x.spent)} left")
    return " and ".join(lim) if lim else None


def _why(x: Choice, p: Pick, bound: str, qb: float, i_free: int) -> list[str]:
    """What bound the plan, how safe it is, and what else the reader should know."""
    ev, f, i, level, backup = x.ev, x.f, p.i, p.level, p.backup
    pieces = []
    if bound == "deadline" and not p.note:
        pieces.append(
            f"deadline binds (the cheapest plan, {x.describe(i_free)}, would take ~{fmt_s(float(ev.T[qb][i_free]))})"
        )
    elif bound == "budget" and not p.note:
        pieces.append(
            f"budget binds (the fastest plan, {x.describe(i_free)}, would cost ~{fmt_usd(float(ev.C[qb][i_free]))})"
        )
    elif bound == "max_rounds":
        pieces.append("max_rounds binds")
    if backup is not None and not p.note and p.objective == "speed":
        pieces.append(
            f"safe: if progress is slow (p{int(level * 100)}), {x.describe(backup)} could still "
            f"pay its way to the target (~{fmt_usd(float(ev.C[level][backup]))})"
        )
    elif backup is not None and not p.note:
        pieces.append(
            f"safe: if progress is slow (p{int(level * 100)}), {x.describe(backup)} would still "
            f"finish in ~{fmt_s(float(ev.T[level][backup]))}"
        )
    elif level < 0.7 and not p.note:
        pieces.append(
            f"tight: feasible only at the p{int(level * 100)} progress forecast"
            + (", so the fastest plan within budget" if p.at_risk else "")
        )
    p_never = float(ev.R["p_never"][i])
    if p_never >= 0.05:
        pieces.append(f"{100 * p_never:.0f} % chance the curve saturates below the target")
    if p.probe:
        pieces.append(p.probe)
    elif p.explore:
        pieces.append(
            f"exploring: {int(x.cand.m[i])} MB speed is uncertain (+-{100 * float(f.rel_sd_param[i]):.0f} %), "
            f"the best-known plan is {x.describe(p.i_exploit)}"
        )
    if x.cand.averaging_stalled:
        pieces.append(f"at most {max(1, x.job.workers.min)} worker(s): the models averaged from more stalled")
    elif x.cand.speed_one_worker:
        pieces.append(f"at most {max(1, x.job.workers.min)} worker(s): the speed objective does not count on averaging")
    if p.note:
        pieces.append(p.note)
    return pieces


def _notes(x: Choice, p: Pick) -> list[Note]:
    """What shaped the plan besides its rule (the pieces of `_why` that say so)."""
    notes: list[Note] = []
    if x.cand.averaging_stalled:
        notes.append("averaging_stalled")
    elif x.cand.speed_one_worker:
        notes.append("speed_one_worker")
    if p.probe:
        notes.append("short_round")
    return notes


def train_decision(x: Choice, guard: np.ndarray, p: Pick) -> Decision:
    """The decision to train the picked candidate, with its predictions and the reason."""
    tr, ev, f, i = x.job.training, x.ev, x.f, p.i
    bound, qb, i_free = _binding(x, guard, p)
    rq = float(ev.R[p.level][i])
    r50 = float(ev.R[0.5][i])
    T_i, C_i = float(ev.T[0.5][i]), float(ev.C[0.5][i])  # at the median forecast
    T70, C70 = float(ev.T[0.7][i]), float(ev.C[0.7][i])
    pieces = [
        f"{x.describe(i)}: round ~{fmt_s(float(f.round_s[i]))}, ~{fmt_usd(float(f.cost[i]))} "
        f"(worst case {fmt_usd(float(f.cost_ub[i]))})"
    ]
    if tr.target_value is not None:
        pieces.append(
            f"~{r50:.0f} rounds to {tr.target_metric} {tr.target_value} (p{int(p.level * 100)} {rq:.0f}), "
            f"~{fmt_s(T_i)} and ~{fmt_usd(C_i)} in all"
        )
    else:
        pieces.append(f"~{r50:.0f} rounds of planned work left, ~{fmt_s(T_i)} and ~{fmt_usd(C_i)} in all")
    limits = _limits_text(x)
    if limits:
        pieces.append(limits)
    pieces += _why(x, p, bound, qb, i_free)
    plan = (int(x.cand.n[i]), int(x.cand.m[i]), int(x.cand.k[i]))
    changed = since_last(x.job, x.history, x.tm.shape, plan, x.prices, x.arch, x.tm.sizes)
    if changed:
        pieces.insert(1, changed)
    return Decision(
        action="train",
        workers=int(x.cand.n[i]),
        memory_mb=int(x.cand.m[i]),
        local_steps=int(x.cand.k[i]),
        reason="; ".join(pieces),
        bound=bound,
        rule="best_effort" if p.note else "feasible",
        notes=_notes(x, p),
        predicted_round_s=float(f.round_s[i]),
        predicted_round_cost_usd=float(f.cost[i]),
        predicted_rounds_left=r50,
        worker_time_limit_s=round(float(f.time_limit_s[i]), 1),
        predicted_total_s=T_i if math.isfinite(T_i) else None,
        predicted_total_cost_usd=C_i if math.isfinite(C_i) else None,
        predicted_rounds_left_p70=float(ev.R[0.7][i]),
        predicted_total_s_p70=T70 if math.isfinite(T70) else None,
        predicted_total_cost_usd_p70=C70 if math.isfinite(C70) else None,
        explore=p.explore,
    )
