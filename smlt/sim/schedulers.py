"""The benchmark's two users' baselines: what a competent user of another system would run, given
the job's deadline and budget and nothing but what the rounds show (no curve, no noise, no
platform constant of the simulated world).

- `SmltBO`: SMLT's scheduler (Ali et al., SC'22) as a competent user runs it: a short profile
  (one worker's long round, then the job's local steps on 4, 1 and 16 workers), then Bayesian
  optimisation over (workers, local steps) on a log grid (GP-UCB on scikit-learn's
  GaussianProcessRegressor, re-run every epoch, its choice held within the epoch) at the
  smallest memory tier that fits the model, its candidates up to `TRUST_X` times the most
  workers measured. It keeps to the settings whose estimated time fits in `DEADLINE_SHARE` of the
  time left (the pace is noisy) and, among them, takes the lowest confidence bound of the cost
  (`objective: speed`: of the time, among those within the budget).
- `ProfiledFixed`: the best single fixed plan a user would pick from a quick profile, without
  hindsight: one round at each of a few (workers, tier, local steps) settings (one worker's long
  rounds first), then the one whose measured throughput meets the deadline (in `DEADLINE_SHARE`
  of the time left) at the lowest cost by its own estimate, held to the end.

Both judge the remaining work alike (`Observed.remaining_samples`: the recent pace of the target
metric per sample trained, a straight line through the last rounds' measurements), profile only within `PROFILE_SHARE` of the deadline
and of the budget and while the deadline leaves room (`Observed.time_to_profile`: a user with a
20-s deadline profiles one or two settings, not four), cap round 0's workers at `FIRST_ROUND_S`
and `FIRST_ROUND_SHARE` of the deadline, and stop alike (`Observed.stop`): before a round whose
cost (an untried setting's new workers priced at the coldest worker seen, a straggler's 5x
included) plus the finalisation's would pass the budget, or whose estimated time would pass the
deadline. A round the limits refuse is shrunk first (`fit`: fewer workers, then fewer local
steps, for the budget; fewer steps for the deadline); they stop when even the smallest is refused.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor

from smlt.runtime import bill
from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import MAX_ROUND_SAMPLES, Job
from smlt.runtime.planner.types import Decision, RoundRecord, RunHistory, WorkerTiming
from smlt.runtime.prices import Prices
from smlt.sim.kernels import RBF, ConstantKernel, DotProduct, WhiteKernel  # sklearn's, quicker to fit
from smlt.sim.run import SimResult, simulate
from smlt.sim.workloads import Workload
from smlt.sim.world import World

UCB_BETA = 0.3  # the confidence bound's width in GP standard deviations (tuning seeds: 0.3 met more deadlines than 1.0)
PACE_ROUNDS = 6  # the rounds whose measurements give the pace
SAMPLES_MARGIN = 1.3  # the remaining samples a user plans for: its fit's estimate x this
OVERRUN = 5.0  # a straggler's handler may take this many times the usual (a user's worst case)
FIRST_ROUND_S = 10.0  # the first round's compute limit per worker (what a user risks on an unknown model)
FINALIZE_S = 5.0  # seconds kept for the finalisation when judging the deadline
K_GRID = (5, 10, 20, 50, 100, 200, 500)  # local steps a user considers (with the job's own)
LONG_ROUND_X = 25  # the profile's long round: this many times the job's local steps (within K_GRID's range)
COLD_MARGIN = 1.5  # an untried setting's workers priced at the coldest worker seen, its seconds x this
FIRST_ROUND_SHARE = 0.3  # round 0's compute limit is also no more than this share of the deadline
PROFILE_SHARE = 0.3  # a user profiles only within this share of the deadline and of the budget
TRUST_X = 2  # GP-UCB's candidates: up to this many times the most workers measured
DEADLINE_SHARE = 0.8  # a chosen setting's estimated time fits in this share of the time left

Config = tuple[int, int, int]  # (workers, memory MB, local steps)


def _ok(r: RoundRecord) -> float:
    return float(sum(t.samples for t in r.timings if t.error is None))


def _warm_s(r: RoundRecord) -> float:
    """The round's seconds without its cold starts (the logs show each worker's init)."""
    return max(r.round_s - max((t.init_s for t in r.timings if t.cold), default=0.0), 1e-3)


def _cfg(r: RoundRecord) -> Config:
    return (r.workers, r.memory_mb, r.local_steps)


def _cap(job: Job, h: RunHistory) -> float | None:
    """The first round's workers stop at `FIRST_ROUND_S`, and at `FIRST_ROUND_SHARE` of the
    deadline (a long round of an unknown model costs at most that); later rounds run their steps
    to the end."""
    if h.rounds:
        return None
    d = job.constraints.deadline_seconds
    return FIRST_ROUND_S if d is None else min(FIRST_ROUND_S, FIRST_ROUND_SHARE * d)


def k_grid(job: Job) -> list[int]:
    """The local steps a user considers: `K_GRID` and the job's own, within the rows a worker may
    sample in a round (`MAX_ROUND_SAMPLES`)."""
    most = MAX_ROUND_SAMPLES // job.training.batch_size
    return sorted({k for k in K_GRID if k <= most} | {job.training.local_steps})


def long_k(job: Job) -> int:
    """The profile's long round: `LONG_ROUND_X` times the job's local steps, within `k_grid`."""
    return min(LONG_ROUND_X * job.training.local_steps, max(k_grid(job)))


@dataclass
class Observed:
    """What the rounds so far show a user: per configuration, seconds and dollars per sample; per
    worker, its seconds per step and the overhead of a cold start."""

    job: Job
    h: RunHistory

    def rounds_at(self, cfg: Config) -> list[RoundRecord]:
        return [r for r in self.h.rounds if _cfg(r) == cfg and _ok(r) > 0]

    def per_sample(self, cfg: Config) -> tuple[float, float] | None:
        """(seconds, dollars) per sample at `cfg`: its warm rounds' totals (its cold one if none)."""
        rs = self.rounds_at(cfg)
        if not rs:
            return None
        samples = sum(_ok(r) for r in rs)
        return sum(_warm_s(r) for r in rs) / samples, sum(r.cost_usd for r in rs) / samples

    def samples(self) -> float:
        return float(sum(_ok(r) for r in self.h.rounds))

    def remaining_samples(self) -> float | None:
        """Samples still needed to reach the target at the recent pace: the metric's straight line
        in the samples trained over the last `PACE_ROUNDS` rounds' measurements, times
        `SAMPLES_MARGIN`; None before two measurements, inf when the line shows no progress."""
        t = self.job.training
        if t.target_value is None:
            return None
        up = t.target_metric in ("val_accuracy", "val_r2")
        pts, done = [], 0.0
        for r in self.h.rounds:
            v = getattr(r, t.target_metric, None)
            if v is not None:
                pts.append((done, float(v) if up else -float(v)))
            done += _ok(r)
        pts = pts[-PACE_ROUNDS:]
        if len(pts) < 2:
            return None
        x, y = np.array(pts).T
        if np.ptp(x) <= 0:
            return None
        slope, icpt = np.polyfit(x, y, 1)
        if slope <= 0:
            return math.inf
        goal = t.target_value if up else -t.target_value
        return max(SAMPLES_MARGIN * (goal - (icpt + slope * done)) / slope, 0.0)

    def _timings(self) -> list[tuple[RoundRecord, WorkerTiming]]:
        return [(r, t) for r in self.h.rounds if r.local_steps > 0 for t in r.timings if t.error is None]

    def step_s(self, m: int) -> float | None:
        """A worker's slowest seconds per local step seen at tier `m` (else at any tier: a larger
        tier presumed no faster); None before any step."""
        per = [
            (r.memory_mb, t.compute_s / t.steps_done(r.local_steps, r.batch_size))
            for r, t in self._timings()
            if t.compute_s > 0
        ]
        at = [s for mm, s in per if mm == m] or [s for _, s in per]
        return max(at) if at else None

    def cold_s(self) -> float:
        """A worker's seconds besides its steps, the coldest seen (its init, load, evaluation and
        upload): what each worker of a setting with new workers is priced at."""
        return max((t.init_s + t.total_s - t.compute_s for _, t in self._timings()), default=FIRST_ROUND_S)

    def fresh(self, cfg: Config) -> bool:
        """A round of `cfg` starts new workers (or re-shards): its workers count or tier changes."""
        last = self.h.rounds[-1] if self.h.rounds else None
        return last is None or (last.workers, last.memory_mb) != (cfg[0], cfg[1])

    def worker_s(self, cfg: Config, margin: float = COLD_MARGIN) -> float:
        """One worker's billed seconds at `cfg`, `margin` included: the coldest overhead seen when
        the round starts new workers (`fresh`), else the last round's slowest handler's besides its
        steps; its steps at `step_s`."""
        step = self.step_s(cfg[1])
        if step is None:
            return FIRST_ROUND_S
        last = [t.total_s - t.compute_s for t in self.h.rounds[-1].timings if t.error is None]
        base = self.cold_s() if self.fresh(cfg) or not last else max(last)
        return margin * (base + cfg[2] * step)

    def round_s(self, cfg: Config) -> float:
        """The next round's seconds at `cfg`: its slowest worker (`worker_s`, no margin) plus the
        last round's time besides its slowest worker (plan, Map, aggregation)."""
        if not self.h.rounds:
            return FIRST_ROUND_S
        last = self.h.rounds[-1]
        slowest = max((t.start_s + t.init_s + t.total_s for t in last.timings), default=0.0)
        return self.worker_s(cfg, 1.0) + max(last.round_s - slowest, 0.0)

    def untried_cost(self, cfg: Config, prices: Prices, arch: str, sizes: FunctionSizes) -> float:
        """A round at `cfg` (`worker_s`: its workers cold and reading their shards when it starts new
        ones) at the price list, the aggregation twice the slowest seen."""
        n, m, _ = cfg
        shape = bill.RoundShape(
            workers=n,
            worker_gb_s=n * m / 1024.0 * self.worker_s(cfg),
            planner_memory_mb=sizes.planner_memory_mb,
            aggregate_memory_mb=sizes.aggregate_memory_mb,
            plan_s=1.0,
            aggregate_s=2.0 * max((r.aggregate_s for r in self.h.rounds), default=1.0),
            shard_reads=n if self.fresh(cfg) else 0,
            fanout=sizes.fanout,
        )
        return float(bill.price(shape, prices, arch).usd)

    def round_cost(self, cfg: Config, prices: Prices, arch: str, sizes: FunctionSizes) -> float:
        """A round's cost at `cfg`: the dearest measured there when the last round ran it too (its
        workers warm: of its warm rounds, if any), else no less than `untried_cost`."""
        at = self.rounds_at(cfg)
        if at and _cfg(self.h.rounds[-1]) == cfg:
            return max(r.cost_usd for r in [r for r in at if not any(t.cold for t in r.timings)] or at)
        return max([*(r.cost_usd for r in at), self.untried_cost(cfg, prices, arch, sizes)])

    def stop(self, cfg: Config, prices: Prices, arch: str, sizes: FunctionSizes) -> Decision | None:
        """The user's limits before a round of `cfg` (`round_cost`): no round whose cost (x 1.3, and
        one straggler's worker `OVERRUN` times `worker_s` or the dearest seen at its tier and steps,
        a warm one's if its workers are warm) plus finalisation's would pass the budget; no round ending past the deadline by
        `round_s`."""
        c, h = self.job.constraints, self.h
        if len(h.rounds) >= self.job.training.max_rounds:
            return Decision(action="stop", reason="max_rounds", bound="max_rounds")
        fresh = self.fresh(cfg)
        seen = (
            t.init_s + t.total_s
            for r, t in self._timings()
            if (r.memory_mb, r.local_steps) == (cfg[1], cfg[2]) and (fresh or not t.cold)
        )
        worker = float(prices.lambda_cost(cfg[1], max([self.worker_s(cfg), *seen]), arch))
        worst = 1.3 * self.round_cost(cfg, prices, arch, sizes) + (OVERRUN - 1.0) * worker
        fin = float(bill.finalize_usd(prices, arch, sizes.planner_memory_mb, 2.0, margin=2.0))
        if c.budget_usd is not None and h.cost_total_usd + worst + fin > c.budget_usd:
            return Decision(action="stop", reason="user: the budget would be passed", bound="budget")
        if c.deadline_seconds is not None and h.rounds and h.elapsed_s + self.round_s(cfg) > c.deadline_seconds:
            return Decision(action="stop", reason="user: the deadline would be passed", bound="deadline")
        return None

    def left(self) -> tuple[float, float, float]:
        """(samples, seconds, dollars) left: the remaining samples (`remaining_samples`; 50 epochs
        before an estimate; no fewer than the last round's), the deadline's seconds less `FINALIZE_S`, the budget's dollars."""
        c, h = self.job.constraints, self.h
        est = self.remaining_samples()
        rem = est if est is not None and math.isfinite(est) else 50.0 * h.train_rows
        rem = max(rem, _ok(h.rounds[-1]) if h.rounds else 0.0)  # the target is not met: a round at least
        t_left = (c.deadline_seconds - h.elapsed_s - FINALIZE_S) if c.deadline_seconds else math.inf
        b_left = (c.budget_usd - h.cost_total_usd) if c.budget_usd else math.inf
        return rem, t_left, b_left

    def time_to_profile(self, cfg: Config, prices: Prices, arch: str, sizes: FunctionSizes) -> bool:
        """A user profiles `cfg` only while the profile stays within `PROFILE_SHARE` of the
        deadline and of the budget (its round's `round_s` and `round_cost` included), and the
        deadline leaves room for its round and the rest of the work at the fastest setting measured
        (before the pace shows progress: as many samples again as trained so far)."""
        c, h = self.job.constraints, self.h
        if not h.rounds:
            return True
        if c.deadline_seconds is not None and h.elapsed_s + self.round_s(cfg) > PROFILE_SHARE * c.deadline_seconds:
            return False
        if c.budget_usd is not None and (
            h.cost_total_usd + self.round_cost(cfg, prices, arch, sizes) > PROFILE_SHARE * c.budget_usd
        ):
            return False
        if c.deadline_seconds is None:
            return True
        rem, t_left, _ = self.left()
        est = self.remaining_samples()
        if est is None or not math.isfinite(est):
            rem = self.samples()
        fastest = min((ps[0] for c in {_cfg(r) for r in self.h.rounds} if (ps := self.per_sample(c))), default=0.0)
        return self.round_s(cfg) + fastest * rem <= t_left


