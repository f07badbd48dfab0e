"""Every candidate's predictions of the rest of the run: the run's fitted timing and progress
models, each plan's rounds, time and cost to the target by percentile and which limits they keep,
and `Choice`, what the adaptive planner knows while it chooses. numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.candidates import Candidates
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.progress import ProgressModel
from smlt.runtime.planner.stops import final_stop, finalize_cost, finalize_cost_ub
from smlt.runtime.planner.timing import Forecast, JobShape, TimingModel
from smlt.runtime.planner.types import Decision, Rule, RunHistory
from smlt.runtime.prices import Prices


def fitted_timing(
    job: Job, history: RunHistory, prices: Prices, arch: str, sizes: FunctionSizes | None = None
) -> TimingModel:
    """The run's timing model: the job's shape, fitted to its rounds so far."""
    t = job.training
    return TimingModel(JobShape.of(history, t.batch_size, t.compression, t.mode), prices, arch, sizes).fit(history)


def progress_model(job: Job, history: RunHistory, shape: JobShape) -> ProgressModel:
    tr = job.training
    return ProgressModel(
        metric=tr.target_metric,
        target=tr.target_value,
        momentum=tr.momentum,
        batch=tr.batch_size,
        train_rows=shape.train_rows,
        val_rows=shape.val_rows,
        quorum=tr.quorum,
        max_rounds=tr.max_rounds,
        initial_workers=job.workers.initial,
        initial_steps=tr.local_steps,
        optimizer=tr.optimizer,
    ).fit(history)


@dataclass
class Evaluation:
    """Per-candidate predictions of the rest of the run."""

    f: Forecast
    R: dict
    T: dict  # total seconds to the end, by quantile
    C: dict  # total cost to the end, by quantile
    ok_rounds: dict
    ok_deadline: dict
    ok_budget: dict
    ok_budget_mean: dict  # the mean cost fits (optimistic: no worst-case slack)
    affordable: np.ndarray  # the next round's worst case + reserve fits the budget
    fits_time: np.ndarray  # the next round (+ final evaluation) fits before the deadline
    valid: np.ndarray  # within Lambda limits


def evaluate(
    job: Job, history: RunHistory, cand: Candidates, tm: TimingModel, pm: ProgressModel, prices: Prices, arch: str
) -> Evaluation:
    c = job.constraints
    f = tm.forecast(cand.n, cand.m, cand.k, history)
    # rounds needed: computed per distinct (n, k) then mapped
    nk = np.stack([cand.n, cand.k], 1)
    uniq, inv = np.unique(nk, axis=0, return_inverse=True)
    inv = inv.ravel()
    assert pm.forecast is not None, "ProgressModel.fit sets the forecast"
    c_ = cfg()
    qs = sorted({0.1, 0.2, 0.5, 0.7, 0.9, *c_.feasible_qs, *c_.backup_qs, c_.admit_q, c_.advise_q, c_.budget_q})
    s = pm.forecast.summary(uniq[:, 0], uniq[:, 1], qs=tuple(qs))
    R = {q: v[inv] for q, v in s.items()}
    fin = finalize_cost(prices, arch, tm.sizes)
    fin_ub = finalize_cost_ub(prices, arch, tm.sizes)
    spent = history.cost_total_usd
    budget = c.budget_usd if c.budget_usd is not None else math.inf
    deadline = c.deadline_seconds if c.deadline_seconds is not None else math.inf
    rounds_left = job.training.max_rounds - len(history.rounds)
    T, C, okr, okd, okb = {}, {}, {}, {}, {}
    slack = f.cost_ub - f.cost_warm
    # one spare round (at most 5 % of the time left) for the noise of the last rounds
    spare = (
        np.minimum(f.round_s_warm, 0.05 * max(deadline - history.elapsed_s, 0.0)) if math.isfinite(deadline) else 0.0
    )
    okbm = {}
    for q in (*cfg().feasible_qs, cfg().admit_q, "mean"):
        r = R[q]
        T[q] = f.round_s + np.maximum(r - 1, 0) * f.round_s_warm + P.FINALIZE_S
        C[q] = f.cost + np.maximum(r - 1, 0) * f.cost_warm + fin
        okr[q] = r <= rounds_left
        okd[q] = history.elapsed_s + T[q] + spare <= deadline
        okb[q] = spent + C[q] + slack + fin_ub <= budget
        okbm[q] = spent + C[q] <= budget
    affordable = spent + f.cost_ub + fin_ub <= budget
    fits_time = history.elapsed_s + f.round_s + P.FINALIZE_S <= deadline
    valid = f.handler_p90 + P.COLD_INIT_MAX_S <= 0.8 * tm.sizes.worker_timeout_s
    return Evaluation(f, R, T, C, okr, okd, okb, okbm, affordable, fits_time, valid)


def describe(i: int, cand: Candidates, ev: Evaluation) -> str:
    return f"{int(cand.n[i])} workers x {int(cand.m[i])} MB x {int(cand.k[i])} steps"


@dataclass
class Choice:
    """What the adaptive planner knows while it chooses: the job, its models and their predictions."""

    job: Job
    history: RunHistory
    tm: TimingModel
    pm: ProgressModel
    prices: Prices
    arch: str
    cand: Candidates
    ev: Evaluation

    @property
    def f(self) -> Forecast:
        return self.ev.f

    @property
    def spent(self) -> float:
        return self.history.cost_total_usd

    @property
    def budget(self) -> float:
        b = self.job.constraints.budget_usd
        return b if b is not None else math.inf

    @property
    def spendable(self) -> float:
        """The budget rounds may still spend: finalisation's worst case stays reserved."""
        return self.budget - self.spent - finalize_cost_ub(self.prices, self.arch, self.tm.sizes)

    @property
    def first(self) -> bool:
        return not self.history.rounds

    def final_stop(self, reason: str, bound: str, rule: Rule, **kw) -> Decision:
        return final_stop(self.job, self.history, self.tm, self.prices, self.arch, reason, bound, rule, **kw)

    def describe(self, i: int) -> str:
        return describe(i, self.cand, self.ev)
