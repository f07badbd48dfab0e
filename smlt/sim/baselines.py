"""Baselines for the planner benchmark: the oracle, SMLT's scheduler, and a fixed default.

- `oracle`: the best static (n, m, k) chosen with hindsight. Every static configuration's
  expected time and cost comes from the ground truth (`analytic.expected`); the most promising
  are then simulated with the scenario's seed and the cheapest (or, for `objective: speed`, the
  fastest) one that really reached the target within the deadline and budget wins.
- `SmltBO`: SMLT's scheduler (Ali et al., SC'22): Bayesian optimisation with a Gaussian
  process and UCB (kappa = 5) over the number of workers only, re-run after every epoch; the
  memory tier and the work per round stay fixed. SMLT takes the training length from the user
  in epochs; here it gets, with hindsight, the samples the initial configuration needs to reach
  the target. Like SMLT it enforces neither the budget nor the deadline while it runs (it trains
  until the target or max_rounds; the benchmark then checks both) and has no straggler limit.
- the fixed default is `smlt.planner.decide` with `workers.planner = "fixed"`.
"""

from __future__ import annotations

import math

import numpy as np

from smlt.job import Job
from smlt.planner.core import default_tier
from smlt.planner.types import Decision, RunHistory
from smlt.prices import Prices
from smlt.sim.analytic import expected, grid
from smlt.sim.run import SimResult, simulate
from smlt.sim.workloads import Workload

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


def oracle(
    job: Job, workload: Workload, tiers: list[int], prices: Prices, seed: int, batch: int = 8, max_tries: int = 32
):
    """Best static configuration with hindsight: ((n, m, k), SimResult) or (None, None)."""
    c = job.constraints
    D = c.deadline_seconds or math.inf
    B = c.budget_usd or math.inf
    N, M, K = grid(workload, tiers, job.workers.max, job.workers.min)
    T, C, R, valid = expected(workload, N, M, K, prices, target=job.training.target_value)
    ok = valid & (R <= job.training.max_rounds)
    key = T if c.objective == "speed" else C
    plausible = ok & (T <= D * 1.15) & (C <= B * 1.15)
    order = [int(i) for i in np.argsort(np.where(plausible, key, np.inf)) if plausible[i]][:max_tries]
    for start in range(0, len(order), batch):
        best = None
        for i in order[start : start + batch]:
            static = Static(int(N[i]), int(M[i]), int(K[i]), time_cap=min(2 * D, 1e7), cost_cap=min(2 * B, 1e6))
            r = simulate(job, workload, static, tiers, prices, seed=seed)
            if r.reached and r.elapsed_s <= D and r.cost_usd <= B:
                score = r.elapsed_s if c.objective == "speed" else r.cost_usd
                if best is None or score < best[0]:
                    best = (score, (int(N[i]), int(M[i]), int(K[i])), r)
        if best is not None:
            return best[1], best[2]
    return None, None


