"""Baselines for the planner benchmark: the oracle and smlt's planner ablated (the users'
baselines, SMLT's scheduler and a fixed plan from a profile, are smlt.sim.schedulers).

- `oracle`: the best fixed (n, m, k) with hindsight, in the scenario's own world: every plan's
  expected time and cost (`analytic.expected`, the world's truth) ranks the grid, the most
  promising are simulated with the scenario's seed and world, and the cheapest (for
  `objective: speed`, the fastest) that reached the target within the deadline and budget wins.
- `oracle(..., guard=True)`: the same search, each plan run under smlt's own budget guard
  (`GuardedStatic`): it stops before a round whose worst case does not fit in the money left, as
  smlt's planner does. The best that keeping the budget promise leaves possible with hindsight.
- `ablation(name)`: smlt's planner with its round-0 plan held for the whole run (`static_plan`), or
  restricted to choosing the number of workers (`workers_only`: the smallest fitting tier, the
  job's local steps); both in `smlt.sim.ablations`.
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner import Policy
from smlt.runtime.planner.fixed import fixed_plan_guard
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices
from smlt.sim import ablations
from smlt.sim.analytic import expected, grid
from smlt.sim.run import simulate
from smlt.sim.workloads import Workload
from smlt.sim.world import World


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
    """A fixed plan under smlt's budget guard (`guards.budget_guard`, the fixed planner's rule): it
    stops before a round whose worst case plus finalisation's does not fit in the money left, and
    gives its workers the limit that worst case assumes."""

    def __init__(
        self,
        n: int,
        m: int,
        k: int,
        time_cap: float = math.inf,
        cost_cap: float = math.inf,
        sizes: FunctionSizes | None = None,
    ):
        super().__init__(n, m, k, time_cap, cost_cap)
        self.sizes = sizes  # the deployed sizes the guard prices with (None: `FunctionSizes()`)

    def __call__(self, job: Job, h: RunHistory, tiers, prices, arch) -> Decision:
        d = super().__call__(job, h, tiers, prices, arch)
        if d.action != "train" or job.constraints.budget_usd is None:
            return d
        fits, limit_s = fixed_plan_guard(job, h, self.n, self.m, self.k, prices, arch, self.sizes)
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
    sizes: FunctionSizes | None = None,
):
    """Best fixed plan with hindsight in `world`: ((n, m, k), SimResult) or (None, None). With
    `guard`, each plan runs under smlt's budget guard (`GuardedStatic`). `sizes`: the deployed
    functions' sizes (None: `FunctionSizes()`)."""
    sizes = sizes or FunctionSizes()
    c = job.constraints
    D = c.deadline_seconds or math.inf
    B = c.budget_usd or math.inf
    N, M, K, T, C, R, valid = _expected(job, workload, tiers, prices, world, sizes)
    ok = valid & (R <= job.training.max_rounds)
    key = T if c.objective == "speed" else C
    plausible = ok & (T <= D * 1.2) & (C <= B * 1.2)
    order = [int(i) for i in np.argsort(np.where(plausible, key, np.inf)) if plausible[i]][:max_tries]
    for start in range(0, len(order), batch):
        best = None
        for i in order[start : start + batch]:
            n, m, k = int(N[i]), int(M[i]), int(K[i])
            caps = _caps(D, B, None if best is None else best[0], c.objective == "speed")
            static = GuardedStatic(n, m, k, *caps, sizes=sizes) if guard else Static(n, m, k, *caps)
            r = simulate(job, workload, static, tiers, prices, seed=seed, world=world, sizes=sizes)
            if r.reached and r.elapsed_s <= D and r.cost_usd <= B:
                score = r.elapsed_s if c.objective == "speed" else r.cost_usd
                if best is None or score < best[0]:
                    best = (score, (n, m, k), r)
        if best is not None:
            return best[1], best[2]
    return None, None


# The last search's inputs and every plan's expected time and cost (`_expected`).
_EXPECTED: list = []


def _expected(job: Job, workload: Workload, tiers: list[int], prices: Prices, world: World, sizes: FunctionSizes):
    """Every plan of the grid and its expected time, cost and rounds in `world`: computed once for
    the oracle and the guarded oracle of a case (the same inputs: the same workload, the others equal)."""
    key = (workload, job, list(tiers), prices, world, sizes)
    if _EXPECTED and _EXPECTED[0][0] is workload and _EXPECTED[0][1:] == key[1:]:
        return _EXPECTED[1]
    N, M, K = grid(workload, tiers, job.workers.max, job.workers.min)
    T, C, R, valid = expected(workload, world, N, M, K, prices, target=job.training.target_value, sizes=sizes)
    _EXPECTED[:] = [key, (N, M, K, T, C, R, valid)]
    return _EXPECTED[1]


def _caps(D: float, B: float, best: float | None, speed: bool) -> tuple[float, float]:
    """A tried plan's hindsight caps (`Static`): it stops once it can no longer win, i.e. past the
    deadline, the budget or the best score of its batch so far (seconds for `objective: speed`,
    else dollars). A run's time and cost only grow, and a plan wins only strictly below the best,
    so a stopped run is one that would have lost; the winner runs exactly as uncapped."""
    time_cap, cost_cap = min(D, 1e7), min(B, 1e6)
    if best is not None:
        time_cap, cost_cap = (min(time_cap, best), cost_cap) if speed else (time_cap, min(cost_cap, best))
    return time_cap, cost_cap


# ----------------------------------------------------------------------------- ablations
def ablation(name: str) -> Policy:
    """The planner with parts of its choice held (smlt.sim.ablations): `static_plan` or `workers_only`."""
    return getattr(ablations, name)
