"""Expected time and cost of a static (n, m, k) run, from the simulator's ground truth.

Used with hindsight only: to pre-screen the oracle's grid search (the oracle then simulates the
best few for real) and to place scenario deadlines and budgets around what is achievable.
"""

from __future__ import annotations

import math

import numpy as np

from smlt import bill
from smlt.config import FunctionSizes
from smlt.planner.core import K_SET, N_SET
from smlt.planner.priors import vcpus
from smlt.planner.progress import round_progress
from smlt.planner.timing import expected_max_z
from smlt.prices import Prices
from smlt.sim import cloud as C
from smlt.sim.workloads import MEASURED_FLOPS, MEASURED_STEP_OVERHEAD, Workload, tau_target


def grid(workload: Workload, tiers: list[int], n_max: int = 64, n_min: int = 1):
    ns = [n for n in N_SET if n_min <= n <= n_max]
    ms = [m for m in sorted(tiers) if m >= workload.mem_needed_mb] or [max(tiers)]
    N, M, K = np.meshgrid(np.array(ns, float), np.array(ms, float), np.array(K_SET, float), indexing="ij")
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


def expected(
    workload: Workload,
    N,
    M,
    K,
    prices: Prices | None = None,
    arch: str = "x86_64",
    target: float | None = None,
    worst: bool = False,
    sizes: FunctionSizes | None = None,
):
    """Expected total seconds and dollars to reach the target at static (N, M, K), rounds, validity
    (and, with worst=True, the worst-case bill of one round: every worker cold at the 10 s init
    cap and running to a 2.5 x p90 + 3 s straggler limit, a slow aggregator)."""
    w = workload
    prices = prices or Prices()
    sizes = sizes or FunctionSizes()
    N, M, K = (np.asarray(a, dtype=float) for a in (N, M, K))
    v = vcpus(M)
    speed = np.where(v <= 1, v, 1 + w.efficiency * (v - 1))
    net = np.minimum(1.0, np.sqrt(M / 1769.0))
    flops = MEASURED_FLOPS * w.cpu_factor
    step = MEASURED_STEP_OVERHEAD / w.cpu_factor + w.batch * w.flops_per_sample / (flops * speed)
    bw = C.S3_MBPS * net / 1.011
    ev = 0.01 + (w.val_rows / N) * (w.flops_per_sample / 3) / (flops * speed)
    h = C.GET_LAT + w.model_mb / bw + ev + K * step + C.PUT_LAT + w.model_mb / bw + 0.04
    h_first = h + C.GET_LAT + (w.dataset_bytes / 1e6 / N) / bw
    z = expected_max_z(N)
    # the expected Map of the simulator's world (smlt.sim.cloud), under the deployed rule
    distributed_fan = (N - 1) * C.CHILD_START_S + sum(C.MAP_RUN_OVERHEAD_S) / 2
    fan = np.where(sizes.fanout.is_inline(N), 0.3 + (N - 1) * C.FANOUT_S, distributed_fan)
    init = C.INIT_MEDIAN * math.exp(C.INIT_SIGMA**2 / 2) * np.sqrt(np.maximum(1.0, 1769.0 / M))
    init_max = np.minimum(C.INIT_MAX, init * (1 + C.INIT_SIGMA * z))
    work = fan + h * (1 + 0.06 * z)
    work_first = fan + init_max + h_first * (1 + 0.06 * z)
    shards = max(1, math.ceil(w.model_mb / 64.0))
    sl = w.model_mb / shards
    agg = 0.2 + N * (C.GET_LAT + sl / (2 * C.S3_MBPS)) + N * (w.params / shards) / 5e8 + C.PUT_LAT + sl / C.S3_MBPS
    sfn = 5 * C.SFN_STATE_S
    plan = 0.3
    round_s = plan + sfn + work + agg
    round_first = plan + 0.9 + sfn + work_first + agg + 1.0

    def round_bill(worker_s, agg_s, plan_s, shard_reads):
        return static_round_bill(N, M, worker_s, agg_s, plan_s, shard_reads, shards, prices, arch, sizes)

    cost = round_bill(h, agg, plan, 0.0).usd
    cost_first = round_bill(h_first + init, agg + 1.0, plan + 0.9, N).usd
    tau = tau_target(w, target=target)
    dtau = round_progress(N, K, w.momentum_effective, w.beta, w.drift_k)
    R = np.ceil(tau / dtau) + 1.0
    fin_s, fin_c = 1.1, bill.finalize_usd(prices, arch, sizes.planner_memory_mb, 1.3)
    T = round_first + (R - 1) * round_s + fin_s
    Cst = cost_first + (R - 1) * cost + fin_c
    valid = (h_first * 1.5 + C.INIT_MAX <= 0.8 * sizes.worker_timeout_s) & (M >= w.mem_needed_mb)
    if worst:
        limit = 2.5 * h_first * 1.1 + 3.0
        b = round_bill(C.INIT_MAX + limit, 2 * agg + 1.5, 1.5, N)
        wc = b.worker_usd + b.control_usd + b.services_usd * 1.2
        return T, Cst, R, valid, wc
    return T, Cst, R, valid