class SmltBO:
    """SMLT-style scheduler: GP-UCB (kappa 5) over the number of workers, re-run every epoch."""

    def __init__(self, total_samples: float, kappa: float = UCB_KAPPA, length_scale: float = 0.25, noise: float = 0.05):
        self.total_samples = total_samples
        self.kappa = kappa
        self.ls = length_scale
        self.noise = noise
        self._seen, self._done = 0, 0
        self._per: dict = {}

    def _gp_ucb(self, xs: np.ndarray, ys: np.ndarray, grid_x: np.ndarray) -> np.ndarray:
        mu_y, sd_y = ys.mean(), ys.std() if len(ys) > 1 and ys.std() > 0 else 1.0
        y = (ys - mu_y) / sd_y
        k = lambda a, b: np.exp(-0.5 * ((a[:, None] - b[None, :]) / self.ls) ** 2)  # noqa: E731
        Kxx = k(xs, xs) + self.noise * np.eye(len(xs))
        Ks = k(grid_x, xs)
        L = np.linalg.cholesky(Kxx)
        alpha = np.linalg.solve(L.T, np.linalg.solve(L, y))
        mu = Ks @ alpha
        v = np.linalg.solve(L, Ks.T)
        var = np.maximum(1.0 - (v**2).sum(0), 1e-12)
        return mu + self.kappa * np.sqrt(var)

    def __call__(self, job: Job, h: RunHistory, tiers: list[int], prices: Prices, arch: str) -> Decision:
        c = job.constraints
        m = job.workers.memory_mb or default_tier(tiers)
        k = job.training.local_steps
        b = job.training.batch_size
        if len(h.rounds) >= job.training.max_rounds:
            return Decision(action="stop", reason="max_rounds", bound="max_rounds")
        rows = max(h.train_rows, 1)
        # running totals over the history (one run per instance; recomputed if history shrank)
        if len(h.rounds) < self._seen:
            self._seen, self._done, self._per = 0, 0, {}
        for r in h.rounds[self._seen :]:
            s = max(r.workers * r.local_steps * b, 1)
            t = self._per.setdefault(r.workers, [0.0, 0.0, 0.0])
            t[0] += r.round_s
            t[1] += r.cost_usd
            t[2] += s
            self._done += r.workers * r.local_steps * b
        self._seen = len(h.rounds)
        done = self._done
        if h.rounds:
            before = done - h.rounds[-1].workers * h.rounds[-1].local_steps * b
            if int(done // rows) == int(before // rows):  # not an epoch boundary: keep n
                r = h.rounds[-1]
                return Decision(
                    action="train", workers=r.workers, memory_mb=m, local_steps=k, reason="SMLT: same epoch"
                )
        if not h.rounds:
            n = job.workers.initial
            return Decision(action="train", workers=n, memory_mb=m, local_steps=k, reason="SMLT: initial")
        # observations: per distinct n, seconds and dollars per sample
        per = self._per
        remaining = max(self.total_samples - done, rows)
        t_left = (c.deadline_seconds - h.elapsed_s) if c.deadline_seconds else math.inf
        b_left = (c.budget_usd - h.cost_total_usd) if c.budget_usd else math.inf
        ns, us = [], []
        for n, (ts, cs, ss) in per.items():
            t_rem, c_rem = ts / ss * remaining, cs / ss * remaining
            if c.objective == "speed":
                u = -t_rem / max(t_left if math.isfinite(t_left) else t_rem, 1e-9) - 10 * max(0.0, c_rem / b_left - 1)
            else:
                ref = b_left if math.isfinite(b_left) else c_rem
                u = -c_rem / max(ref, 1e-12) - (10 * max(0.0, t_rem / t_left - 1) if math.isfinite(t_left) else 0)
            ns.append(n)
            us.append(u)
        lo, hi = job.workers.min, job.workers.max
        cand = np.arange(lo, hi + 1)
        scale = max(math.log2(hi), 1.0)
        ucb = self._gp_ucb(np.log2(np.array(ns, float)) / scale, np.array(us), np.log2(cand) / scale)
        n = int(cand[int(np.argmax(ucb))])
        return Decision(
            action="train",
            workers=n,
            memory_mb=m,
            local_steps=k,
            reason=f"SMLT: GP-UCB over workers (kappa {self.kappa}) -> {n}",
        )


def smlt_total_samples(job: Job, workload: Workload, tiers: list[int], prices: Prices) -> float:
    """What the user would tell SMLT: the samples the initial configuration needs (hindsight)."""
    n, k = job.workers.initial, job.training.local_steps
    m = job.workers.memory_mb or default_tier(tiers)
    _, _, R, _ = expected(workload, [n], [m], [k], prices, target=job.training.target_value)
    return float((R[0] - 1) * n * k * job.training.batch_size)


def run_smlt(job: Job, workload: Workload, tiers: list[int], prices: Prices, seed: int) -> SimResult:
    return simulate(job, workload, SmltBO(smlt_total_samples(job, workload, tiers, prices)), tiers, prices, seed=seed)
