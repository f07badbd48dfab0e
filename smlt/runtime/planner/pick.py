"""The pick within the chosen plan set: the fewest workers that fit, the objective (expected cost
or time to the end; best effort, the progress the time and money left buy), the fastest plan near
the cheapest, exploration of uncertain tiers and the periodic shorter round.
numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.evaluate import Choice


@dataclass
class Pick:
    """The chosen plan set and how the candidate in it was picked."""

    chosen: np.ndarray
    level: float
    backup: int | None
    objective: str
    note: str  # best effort
    at_risk: bool = False
    i: int = 0
    i_exploit: int = 0
    probe: str = ""  # why the plan is a shorter round than the best (`_short_round_probe`)

    @property
    def explore(self) -> bool:
        return self.i != self.i_exploit


def fewest_workers(x: Choice, p: Pick) -> Pick:
    """The plans on the fewest workers allowed, when any of them is in the chosen set: what n > 1
    buys rests on the averaging prior (beta), which a run hardly measures, and its n-fold bill is
    certain; so more workers only when no plan on the fewest meets the constraints at the level
    chosen (on the recorded ResNet-18 / transformer curves n > 1 learns far less per sample)."""
    fewest = p.chosen & (x.cand.n <= max(1, x.job.workers.min))
    if fewest.any():
        p.chosen = fewest
    return p


def _objective(x: Choice, p: Pick) -> np.ndarray:
    """What the pick minimises: the mean time or cost to the end; best effort, minus the progress
    the remaining time and money can buy."""
    c, ev, f = x.job.constraints, x.ev, x.f
    base_obj = ev.T["mean"] if p.objective == "speed" else ev.C["mean"]
    if p.note:
        dtau = x.pm.mean_round_progress(x.cand.n, x.cand.k)
        t_left = (c.deadline_seconds - x.history.elapsed_s) if c.deadline_seconds is not None else math.inf
        # the money the hard guard will let rounds spend: its worst-case reserve for the last one
        # stays unspent too (a plan with a dear worst case buys fewer rounds)
        money = x.spendable - (f.cost_ub - f.cost_warm)
        n_rounds = np.minimum(
            np.maximum(money, 0.0) / np.maximum(f.cost_warm, 1e-12), t_left / np.maximum(f.round_s_warm, 1e-9)
        )
        n_rounds = np.minimum(n_rounds, x.job.training.max_rounds - len(x.history.rounds))
        base_obj = -np.minimum(n_rounds, 1e9) * dtau
    return np.where(np.isfinite(base_obj), base_obj, 1e300)


def pick(x: Choice, p: Pick, guard: np.ndarray) -> Pick:
    """The candidate: the best by the objective, or one to explore (uncertain speed) while enough
    rounds remain to use what is learned, and never while the deadline is at risk."""
    if p.level <= 0.5 and p.backup is None and p.objective == "cost" and x.job.constraints.deadline_seconds is not None:
        if not p.note:
            # The deadline is at risk: among the plans that may still make it, the fastest.
            p.objective, p.at_risk = "speed", True
    base_obj = _objective(x, p)
    R_mean = x.ev.R["mean"]
    kappa = (
        np.where(R_mean >= cfg().explore_min_rounds, cfg().explore_kappa, 0.0)
        if not p.at_risk and p.level >= 0.7
        else 0.0
    )
    lcb = base_obj * np.maximum(0.5, 1.0 - kappa * x.f.rel_sd_param) if not p.note else base_obj
    p.i_exploit, p.i = _cheap_then_fast(x, p, base_obj), _cheap_then_fast(x, p, lcb)
    return _short_round_probe(x, p, guard)


def _short_round_probe(x: Choice, p: Pick, guard: np.ndarray) -> Pick:
    """Every short_round_every-th round from round 3 (rounds 4, 6, ...), a plan of k >=
    short_round_min_k steps with short_round_min_left or more median rounds left trains
    k / short_round_x steps instead (the nearest step count, same n and m) if that round passes the
    hard guards; best effort included. Why: the forecast credits a long round nearly k times a step
    and one k's curve cannot tell it otherwise. Rounds at two k do better than either alone (seeds
    5-7, deadlines met: a k / 4 cap on every such round 94 of 138, every third round 97, every
    second 98, none 95; docs/planner.md, "The decision rule")."""
    cand, r, i = x.cand, len(x.history.rounds), p.i
    if r < 3 or r % cfg().short_round_every or cand.k[i] < cfg().short_round_min_k:
        return p
    if float(x.ev.R[0.5][i]) < cfg().short_round_min_left:
        return p
    same = (cand.n == cand.n[i]) & (cand.m == cand.m[i]) & (cand.k < cand.k[i]) & guard
    if not same.any():
        return p
    gap = np.abs(np.log(np.maximum(cand.k, 1.0)) - math.log(float(cand.k[i]) / cfg().short_round_x))
    j = int(np.argmin(np.where(same, gap, np.inf)))
    p.probe = (
        f"exploring a shorter round: {int(cand.k[j])} steps instead of {int(cand.k[i])} "
        f"({x.describe(i)} is the plan), to measure what fewer steps per round buy"
    )
    p.i = j
    return p


def _cheap_then_fast(x: Choice, p: Pick, obj: np.ndarray) -> int:
    """The best candidate by `obj`; with a deadline and the cost objective, the fastest of those
    within time_for_cost of the cheapest: the cost headroom buys the deadline a margin (forecasts
    are optimistic: on recorded curves the median forecast was 0.8x the truth)."""
    i = int(np.argmin(np.where(p.chosen, obj, np.inf)))
    if p.note and x.job.constraints.objective == "speed":
        return _fast_best_effort(x, p, obj, i)
    if p.objective != "cost" or p.note or x.job.constraints.deadline_seconds is None:
        return i
    near = p.chosen & (obj <= obj[i] * (1.0 + cfg().time_for_cost))
    return int(np.argmin(np.where(near, x.ev.T["mean"], np.inf)))


def _fast_best_effort(x: Choice, p: Pick, obj: np.ndarray, i: int) -> int:
    """Best effort for the speed objective: of the plans that buy within time_for_cost of the most
    progress the money left can buy (`obj` is minus that progress), the one that buys it fastest.
    The most progress alone is the cheapest progress: a budget-bound speed run went to 1,024 MB
    rounds of ~48 s where 1,769 MB ran them in ~31 s for 7 % more a round."""
    near = p.chosen & (obj <= obj[i] * (1.0 - cfg().time_for_cost))
    dtau = x.pm.mean_round_progress(x.cand.n, x.cand.k)
    pace = x.f.round_s_warm / np.maximum(dtau, 1e-12)  # seconds per unit of progress
    return int(np.argmin(np.where(near, pace, np.inf)))