def _gp(x: np.ndarray, y: np.ndarray) -> GaussianProcessRegressor:
    """A GP over the log settings: a smooth part, a log-linear trend, the rounds' noise."""
    d = x.shape[1]
    kernel = (
        ConstantKernel(1.0, (1e-2, 1e2)) * RBF(length_scale=[1.5] * d, length_scale_bounds=(0.5, 10.0))
        + ConstantKernel(0.1, (1e-3, 1e1)) * DotProduct(sigma_0=1.0, sigma_0_bounds="fixed")
        + WhiteKernel(0.01, (1e-4, 1.0))
    )
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=len(x) > 1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x, y)
    return gp


class SmltBO:
    """SMLT-style: a profile of `profile` settings (workers, local steps; a long round of one
    worker first) within `PROFILE_SHARE` of the deadline and budget, then GP-UCB over (workers,
    local steps) at a fixed tier, re-run every epoch, keeping to the settings that meet the
    deadline by its estimate with `DEADLINE_SHARE` to spare."""

    def __init__(
        self,
        memory_mb: int,
        beta: float = UCB_BETA,
        profile: tuple[tuple[int, int], ...] | None = None,
        sizes: FunctionSizes | None = None,
    ):
        self.memory_mb = memory_mb
        self.beta = beta
        self.profile = profile
        self.sizes = sizes or FunctionSizes()
        self.profiled = False
        self.chosen: tuple[int, int] | None = None  # GP-UCB's last choice, held within its epoch

    def __call__(self, job: Job, h: RunHistory, tiers: list[int], prices: Prices, arch: str) -> Decision:
        o = Observed(job, h)
        (n, k), why = self._setting(job, h, o, prices, arch)
        (n, _, k), why, stop = fit(job, o, (n, self.memory_mb, k), why, prices, arch, self.sizes)
        if stop is not None:
            return stop
        return Decision(
            action="train",
            workers=n,
            memory_mb=self.memory_mb,
            local_steps=k,
            reason=why,
            worker_time_limit_s=_cap(job, h),
        )

    def settings(self, job: Job) -> list[tuple[int, int]]:
        """The profile: `profile`, else one worker's long round (`long_k`; round 0 stops at
        `_cap`), then the job's local steps on 4 workers (how the pace scales with workers, the
        most a short profile shows), 1 and 16 (within the job's worker bounds)."""
        lo, hi = job.workers.min, job.workers.max
        k = job.training.local_steps
        want = self.profile or ((1, long_k(job)), (4, k), (1, k), (16, k))
        return list(dict.fromkeys((min(max(n, lo), hi), kk) for n, kk in want))

    def _setting(self, job: Job, h: RunHistory, o: Observed, prices: Prices, arch: str) -> tuple[tuple[int, int], str]:
        prof = self.settings(job)
        i = len(h.rounds)
        if not self.profiled and i < len(prof):
            if o.time_to_profile((prof[i][0], self.memory_mb, prof[i][1]), prices, arch, self.sizes):
                return prof[i], "SMLT: profile"
        self.profiled = True
        rows = max(h.train_rows, 1)
        done = o.samples()
        before = done - _ok(h.rounds[-1]) if h.rounds else 0.0
        if self.chosen is not None and int(done // rows) == int(before // rows):
            return self.chosen, "SMLT: same epoch"
        self.chosen, why = self.choose(job, h, o)
        return self.chosen, why

    def choose(self, job: Job, h: RunHistory, o: Observed) -> tuple[tuple[int, int], str]:
        """GP-UCB over (log2 n, log2 k) of log seconds and log dollars per sample, the deadline and
        budget judged on the GP means and the remaining samples the fit estimates (a change of
        workers adds a cold start)."""
        m = self.memory_mb
        obs = {(n, k): v for (n, mm, k) in {_cfg(r) for r in h.rounds} if mm == m and (v := o.per_sample((n, m, k)))}
        if not obs:
            last = h.rounds[-1]
            return (last.workers, last.local_steps), "SMLT: nothing measured"
        x = np.log2(np.array(list(obs), float))
        ts = np.log(np.array([v[0] for v in obs.values()]))
        cs = np.log(np.array([v[1] for v in obs.values()]))
        reach = TRUST_X * max(n for n, _ in obs)  # no leap past the workers measured
        ns = np.unique(np.round(np.geomspace(job.workers.min, job.workers.max, 24)).astype(int))
        ns = ns[ns <= reach] if (ns <= reach).any() else ns[:1]
        limit = 0.5 * self.sizes.worker_timeout_s  # a round a worker surely finishes
        ks = [k for k in k_grid(job) if o.worker_s((1, m, k)) <= limit] or [min(k_grid(job))]
        cand = np.array([(n, k) for n in ns for k in ks], float)
        xc = np.log2(cand)
        mt, st = _gp(x, ts).predict(xc, return_std=True)
        mc, sc = _gp(x, cs).predict(xc, return_std=True)
        rem, t_left, b_left = o.left()
        last = h.rounds[-1]
        switch = np.where(cand[:, 0] != last.workers, o.cold_s(), 0.0)
        t_est, c_est = np.exp(mt) * rem + switch, np.exp(mc) * rem
        if job.constraints.objective == "speed":
            ok = c_est <= b_left
            score, fallback = mt - self.beta * st, mc
        else:
            ok = (t_est <= DEADLINE_SHARE * t_left) & (c_est <= b_left)
            score, fallback = mc - self.beta * sc, t_est
        i = int(np.argmin(np.where(ok, score, np.inf))) if ok.any() else int(np.argmin(fallback))
        n, k = int(cand[i, 0]), int(cand[i, 1])
        return (n, k), (
            f"SMLT: GP-UCB (beta {self.beta:g}) -> {n} x {k}; ~{rem:,.0f} samples left, "
            f"~{t_est[i]:.0f} s, ~${c_est[i]:.4f}{'' if ok.any() else ' (none fits: the fallback)'}"
        )


def fit(
    job: Job, o: Observed, cfg: Config, why: str, prices: Prices, arch: str, sizes: FunctionSizes
) -> tuple[Config, str, Decision | None]:
    """A round of `cfg` shrunk until the user's limits (`Observed.stop`) allow it: past the budget,
    fewer workers, then fewer steps; past the deadline, fewer steps. The stop when none fits."""
    n, m, k = cfg
    stop = o.stop(cfg, prices, arch, sizes)
    least_k = min(k_grid(job))
    while stop is not None and stop.bound in ("budget", "deadline"):
        if stop.bound == "budget" and n > job.workers.min:
            n = max(job.workers.min, n // 2)
        elif k > least_k:
            k = max(least_k, k // 2)
        else:
            break
        why = f"{why.split(':')[0]}: {n} workers x {k} steps, a round that fits the {stop.bound}"
        stop = o.stop((n, m, k), prices, arch, sizes)
    return (n, m, k), why, stop


def run_smlt(
    job: Job,
    workload: Workload,
    tiers: list[int],
    prices: Prices,
    seed: int,
    world: World,
    sizes: FunctionSizes | None = None,
) -> SimResult:
    sizes = sizes or FunctionSizes()
    bo = SmltBO(workload.smallest_tier(tiers), sizes=sizes)
    return simulate(job, workload, bo, tiers, prices, seed=seed, world=world, sizes=sizes)


def profile_settings(job: Job, tier: int, tiers: list[int]) -> list[Config]:
    """The settings a user profiles, one worker's first (its instance stays warm): a long round
    (`long_k`; round 0 stops at `_cap`), 5x the job's local steps, the job's own, the
    job's workers and steps, and 5x the steps at a tier twice as large (each within the
    job's bounds)."""
    n, k = job.workers.initial, job.training.local_steps
    one = max(1, job.workers.min)
    big = next((t for t in sorted(tiers) if t >= 2 * tier), max(tiers))
    k5 = min(5 * k, max(k_grid(job)))
    out = [(one, tier, long_k(job)), (one, tier, k5), (one, tier, k), (n, tier, k), (one, big, k5)]
    return list(dict.fromkeys(out))


class ProfiledFixed:
    """One round at each of `settings` while the profile's share leaves room, then the setting whose
    measured throughput meets the deadline at the lowest cost by its own estimate (`objective:
    speed`: the fastest within the budget), held to the end."""

    def __init__(self, settings: list[Config], sizes: FunctionSizes | None = None):
        self.settings = settings
        self.sizes = sizes or FunctionSizes()
        self.held: Config | None = None
        self.why = ""

    def __call__(self, job: Job, h: RunHistory, tiers: list[int], prices: Prices, arch: str) -> Decision:
        o = Observed(job, h)
        i = len(h.rounds)
        if (
            self.held is None
            and i < len(self.settings)
            and o.time_to_profile(self.settings[i], prices, arch, self.sizes)
        ):
            cfg, why = self.settings[i], "profile"
        else:
            if self.held is None:
                self.held, self.why = self._pick(job, h, o)
            cfg, why = self.held, self.why
        cfg, why, stop = fit(job, o, cfg, why, prices, arch, self.sizes)
        if stop is not None:
            return stop
        return Decision(
            action="train",
            workers=cfg[0],
            memory_mb=cfg[1],
            local_steps=cfg[2],
            reason=why,
            worker_time_limit_s=_cap(job, h),
        )

    def _pick(self, job: Job, h: RunHistory, o: Observed) -> tuple[Config, str]:
        rem, t_left, b_left = o.left()
        est = {cfg: ps for cfg in self.settings if (ps := o.per_sample(cfg)) is not None}
        if not est:
            return self.settings[0], "fixed from profile: nothing measured"
        t = {cfg: s * rem for cfg, (s, _) in est.items()}
        d = {cfg: usd * rem for cfg, (_, usd) in est.items()}
        if job.constraints.objective == "speed":
            ok = [cfg for cfg in est if d[cfg] <= b_left]
            best = min(ok, key=t.get) if ok else min(est, key=d.get)  # type: ignore[arg-type]
        else:
            ok = [cfg for cfg in est if t[cfg] <= DEADLINE_SHARE * t_left]
            best = min(ok, key=d.get) if ok else min(est, key=t.get)  # type: ignore[arg-type]
        n, m, k = best
        return (
            best,
            f"fixed from profile: {n} x {m} MB x {k}, ~{t[best]:.0f} s, ~${d[best]:.4f} for ~{rem:,.0f} samples",
        )


def run_profiled(
    job: Job,
    workload: Workload,
    tiers: list[int],
    prices: Prices,
    seed: int,
    world: World,
    sizes: FunctionSizes | None = None,
) -> SimResult:
    sizes = sizes or FunctionSizes()
    plan = ProfiledFixed(profile_settings(job, workload.smallest_tier(tiers), tiers), sizes=sizes)
    return simulate(job, workload, plan, tiers, prices, seed=seed, world=world, sizes=sizes)
