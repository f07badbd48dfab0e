"""The decision of one round: train (n workers, memory tier m, k local steps) or stop, and why.

See docs/planner.md for the models and the rule. numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from smlt.runtime.bill import finalize_usd
from smlt.runtime.capacity import FULL_VCPU_MB, memory_needed_mb, shard_bytes_held
from smlt.runtime.config import FunctionSizes
from smlt.runtime.evaluation import lower_is_better, target_reached
from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.config import PlannerConfig, using
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.explain import since_last
from smlt.runtime.planner.progress import ProgressModel
from smlt.runtime.planner.timing import Forecast, JobShape, TimingModel
from smlt.runtime.planner.types import Decision, Note, Rule, RunHistory
from smlt.runtime.prices import Prices


# ------------------------------------------------------------------------------ helpers
def fmt_s(s: float) -> str:
    if s is None or not math.isfinite(s):
        return "never"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_usd(c: float) -> str:
    if c is None or not math.isfinite(c):
        return "unbounded"
    if c < 0.01:
        return f"${c:.5f}"
    if c < 10:
        return f"${c:.4f}"
    return f"${c:,.2f}"


def default_tier(tiers: list[int]) -> int:
    above = [t for t in sorted(tiers) if t >= FULL_VCPU_MB]
    return above[0] if above else max(tiers)


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


def _stop(reason: str, bound: str, rule: Rule, **kw) -> Decision:
    return Decision(action="stop", reason=reason, bound=bound, rule=rule, **kw)


def _final_stop(
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
            return _stop(
                f"{reason}; the final evaluation is skipped: {fmt_usd(left)} left < its worst case {fmt_usd(need)}",
                "budget",
                rule,
                **kw,
            )
        kw.setdefault("worker_time_limit_s", round(float(f.eval_limit_s[0]), 1))
    return _stop(reason, bound, rule, **kw)


def _terminal(job: Job, history: RunHistory, tm: TimingModel, prices: Prices, arch: str) -> Decision | None:
    r = len(history.rounds)
    if target_met(job, history):
        v = _metric_value(job, history)
        op = "<=" if lower_is_better(job.training.target_metric) else ">="
        return _final_stop(
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
        return _final_stop(
            job,
            history,
            tm,
            prices,
            arch,
            f"max_rounds reached: {r} of {job.training.max_rounds} rounds trained",
            "max_rounds",
            "max_rounds",
        )
    return None


def _tiers_usable(job: Job, history: RunHistory, tiers: list[int]) -> list[int]:
    tiers = sorted(set(int(t) for t in tiers))
    if job.workers.memory_mb:
        return [job.workers.memory_mb]
    oom = [t.memory_mb for r in history.rounds for t in r.timings if t.error and "memory" in t.error.lower()]
    floor = max(oom) if oom else 0
    # The worker's own ModelTooLarge rule, with what the run knows (the activations once measured)
    need = memory_needed_mb(
        history.param_count or 0,
        data_bytes=shard_bytes_held(history.shard_bytes),
        activation_mb=history.activation_mb or 0.0,
    )
    ok = [t for t in tiers if t > floor and t >= need]
    if not ok:
        ok = [t for t in tiers if t > floor] or [max(tiers)]
        ok = ok[-1:]
    return ok


# ------------------------------------------------------------------------------ fixed
def fitted_timing(
    job: Job, history: RunHistory, prices: Prices, arch: str, sizes: FunctionSizes | None = None
) -> TimingModel:
    """The run's timing model: the job's shape, fitted to its rounds so far."""
    t = job.training
    return TimingModel(JobShape.of(history, t.batch_size, t.compression, t.mode), prices, arch, sizes).fit(history)


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


def fixed_plan(job: Job, tiers: list[int]) -> tuple[int, int, int]:
    """(workers, memory MB, local steps) of the fixed planner's one plan."""
    return job.workers.initial, job.workers.memory_mb or default_tier(tiers), job.training.local_steps


