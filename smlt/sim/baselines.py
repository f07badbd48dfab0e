"""Baselines for the planner benchmark: the oracle, SMLT's scheduler, and smlt's planner ablated.

- `oracle`: the best fixed (n, m, k) with hindsight, in the scenario's own world: every plan's
  expected time and cost (`analytic.expected`, the world's truth) ranks the grid, the most
  promising are simulated with the scenario's seed and world, and the cheapest (for
  `objective: speed`, the fastest) that reached the target within the deadline and budget wins.
- `oracle(..., guard=True)`: the same search, each plan run under smlt's own budget guard
  (`GuardedStatic`): it stops before a round whose worst case does not fit in the money left, as
  smlt's planner does. The best that keeping the budget promise leaves possible with hindsight.
- `SmltBO`: SMLT's scheduler (Ali et al., SC'22) as the paper describes it: Bayesian optimisation
  over the number of workers only, a Gaussian process (scikit-learn's GaussianProcessRegressor)
  with UCB (kappa 5), re-run after every epoch. It is given what a fair user would give it: the
  smallest deployed memory tier that fits the model, the job's local steps, and the job's
  deadline and budget as limits: it stops before a round that would pass either (judged on the
  last round's measured time and cost, with the finalisation's cost kept in hand).
- `static_plan` / `workers_only`: smlt's planner with its round-0 plan held for the whole run, and
  restricted to choosing the number of workers (the smallest fitting tier, the job's local steps).
  The planner's own hooks (`smlt.sim.ablations`) are used when this checkout has them; until
  then thin wrappers around `decide` hold the plan's dimensions.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from smlt.runtime import bill
from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner import decide
from smlt.runtime.planner.core import fixed_plan_guard
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices
from smlt.sim.analytic import expected, grid
from smlt.sim.run import Planner, SimResult, simulate
from smlt.sim.workloads import Workload
from smlt.sim.world import World

UCB_KAPPA = 5.0


class Static:
    """Train (n, m, k) until the target (the aggregator stops the run) or a hindsight cap."""

    def __init__(self, n: int, m: int, k: int, time_cap: float = math.inf, cost_cap: float = math.inf):
        self.n, self.m, self.k = n, m, k
        self.time_cap, self.cost_cap = time_cap, cost_cap

    def __call__(self, job: Job, h: RunHistory, tiers, prices, arch) -> Decision:
        if len(h.rounds) >= job.training.max_rounds:
            return Decision(action="stop", reason="max_rounds", bound="max_rounds")
        if h.elapsed_s > self.time_cap or h.cost_total_usd > self.cost_cap:
            return Decision(action="stop", reason="hindsight cap", bound="budget")
        return Decision(
            action="train",
            workers=self.n,
            memory_mb=self.m,
            local_steps=self.k,
            reason=f"static {self.n} x {self.m} MB x {self.k}",
        )


class GuardedStatic(Static):
    """A fixed plan under smlt's budget guard (`core.budget_guard`, the fixed planner's rule): it
    stops before a round whose worst case plus finalisation's does not fit in the money left, and
    gives its workers the limit that worst case assumes."""

    def __call__(self, job: Job, h: RunHistory, tiers, prices, arch) -> Decision:
        d = super().__call__(job, h, tiers, prices, arch)
        if d.action != "train" or job.constraints.budget_usd is None:
            return d
        fits, limit_s = fixed_plan_guard(job, h, self.n, self.m, self.k, prices, arch)
        if not fits:
            return Decision(action="stop", reason="budget: the next round's worst case does not fit", bound="budget")
        return d.model_copy(update={"worker_time_limit_s": round(limit_s, 1)})


def oracle(
    job: Job,
    workload: Workload,
    tiers: list[int],
    prices: Prices,
    seed: int,
    world: World,
    batch: int = 6,
    max_tries: int = 12,
    guard: bool = False,
):
    """Best fixed plan with hindsight in `world`: ((n, m, k), SimResult) or (None, None). With
    `guard`, each plan runs under smlt's budget guard (`GuardedStatic`)."""
    c = job.constraints
    D = c.deadline_seconds or math.inf
    B = c.budget_usd or math.inf
    N, M, K = grid(workload, tiers, job.workers.max, job.workers.min)
    T, C, R, valid = expected(workload, world, N, M, K, prices, target=job.training.target_value)
    ok = valid & (R <= job.training.max_rounds)
    key = T if c.objective == "speed" else C
    plausible = ok & (T <= D * 1.2) & (C <= B * 1.2)
    order = [int(i) for i in np.argsort(np.where(plausible, key, np.inf)) if plausible[i]][:max_tries]
    for start in range(0, len(order), batch):
        best = None
        for i in order[start : start + batch]:
            static = (GuardedStatic if guard else Static)(
                int(N[i]), int(M[i]), int(K[i]), time_cap=min(1.2 * D, 1e7), cost_cap=min(1.2 * B, 1e6)
            )
            r = simulate(job, workload, static, tiers, prices, seed=seed, world=world)
            if r.reached and r.elapsed_s <= D and r.cost_usd <= B:
                score = r.elapsed_s if c.objective == "speed" else r.cost_usd
                if best is None or score < best[0]:
                    best = (score, (int(N[i]), int(M[i]), int(K[i])), r)
        if best is not None:
            return best[1], best[2]
    return None, None


