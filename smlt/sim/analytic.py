"""Expected time and cost of a static (n, m, k) run in a simulated world, from its ground truth.

Used with hindsight only: to pre-screen the oracle's search (the oracle then simulates the best
few in the same world) and to place scenario deadlines and budgets around what is achievable.
Nothing here is the planner's: the rounds come from the recorded curves, the seconds from the
world's constants (smlt.sim.world), the bill from smlt.runtime.bill.
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime import bill, capacity
from smlt.runtime.capacity import FULL_VCPU_MB
from smlt.runtime.config import FunctionSizes
from smlt.runtime.prices import Prices
from smlt.sim.cloud import AGG_SLICE_MB, INIT_MAX
from smlt.sim.workloads import Workload
from smlt.sim.world import World

# The plans the oracle searches (and scenario placement uses): a log grid like the planner's.
N_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
K_GRID = (1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 200, 300, 500)


def grid(workload: Workload, tiers: list[int], n_max: int = 64, n_min: int = 1):
    ns = [n for n in N_GRID if n_min <= n <= n_max] or [n_min]
    ms = [m for m in sorted(tiers) if workload.fits(m)] or [max(tiers)]
    N, M, K = np.meshgrid(np.array(ns, float), np.array(ms, float), np.array(K_GRID, float), indexing="ij")
    return N.ravel(), M.ravel(), K.ravel()


def static_round_bill(N, M, worker_s, agg_s, plan_s, shard_reads, aggregators, prices, arch, sizes) -> bill.Bill:
    """The bill of one round of N workers at M MB, each running worker_s seconds, every one reporting."""
    shape = bill.RoundShape(
        workers=N,
        worker_gb_s=N * M / 1024.0 * worker_s,
        planner_memory_mb=sizes.planner_memory_mb,
        aggregate_memory_mb=sizes.aggregate_memory_mb,
        plan_s=plan_s,
        aggregate_s=agg_s,
        aggregators=aggregators,
        shard_reads=shard_reads,
        fanout=sizes.fanout,
    )
    return bill.price(shape, prices, arch)


def rounds_needed(workload: Workload, world: World, N, K, target: float) -> np.ndarray:
    """Training rounds until the target shows in a round's metrics (the model after the last
    round is measured by the next one): inf where the curve never gets there."""
    out = np.empty(len(N))
    cache: dict[tuple[float, float], float] = {}
    for i, (n, k) in enumerate(zip(N, K)):
        key = (float(n), float(k))
        if key not in cache:
            s = workload.curves.samples_to(target, n, k) * world.curve_scale
            cache[key] = math.ceil(s / (n * k * workload.batch)) + 1 if math.isfinite(s) else math.inf
        out[i] = cache[key]
    return out


def expected(
    workload: Workload,
    world: World,
    N,
    M,
    K,
    prices: Prices | None = None,
    arch: str = "x86_64",
    target: float | None = None,
    sizes: FunctionSizes | None = None,
    first_round: bool = False,
):
    """Expected total seconds and dollars to reach the target at static (N, M, K), the rounds
    and whether the plan can run at all (fits memory, a round within the function timeout);
    with `first_round`, also the expected bill of round 0 (cold starts, shard reads)."""
    wl, w = workload, world
    prices = prices or Prices()
    sizes = sizes or FunctionSizes()
    N, M, K = (np.asarray(a, dtype=float) for a in (N, M, K))
    link = w.link
    speed = capacity.speed(M, w.efficiency)
    step = wl.batch * wl.step_s_per_sample * w.cpu_factor / speed
    ev = 0.01 + (wl.val_rows / N) * wl.step_s_per_sample / 3 * w.cpu_factor / speed
    shards = max(1, math.ceil(wl.model_mb / AGG_SLICE_MB))
    sl = wl.model_mb / shards
    # the aggregator's function: a bucket that refilled over the round (full), the sum refills it
    agg_read, left = link.transfer(N * sl, link.bucket_mb)
    agg_sum = N * (wl.params / shards) / 5e8
    agg = 0.2 + N * w.get_s + agg_read + agg_sum + w.put_s + link.transfer(sl, link.refill(left, agg_sum))[0]
    sfn = 5 * w.state_s
    plan = 0.3
    # a worker's network (smlt.sim.network): round 0 reads model and shards from a full bucket,
    # refills while it trains, uploads; a steady round starts from what that left plus the gap
    # between rounds (aggregation, plan, states)
    busy = ev + K * step
    load0, left = link.transfer(wl.model_mb + wl.dataset_bytes / 1e6 / N, link.bucket_mb)
    up0, left = link.transfer(wl.model_mb, link.refill(left, busy))
    load, left = link.transfer(wl.model_mb, link.refill(left, agg + plan + sfn))
    up, _ = link.transfer(wl.model_mb, link.refill(left, busy))
    h = w.get_s + load + busy + w.put_s + up + 0.04
    h_first = 2 * w.get_s + load0 + busy + w.put_s + up0 + 0.04
    z = np.sqrt(2 * np.log(np.maximum(N, 1.0)))  # ~ the largest of n standard normals
    p_strag = 1 - (1 - w.straggler_p) ** N
    slow = 1 + p_strag * (sum(w.straggler_slow) / 2 - 1)
    lo, hi = w.distributed_overhead_s
    fan = np.where(
        sizes.fanout.is_inline(N), 0.3 + (N - 1) * w.inline_per_worker_s, (N - 1) * w.child_start_s + (lo + hi) / 2
    )
    init = w.init_median_s * math.exp(w.init_sigma**2 / 2) * np.maximum(1.0, FULL_VCPU_MB / M)
    init_max = np.minimum(INIT_MAX, init * np.exp(w.init_sigma * z))
    work = fan + h * np.exp(w.worker_sigma * z) * slow
    work_first = fan + init_max + h_first * np.exp(w.worker_sigma * z) * slow
    round_s = plan + sfn + work + agg
    round_first = plan + 0.9 + sfn + work_first + agg + 1.0
    fault_s = 1 + w.duplicate_p + 3.5 * w.overrun_p  # billed seconds per worker-second, on average

    def round_bill(worker_s, agg_s, plan_s, shard_reads):
        return static_round_bill(N, M, worker_s, agg_s, plan_s, shard_reads, shards, prices, arch, sizes)

    cost = round_bill(h * fault_s, agg, plan, 0.0).usd
    cost_first = round_bill((h_first + init) * fault_s, agg + 1.0, plan + 0.9, N).usd
    R = rounds_needed(wl, w, N, K, wl.target if target is None else target)
    fin_s, fin_c = 1.1, bill.finalize_usd(prices, arch, sizes.planner_memory_mb, 1.3)
    T = round_first + (R - 1) * round_s + fin_s
    Cst = cost_first + (R - 1) * cost + fin_c
    valid = (
        (h_first * 1.5 + INIT_MAX <= 0.8 * sizes.worker_timeout_s) & np.array([wl.fits(m) for m in M]) & np.isfinite(R)
    )
    if first_round:
        return T, Cst, R, valid, cost_first
    return T, Cst, R, valid