def decide_fixed(
    job: Job, history: RunHistory, tiers: list[int], prices: Prices, arch: str, sizes: FunctionSizes | None = None
) -> Decision:
    tm = fitted_timing(job, history, prices, arch, sizes)
    done = _terminal(job, history, tm, prices, arch)
    if done:
        return done
    n, m, k = fixed_plan(job, tiers)
    c = job.constraints
    f, fin_ub, fits = budget_guard(job, history, tm, n, m, k, prices, arch)
    left = (c.budget_usd - history.cost_total_usd) if c.budget_usd is not None else math.inf
    common: dict[str, Any] = dict(predicted_round_s=float(f.round_s[0]), predicted_round_cost_usd=float(f.cost[0]))
    if not fits:
        return _stop(
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
            return _final_stop(
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


# ------------------------------------------------------------------------------ adaptive
@dataclass
class Candidates:
    n: np.ndarray
    m: np.ndarray
    k: np.ndarray
    reach: np.ndarray  # within step_reach: the plans the next round may use (the rest inform admission)
    averaging_stalled: bool = False  # n capped at one: models averaged from n > 1 workers stalled
    speed_one_worker: bool = False  # n capped at one: the speed objective (`speed_trains_one_worker`)


@dataclass(frozen=True)
class Hold:
    """Dimensions of the plan held fixed (the ablations of smlt.sim.ablations); None: chosen."""

    workers: int | None = None
    memory_mb: int | None = None
    local_steps: int | None = None


def step_reach(job: Job, history: RunHistory) -> tuple[int, int]:
    """The largest n and k the planner may try next: step_up_x times the largest tried so far (the
    workers that reported; the steps they actually took, a cut round counts what it did), at least
    the job's initial workers and local steps; in round 0 of a cost-objective job, k up to
    first_steps_up_x times the job's."""
    n_seen, k_seen = job.workers.initial, job.training.local_steps
    for r in history.rounds:
        done = [t.steps_done(r.local_steps, r.batch_size) for t in r.timings if t.error is None]
        if r.local_steps > 0 and done:
            n_seen, k_seen = max(n_seen, len(done)), max(k_seen, max(done))
    if not history.rounds and job.constraints.objective == "cost":
        return cfg().step_up_x * n_seen, cfg().first_steps_up_x * k_seen
    return cfg().step_up_x * n_seen, cfg().step_up_x * k_seen


def stalled_averaging(job: Job, history: RunHistory, val_rows: int, window: int | None = None) -> bool:
    """The run stalled (`stalled`) at some point while every round it evaluated in that stretch
    had trained on more than one worker: the run's own evidence that averaging stops short.
    (A round's metric is of the model it started from, so evaluation i judges round i - 1.)
    One pass over the history: the planner asks this every round of a long run."""
    window = cfg().averaging_stall_rounds if window is None else window
    metric = job.training.target_metric
    sign = -1.0 if lower_is_better(metric) else 1.0
    evals = [(i, sign * float(v)) for i, r in enumerate(history.rounds) if (v := getattr(r, metric)) is not None]
    best_before = -math.inf  # the best of the evaluations before the stretch judged
    for end in range(window + 1, len(evals) + 1):
        best_before = max(best_before, evals[end - window - 1][1])
        shown = evals[end - window : end]
        trained = [history.rounds[i - 1] for i, _ in shown if i > 0]
        if not trained or min(r.workers_ok or r.workers for r in trained) <= 1:
            continue
        if _no_rise(metric, sign, best_before, max(y for _, y in shown), val_rows):
            return True
    return False


def speed_trains_one_worker(job: Job, hold: Hold) -> bool:
    """The speed objective trains on one worker (`workers.min` if higher) from round 0: it
    presumes the stall that caps the cost objective's n (`stalled_averaging`). A speed run spends
    its budget, so n workers' n-fold round (and n-fold worst case, which the hard guard reserves)
    is paid for with a slower tier or a shorter run, for a gain the model credits from its
    averaging prior, which the run learns little about; on the recorded curves n > 1 plateaus
    below one worker's level. Measured: docs/planner.md, "The decision rule", the speed objective.
    Not when a dimension is held: an ablation (`workers_only`) chooses n itself."""
    return job.constraints.objective == "speed" and hold == Hold()


def candidates(
    job: Job, history: RunHistory, tiers: list[int], hold: Hold | None = None, val_rows: int | None = None
) -> Candidates:
    w, hold = job.workers, hold or Hold()
    n_max, k_max = step_reach(job, history)
    averaging_stalled = val_rows is not None and hold.workers is None and stalled_averaging(job, history, val_rows)
    speed_one_worker = speed_trains_one_worker(job, hold)
    if averaging_stalled or speed_one_worker:
        # Averaged workers' models stalled below the target, or the speed objective presumes they
        # would: more of them will not get past it (on the recorded ResNet-18 / transformer curves
        # n > 1 plateaus below one worker's level).
        n_max = max(1, w.min)
    ns = sorted({x for x in cfg().n_set if w.min <= x <= w.max} | {w.min, w.max, min(w.max, n_max), w.initial})
    ks = sorted(set(cfg().k_set) | {job.training.local_steps})
    ms = _tiers_usable(job, history, tiers)
    if hold.workers is not None:
        ns = [hold.workers]
    if hold.local_steps is not None:
        ks = [hold.local_steps]
    if hold.memory_mb is not None:
        # a held tier that ran out of memory gives way to the next usable one
        ms = [hold.memory_mb] if hold.memory_mb in ms else ms[:1]
    N, M, K = np.meshgrid(np.array(ns, float), np.array(ms, float), np.array(ks, float), indexing="ij")
    n, m, k = N.ravel(), M.ravel(), K.ravel()
    # The step bound limits what the next round tries, not what the job could reach later: admission
    # and giving up judge every plan (a job that needs k = 500 is feasible even if round 0 tries 80).
    reach = (hold.workers is not None) | (n <= n_max) | ((n == w.initial) & (w.initial <= n_max))
    reach &= (hold.local_steps is not None) | (k <= k_max) | (k == job.training.local_steps)
    return Candidates(n, m, k, reach, averaging_stalled, speed_one_worker and not averaging_stalled)


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


def round_length_hedge(x: _Choice) -> np.ndarray:
    """The candidates whose k is within the hedge on the round's length: k of the set up to the
    first whose compute (the round less the same round at k = 0) reaches overhead_x times that
    fixed overhead, in seconds when time is the scarcer limit, in dollars when money is (the share
    of the time left the fastest plan needs at the median vs the share of the money left the
    cheapest plan needs; time on a tie). Round 0 is exempt: its step time
    is a prior and its own limit caps it (`step_reach`)."""
    cand, f, ev = x.cand, x.f, x.ev
    if x.first:
        return np.ones(len(cand.k), bool)
    f0 = x.tm.forecast(cand.n, cand.m, np.zeros_like(cand.k), x.history)
    # a k is allowed while the step count below it in the set stayed under the multiple
    ks = np.unique(cand.k)
    below = np.concatenate([[0.0], ks])[np.searchsorted(ks, cand.k)] / np.maximum(cand.k, 1.0)
    in_time = np.maximum(f.round_s_warm - f0.round_s_warm, 0.0) * below < cfg().overhead_x * f0.round_s_warm
    in_cost = np.maximum(f.cost_warm - f0.cost_warm, 0.0) * below < cfg().cost_overhead_x * f0.cost_warm
    c = x.job.constraints
    t_left = (c.deadline_seconds - x.history.elapsed_s) if c.deadline_seconds is not None else math.inf
    sel = ev.valid & cand.reach & (in_time | in_cost)
    need_t = float(np.min(np.where(sel, ev.T[0.5], np.inf))) / max(t_left, 1e-9)
    need_c = float(np.min(np.where(sel, ev.C[0.5], np.inf))) / max(x.spendable, 1e-12)
    return in_time if need_t >= need_c else in_cost


def _evaluate(
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


def _describe(i: int, cand: Candidates, ev: Evaluation) -> str:
    return f"{int(cand.n[i])} workers x {int(cand.m[i])} MB x {int(cand.k[i])} steps"


def _infeasible(job: Job, history: RunHistory, cand: Candidates, ev: Evaluation, base: np.ndarray) -> Decision:
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
            parts.append(f"earliest feasible deadline ~{fmt_s(earliest)} ({_describe(i, cand, ev)})")
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
            parts.append(f"smallest budget that works ~{fmt_usd(min_budget)} ({_describe(i, cand, ev)})")
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
    return _stop(
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


@dataclass
class _Choice:
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
        return _final_stop(self.job, self.history, self.tm, self.prices, self.arch, reason, bound, rule, **kw)

    def describe(self, i: int) -> str:
        return _describe(i, self.cand, self.ev)


def _progress_model(job: Job, history: RunHistory, shape: JobShape) -> ProgressModel:
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


def _budget_guard_stop(x: _Choice, base: np.ndarray) -> Decision:
    """No candidate's worst case fits the budget: infeasible in round 0, else a budget stop."""
    f = x.f
    i = int(np.argmin(np.where(base, f.cost_ub, np.inf)))
    fin_ub = finalize_cost_ub(x.prices, x.arch, x.tm.sizes)
    if x.first:
        d = _infeasible(x.job, x.history, x.cand, x.ev, base)
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
        or _stop(reason, "budget", "budget_guard", predicted_round_cost_usd=float(f.cost[i]))
    )


def _out_of_time(x: _Choice, reason: str) -> Decision | None:
    """A budget stop that leaves no time for an evaluation-only round before the deadline either:
    the deadline binds too, so it is the deadline's stop, after which the controller evaluates the
    newest model if the budget pays that round's worst case (`_final_stop`), as after every
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


def _last_look(x: _Choice, reason: str) -> Decision | None:
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


def _hard_guards(x: _Choice, base: np.ndarray) -> np.ndarray | Decision:
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
                return _infeasible(x.job, x.history, x.cand, x.ev, base)
            return x.final_stop(
                f"deadline: {fmt_s(max(t_left, 0.0))} left, the shortest round ({x.describe(i)}) "
                f"takes ~{fmt_s(float(f.round_s[i]))}",
                "deadline",
                "deadline",
                predicted_round_s=float(f.round_s[i]),
            )
        guard = timely
    return guard


def _seen_in_time(x: _Choice) -> np.ndarray:
    """The plans whose round can still be evaluated before the deadline: a round's metric is of
    the model it started from, so what a round trains shows only in the next round's record, at
    the latest the final evaluation after the deadline's stop. A round that leaves no time for
    that evaluation ends the run late (or was trained for nothing)."""
    c, f = x.job.constraints, x.f
    assert c.deadline_seconds is not None
    return x.history.elapsed_s + f.round_s + f.eval_round_s + P.FINALIZE_S <= c.deadline_seconds


def _median_plan(x: _Choice, guard: np.ndarray, finite: np.ndarray, safe) -> np.ndarray:
    ev = x.ev
    return guard & ev.ok_rounds[0.5] & ev.ok_deadline[0.5] & ev.ok_budget[cfg().budget_q] & finite & safe


def _fast_plan(x: _Choice, guard: np.ndarray, safe: np.ndarray) -> np.ndarray:
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


def _levels(x: _Choice, guard: np.ndarray, reachable: bool) -> list[tuple[np.ndarray, float, int | None]]:
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


def stalled(job: Job, history: RunHistory, val_rows: int, window: int | None = None) -> bool:
    """The run's own evidence that it stopped improving: over the last `window` validation points
    the best metric rose no more than the split's noise above the best before them. The
    model's P(out of reach) alone is not enough: its curve family saturates too early on real curves."""
    window = cfg().stall_rounds if window is None else window
    metric = job.training.target_metric
    ys = [float(v) for r in history.rounds if (v := getattr(r, metric)) is not None]
    if len(ys) <= window:
        return False
    sign = -1.0 if lower_is_better(metric) else 1.0
    before, recent = ys[:-window], ys[-window:]
    return _no_rise(metric, sign, max(sign * y for y in before), max(sign * y for y in recent), val_rows)


def _no_rise(metric: str, sign: float, best_before: float, best_recent: float, val_rows: int) -> bool:
    """The recent best (signed: higher is better) is within the split's noise of the best before."""
    return best_recent - best_before <= cfg().stall_z * math.sqrt(2.0) * _metric_sd(
        metric, sign * best_before, val_rows
    )


def _metric_sd(metric: str, value: float, val_rows: int) -> float:
    """The sd of one validation measurement of `metric` at `value` on `val_rows` rows."""
    if metric == "val_accuracy":
        return math.sqrt(max(value * (1.0 - value), 1e-4) / max(val_rows, 1))
    return 0.01 * max(abs(value), 1e-3)


def _hopeful_midrun(x: _Choice) -> np.ndarray:
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


def _nothing_fits(
    x: _Choice, base: np.ndarray, guard: np.ndarray, reachable: bool
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
        d = _infeasible(x.job, x.history, x.cand, ev, base)
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


@dataclass
class _Pick:
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


def _fewest_workers(x: _Choice, p: _Pick) -> _Pick:
    """The plans on the fewest workers allowed, when any of them is in the chosen set: what n > 1
    buys rests on the averaging prior (beta), which a run hardly measures, and its n-fold bill is
    certain; so more workers only when no plan on the fewest meets the constraints at the level
    chosen (on the recorded ResNet-18 / transformer curves n > 1 learns far less per sample)."""
    fewest = p.chosen & (x.cand.n <= max(1, x.job.workers.min))
    if fewest.any():
        p.chosen = fewest
    return p


def _objective(x: _Choice, p: _Pick) -> np.ndarray:
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


def _pick(x: _Choice, p: _Pick, guard: np.ndarray) -> _Pick:
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


def _short_round_probe(x: _Choice, p: _Pick, guard: np.ndarray) -> _Pick:
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


def _cheap_then_fast(x: _Choice, p: _Pick, obj: np.ndarray) -> int:
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


def _fast_best_effort(x: _Choice, p: _Pick, obj: np.ndarray, i: int) -> int:
    """Best effort for the speed objective: of the plans that buy within time_for_cost of the most
    progress the money left can buy (`obj` is minus that progress), the one that buys it fastest.
    The most progress alone is the cheapest progress: a budget-bound speed run went to 1,024 MB
    rounds of ~48 s where 1,769 MB ran them in ~31 s for 7 % more a round."""
    near = p.chosen & (obj <= obj[i] * (1.0 - cfg().time_for_cost))
    dtau = x.pm.mean_round_progress(x.cand.n, x.cand.k)
    pace = x.f.round_s_warm / np.maximum(dtau, 1e-12)  # seconds per unit of progress
    return int(np.argmin(np.where(near, pace, np.inf)))


def _binding(x: _Choice, guard: np.ndarray, p: _Pick) -> tuple[str, float, int]:
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


def _limits_text(x: _Choice) -> str | None:
    c = x.job.constraints
    lim = []
    if c.deadline_seconds is not None:
        lim.append(f"{fmt_s(max(c.deadline_seconds - x.history.elapsed_s, 0))} left")
    if c.budget_usd is not None:
        lim.append(f"{fmt_usd(x.budget - x.spent)} left")
    return " and ".join(lim) if lim else None


def _why(x: _Choice, p: _Pick, bound: str, qb: float, i_free: int) -> list[str]:
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


def _notes(x: _Choice, p: _Pick) -> list[Note]:
    """What shaped the plan besides its rule (the pieces of `_why` that say so)."""
    notes: list[Note] = []
    if x.cand.averaging_stalled:
        notes.append("averaging_stalled")
    elif x.cand.speed_one_worker:
        notes.append("speed_one_worker")
    if p.probe:
        notes.append("short_round")
    return notes


def _train(x: _Choice, guard: np.ndarray, p: _Pick) -> Decision:
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


def decide_adaptive(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    arch: str,
    sizes: FunctionSizes | None = None,
    hold: Hold | None = None,
) -> Decision:
    tr = job.training
    tm = fitted_timing(job, history, prices, arch, sizes)
    shape = tm.shape
    done = _terminal(job, history, tm, prices, arch)
    if done:
        return done
    pm = _progress_model(job, history, shape)
    assert pm.forecast is not None, "ProgressModel.fit sets the forecast"
    if tr.target_value is None and pm.forecast.p_done > 0.5 and history.rounds:
        return _final_stop(
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
    x = _Choice(job, history, tm, pm, prices, arch, cand, _evaluate(job, history, cand, tm, pm, prices, arch))
    base = x.ev.valid.copy()
    # hard guards: the next round must be affordable in the worst case, and finish before the deadline
    guard = _hard_guards(x, base & cand.reach & round_length_hedge(x))
    if isinstance(guard, Decision):
        return guard
    reachable = float(np.max(x.ev.R["p_never"])) < cfg().p_never_give_up
    first_fit = next(((ok, q, j) for ok, q, j in _levels(x, guard, reachable) if ok.any()), None)
    if first_fit is not None:
        chosen, level, backup = first_fit
        p = _Pick(chosen, level, backup, job.constraints.objective, "")
    else:
        fallback = _nothing_fits(x, base, guard, reachable)
        if isinstance(fallback, Decision):
            return fallback
        chosen, level, objective, note = fallback
        p = _Pick(chosen, level, None, objective, note)
    return _train(x, guard, _pick(x, _fewest_workers(x, p), guard))


def decide(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str = "x86_64",
    sizes: FunctionSizes | None = None,
    *,
    hold: Hold | None = None,
    config: PlannerConfig | None = None,
) -> Decision:
    """Plan the next round of `job` from its `history`: train (n, m, k) or stop, with a reason.
    `sizes`: the deployed planner/aggregator memory and worker timeout (a function's Settings;
    None reads them from the environment, or cdk.json without one). `hold`: dimensions held
    fixed (ablations; the adaptive planner only). `config`: the decision rule's constants (None:
    the active ones, `config.active`; the deployed defaults unless a caller set a variant)."""
    with using(config):
        return _decide(job, history, tiers, prices, architecture, sizes, hold)


def _decide(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str,
    sizes: FunctionSizes | None,
    hold: Hold | None,
) -> Decision:
    if not tiers:
        tiers = [job.workers.memory_mb or 2048]
    sizes = sizes or FunctionSizes()
    if job.workers.planner == "fixed":
        return decide_fixed(job, history, list(tiers), prices, architecture, sizes)
    decision = decide_adaptive(job, history, list(tiers), prices, architecture, sizes, hold)
    planned_on = planning_history(history)
    if planned_on is history or decision.action == "stop":
        return decision
    return decide_adaptive(job, planned_on, list(tiers), prices, architecture, sizes, hold)


def planning_history(history: RunHistory) -> RunHistory:
    """The history a training round is planned on. Before round 0 a built-in model's computed
    footprint decides admission only (`decide`'s refusal); round 0 itself is planned as the probe of
    an unmeasured model, long and cut by its limit where the model is slow (the limit, not the model,
    bounds its bill): planned on the footprint it was timid (benchmark, seeds 0-2: the ResNet-18 and
    transformer deadline jobs met 17 of 36 instead of 29)."""
    if history.rounds or (history.flops_per_sample is None and not history.param_count):
        return history
    return history.model_copy(update={"flops_per_sample": None, "param_count": 0})