class SmltBO:
    """SMLT-style scheduler: GP-UCB (kappa 5) over the number of workers, re-run every epoch,
    at a fixed memory tier, stopping at the job's deadline and budget."""

    def __init__(
        self, total_samples: float, memory_mb: int, kappa: float = UCB_KAPPA, sizes: FunctionSizes | None = None
    ):
        self.total_samples = total_samples
        self.memory_mb = memory_mb
        self.kappa = kappa
        self.sizes = sizes or FunctionSizes()

    def ucb(self, ns: np.ndarray, utility: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """The GP's upper confidence bound of the utility over the candidate worker counts (log2 n)."""
        kernel = ConstantKernel(1.0, "fixed") * RBF(length_scale=1.5, length_scale_bounds=(0.3, 10.0)) + WhiteKernel(
            0.05, (1e-4, 1.0)
        )
        gp = GaussianProcessRegressor(kernel=kernel, normalize_y=len(ns) > 1, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(np.log2(ns)[:, None], utility)
        mu, sd = gp.predict(np.log2(cand)[:, None], return_std=True)
        return mu + self.kappa * sd

    def _limits(self, job: Job, h: RunHistory, n: int, prices: Prices, arch: str) -> Decision | None:
        """SMLT's users' limits: no round that would pass the deadline or the budget, judged on the
        last round's measured seconds and its cost per worker (round 0 has nothing to judge by)."""
        c = job.constraints
        if not h.rounds:
            return None
        last = h.rounds[-1]
        next_cost = 1.5 * last.cost_usd * max(1.0, n / max(last.workers, 1))
        fin = float(bill.finalize_usd(prices, arch, self.sizes.planner_memory_mb, 2.0, margin=2.0))
        if c.budget_usd is not None and h.cost_total_usd + next_cost + fin > c.budget_usd:
            return Decision(action="stop", reason="SMLT: the budget would be passed", bound="budget")
        if c.deadline_seconds is not None and h.elapsed_s + last.round_s > c.deadline_seconds:
            return Decision(action="stop", reason="SMLT: the deadline would be passed", bound="deadline")
        return None

    def __call__(self, job: Job, h: RunHistory, tiers: list[int], prices: Prices, arch: str) -> Decision:
        if len(h.rounds) >= job.training.max_rounds:
            return Decision(action="stop", reason="max_rounds", bound="max_rounds")
        n, why = self._workers(job, h)
        stop = self._limits(job, h, n, prices, arch)
        if stop is not None:
            return stop
        return Decision(
            action="train", workers=n, memory_mb=self.memory_mb, local_steps=job.training.local_steps, reason=why
        )

    def _workers(self, job: Job, h: RunHistory) -> tuple[int, str]:
        """The next round's worker count: the initial one, the same within an epoch, else GP-UCB's."""
        if not h.rounds:
            return job.workers.initial, "SMLT: initial"
        rows = max(h.train_rows, 1)
        done = sum(t.samples for r in h.rounds for t in r.timings if t.error is None)
        before = done - sum(t.samples for t in h.rounds[-1].timings if t.error is None)
        if int(done // rows) == int(before // rows):  # not an epoch boundary: keep n
            return h.rounds[-1].workers, "SMLT: same epoch"
        ns, us = self._observations(job, h, done)
        lo, hi = job.workers.min, job.workers.max
        cand = np.unique(np.round(np.geomspace(lo, hi, 24)).astype(int))
        n = int(cand[int(np.argmax(self.ucb(ns, us, cand.astype(float))))])
        return n, f"SMLT: GP-UCB over workers (kappa {self.kappa:g}) -> {n}"

    def _observations(self, job: Job, h: RunHistory, done: float) -> tuple[np.ndarray, np.ndarray]:
        """Per worker count tried: the utility of finishing at its measured time and cost per sample."""
        c = job.constraints
        per: dict[int, list[float]] = {}
        for r in h.rounds:
            s = sum(t.samples for t in r.timings if t.error is None)
            t = per.setdefault(r.workers, [0.0, 0.0, 0.0])
            t[0], t[1], t[2] = t[0] + r.round_s, t[1] + r.cost_usd, t[2] + s
        remaining = max(self.total_samples - done, h.train_rows)
        t_left = (c.deadline_seconds - h.elapsed_s) if c.deadline_seconds else math.inf
        b_left = (c.budget_usd - h.cost_total_usd) if c.budget_usd else math.inf
        ns, us = [], []
        for n, (ts, cs, ss) in per.items():
            if ss <= 0:
                continue
            t_rem, c_rem = ts / ss * remaining, cs / ss * remaining
            late = 10 * max(0.0, t_rem / t_left - 1) if math.isfinite(t_left) else 0.0
            over = 10 * max(0.0, c_rem / b_left - 1) if math.isfinite(b_left) else 0.0
            if c.objective == "speed":
                u = -t_rem / (t_left if math.isfinite(t_left) else t_rem) - over
            else:
                u = -c_rem / (b_left if math.isfinite(b_left) else c_rem) - late
            ns.append(n)
            us.append(u)
        if not ns:
            ns, us = [h.rounds[-1].workers], [-1.0]
        return np.array(ns, float), np.array(us)


def smlt_total_samples(job: Job, workload: Workload, world: World) -> float:
    """What the user tells SMLT (its training length): with hindsight, the samples the initial
    configuration needs to reach the target."""
    n, k = job.workers.initial, job.training.local_steps
    s = workload.curves.samples_to(job.training.target_value or workload.target, n, k) * world.curve_scale
    return s if math.isfinite(s) else 50.0 * workload.train_rows


def run_smlt(job: Job, workload: Workload, tiers: list[int], prices: Prices, seed: int, world: World) -> SimResult:
    bo = SmltBO(smlt_total_samples(job, workload, world), workload.smallest_tier(tiers))
    return simulate(job, workload, bo, tiers, prices, seed=seed, world=world)


# ----------------------------------------------------------------------------- ablations
def _static_plan(job: Job, history: RunHistory, tiers: list[int], prices: Prices, arch: str = "x86_64") -> Decision:
    """`decide` at round 0, then that round's (n, m, k) for every round it trains."""
    d = decide(job, history, tiers, prices, arch)
    first = next((r for r in history.rounds if r.local_steps > 0), None)
    if d.action != "train" or first is None:
        return d
    return d.model_copy(
        update=dict(
            workers=first.workers,
            memory_mb=first.memory_mb,
            local_steps=first.local_steps,
            reason=f"static: round 0's plan held ({d.reason})",
        )
    )


def _workers_only(job: Job, history: RunHistory, tiers: list[int], prices: Prices, arch: str = "x86_64") -> Decision:
    """`decide` over the number of workers at the smallest tier it deems to fit, the job's steps."""
    from smlt.runtime.planner.core import _tiers_usable  # the planner's own rule for the tiers that fit

    tier = _tiers_usable(job, history, list(tiers))[0]
    d = decide(job, history, [tier], prices, arch)
    if d.action != "train":
        return d
    return d.model_copy(update=dict(local_steps=job.training.local_steps))


_LOCAL: dict[str, Planner] = {"static_plan": _static_plan, "workers_only": _workers_only}


def ablation(name: str) -> Planner:
    """The planner's hook `name` from smlt.sim.ablations if present, else the wrapper here."""
    try:
        hook: Callable = getattr(importlib.import_module("smlt.sim.ablations"), name)
    except (ImportError, AttributeError):
        return _LOCAL[name]
    return hook
