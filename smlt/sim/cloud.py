"""A simulated AWS: Lambda workers, the aggregator and planner Lambdas, Step Functions, S3.

It produces the same `RoundRecord`s (with `WorkerTiming`s) the real system records, so the
same `smlt.planner.decide` plans in both. Calibration (see docs/planner.md):

- CPU share by memory: 1 vCPU at 1,769 MB, linear to 6 at 10,240 MB (facts.md); compute speed
  beyond one vCPU adds `efficiency` per vCPU (workload property, from measured 2-thread speedups).
- FLOP rate: the rate measured on this machine (calibration.json) x the workload's cpu_factor;
  per-step overhead measured likewise.
- S3: ~540 Mbit/s (67.5 MB/s) per function with 15 % log-normal jitter, 30 ms GET / 50 ms PUT
  latency (facts.md: 100 MB in 2.49 s); below one vCPU the network share falls with sqrt(memory).
- Cold starts: torch container init, log-normal (median 3.5 s, sigma 0.35), x sqrt(1769/m) below
  one vCPU, capped at 10 s, billed. Idle instances live 5-15 min and are recycled at random (2 %
  per round). Shards come from the /tmp cache unless the instance is new or n changed.
- Fan-out: the round's Map is the deployed rule's (smlt.fanout: inline for n <= 40). Inline, Step
  Functions starts worker i about 0.206 s after worker i-1 (SMLT: 100 workers in 20.6 s), +-30 %.
  Distributed, children start ~10 ms apart and the Map Run adds 2-7 s (uniform per round: the one
  published figure, 7+ s for 100 no-op items, treated as a range) before the parent goes on.
  These are the simulator's own figures, not the planner's configured priors.
- Stragglers: 2 % of workers run 1.5-3x slower. A worker that passes the plan's time limit stops
  itself (billed up to the limit) and its update is lost; under quorum the round is void.
- Aggregation: sharded in 64 MB pieces; each shard reads its slice of every update at 2x the
  per-function bandwidth, sums at 0.5 G elements/s, writes its slice; cold start ~1 s.
- Noise uses common random numbers: round r's draws depend only on (seed, r, worker), so the
  planners compared on a scenario meet the same luck.
- Prices: the round's bill (smlt.bill, the ledger's count) under the Prices table; the
  planner's and the aggregator's memory and the worker timeout are the deployed ones
  (`sizes`, from cdk.json unless given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from smlt import bill
from smlt.config import FunctionSizes
from smlt.planner.priors import vcpus
from smlt.planner.progress import round_progress, saturation
from smlt.planner.types import RoundRecord, WorkerTiming
from smlt.prices import Prices, gb_seconds
from smlt.sim.workloads import MEASURED_FLOPS, MEASURED_STEP_OVERHEAD, Workload

S3_MBPS = 67.5
GET_LAT, PUT_LAT = 0.03, 0.05
INIT_MEDIAN, INIT_SIGMA, INIT_MAX = 3.5, 0.35, 10.0
KEEPALIVE = (300.0, 900.0)
RECYCLE_P = 0.02
FANOUT_S = 0.206
CHILD_START_S = 0.01
MAP_RUN_OVERHEAD_S = (2.0, 7.0)
STRAGGLER_P = 0.02
SFN_STATE_S = 0.05  # latency per state transition on the critical path
BLOCK = 64  # random draws per round come in blocks (common random numbers)


@dataclass
class Instance:
    last_used: float
    keepalive: float


@dataclass
class Cloud:
    workload: Workload
    prices: Prices = field(default_factory=Prices)
    architecture: str = "x86_64"
    seed: int = 0
    metric_noise: bool = True
    sizes: FunctionSizes = field(default_factory=FunctionSizes)

    def __post_init__(self):
        self.now = 0.0
        self.tau = 0.0
        self.pools: dict[int, list[Instance]] = {}
        self.prev_n: int | None = None
        self.agg_last = -1e9
        self.plan_last = -1e9
        self.round = 0
        self.cost = 0.0
        self.last_bill: bill.Bill | None = None  # of the last round run
        # run-to-run variation of the curve (seed): +-5 % on its time scale
        self.tau_scale = float(np.exp(0.05 * np.random.default_rng([self.seed, 999_999]).standard_normal()))

    # ----------------------------------------------------------------- truth helpers
    def speed(self, m: float) -> float:
        v = float(vcpus(m))
        return v if v <= 1.0 else 1.0 + self.workload.efficiency * (v - 1.0)

    def net(self, m: float) -> float:
        return min(1.0, math.sqrt(m / 1769.0))

    def flops(self) -> float:
        return MEASURED_FLOPS * self.workload.cpu_factor

    def accuracy(self, tau: float) -> float:
        w = self.workload
        return float(saturation(tau / self.tau_scale, w.acc0, w.acc_max, w.tau_acc, w.p_acc))

    def loss(self, tau: float) -> float:
        w = self.workload
        return float(saturation(tau / self.tau_scale, w.loss0, w.loss_min, w.tau_loss, w.p_loss))

    def _lambda(self, mb: float, seconds: float) -> float:
        return self.prices.lambda_cost(mb, seconds, self.architecture)

    # ----------------------------------------------------------------- random numbers
    def _draws(self, kind: str, size: int = 0):
        """Common random numbers: the draws of round r (and of worker i in it) depend only on the
        seed, r and i, not on the plans, so different planners (and the oracle's candidates) meet
        the same cold starts, stragglers and noise in the same round."""
        key = {"round": 0, "plan": 1, "final": 2}[kind]
        rng = np.random.default_rng([self.seed, self.round, key])
        if kind != "round":
            return rng
        m = max(size, BLOCK)
        return {name: rng.standard_normal(m) for name in ("init", "bw_in", "bw_out", "noise", "rest")} | {
            "u_strag": rng.random(m),
            "slow": rng.uniform(1.5, 3.0, m),
            "fan": rng.uniform(0.7, 1.3, m),
            "recycle": rng.random(m),
            "keep": rng.uniform(*KEEPALIVE, m),
            "common": rng.standard_normal(4),
            "map_run": rng.uniform(*MAP_RUN_OVERHEAD_S),  # drawn last: the draws above are unchanged
        }

    # ----------------------------------------------------------------- one planner call
    def plan_call(self, seconds: float = 0.3) -> tuple[float, float]:
        cold = self.now - self.plan_last > 600.0
        s = seconds * float(np.exp(0.2 * self._draws("plan").standard_normal())) + (0.9 if cold else 0.0)
        self.plan_last = self.now + s
        return s, self._lambda(self.sizes.planner_memory_mb, s)

    # ----------------------------------------------------------------- one round
    def run_round(
        self,
        n: int,
        m: int,
        k: int,
        time_limit_s: float | None,
        quorum: float = 0.5,
        plan: tuple[float, float] | None = None,
    ) -> RoundRecord:
        w = self.workload
        timeout = float(self.sizes.worker_timeout_s)
        limit = min(time_limit_s or timeout, timeout)
        plan_s, _ = plan if plan is not None else self.plan_call()  # its cost is in the round's bill
        t_start = self.now + plan_s + 3 * SFN_STATE_S
        z = self._draws("round", n)

        # instances: reuse warm ones, start the rest cold
        old = self.pools.get(m, [])
        pool = [
            inst
            for j, inst in enumerate(old)
            if t_start - inst.last_used <= inst.keepalive and z["recycle"][j % len(z["recycle"])] > RECYCLE_P
        ]
        warm = min(n, len(pool))
        reshard = self.prev_n != n
        speed = self.speed(m)
        net = self.net(m)
        common = math.exp(0.04 * z["common"][0])
        step_s = MEASURED_STEP_OVERHEAD / w.cpu_factor + w.batch * w.flops_per_sample / (self.flops() * speed)
        shard_mb = w.dataset_bytes / 1e6 / n
        init_scale = math.sqrt(max(1.0, 1769.0 / m))
        distributed = self.sizes.fanout.kind(n) == "distributed"
        timings: list[WorkerTiming] = []
        worker_gb_s = 0.0
        ends = []
        oks = 0
        for i in range(n):
            cold = i >= warm
            init = min(INIT_MAX, INIT_MEDIAN * math.exp(INIT_SIGMA * z["init"][i]) * init_scale) if cold else 0.0
            miss = cold or reshard
            bw = S3_MBPS * net * math.exp(0.15 * z["bw_in"][i])
            load = GET_LAT + w.model_mb / bw + ((GET_LAT + shard_mb / bw) if miss else 0.0)
            error = None
            slow = z["slow"][i] if z["u_strag"][i] < STRAGGLER_P else 1.0
            noise = common * math.exp(0.06 * z["noise"][i]) * slow
            if m < w.mem_needed_mb:
                error = "OutOfMemory"
                ev = comp = up = 0.0
                total = load + 0.5
            else:
                ev = 0.01 + (w.val_rows / n) * (w.flops_per_sample / 3) / (self.flops() * speed) * noise
                comp = k * step_s * noise
                up = (PUT_LAT + w.model_mb / (S3_MBPS * net * math.exp(0.15 * z["bw_out"][i]))) if k > 0 else 0.0
                rest = 0.04 * math.exp(0.3 * z["rest"][i])
                total = load + ev + comp + up + rest
                if total > limit:
                    error = "TimeLimit"
                    total = limit
            if error is None:
                oks += 1
            start = i * CHILD_START_S * z["fan"][i] if distributed else 0.3 + i * FANOUT_S * z["fan"][i]
            ends.append(start + init + total)
            worker_gb_s += float(gb_seconds(m, init + total))
            timings.append(
                WorkerTiming.model_construct(
                    worker=i,
                    memory_mb=m,
                    samples=k * w.batch,
                    load_s=load,
                    eval_s=ev,
                    compute_s=comp,
                    upload_s=up,
                    total_s=total,
                    cold=cold,
                    init_s=init,
                    start_s=start,
                    cache_miss=miss,
                    error=error,
                )
            )
        # instances: the warm ones used plus the new ones
        used = [Instance(t_start + ends[i], pool[i].keepalive if i < warm else float(z["keep"][i])) for i in range(n)]
        self.pools[m] = used + pool[warm:]
        self.prev_n = n
        workers_end = max(ends) + (float(z["map_run"]) if distributed else 0.0)

        # aggregation (sharded), after the Map finishes
        shards = max(1, math.ceil(w.model_mb / 64.0))
        agg_cold = t_start + workers_end - self.agg_last > 600.0
        slice_mb = w.model_mb / shards
        agg_s = (
            (1.0 if agg_cold else 0.0)
            + 0.2
            + oks * (GET_LAT + slice_mb / (2 * S3_MBPS))
            + oks * (w.params / shards) / 5e8
            + (PUT_LAT + slice_mb / S3_MBPS if k > 0 else 0.0)
        ) * math.exp(0.1 * z["common"][1])
        self.agg_last = t_start + workers_end + agg_s
        self.last_bill = bill.price(
            bill.RoundShape(
                workers=n,
                worker_gb_s=worker_gb_s,
                planner_memory_mb=self.sizes.planner_memory_mb,
                aggregate_memory_mb=self.sizes.aggregate_memory_mb,
                plan_s=plan_s,
                aggregate_s=agg_s,
                reported=oks,
                aggregators=shards,
                eval_only=k == 0,
                shard_reads=sum(1 for t in timings if t.cache_miss),
                fanout=self.sizes.fanout,
            ),
            self.prices,
            self.architecture,
        )
        cost = float(self.last_bill.usd)

        # progress: metrics are of the model the round started from
        acc = self.accuracy(self.tau)
        loss = self.loss(self.tau)
        if self.metric_noise:
            acc = float(np.clip(acc + z["common"][2] * math.sqrt(max(acc * (1 - acc), 1e-4) / w.val_rows), 0, 1))
            loss = float(loss * math.exp(0.01 * z["common"][3]))
        applied = k > 0 and oks > 0 and oks >= quorum * n - 1e-9
        if applied:
            self.tau += float(round_progress(oks, k, w.momentum_effective, w.beta, w.drift_k))
        round_s = plan_s + 3 * SFN_STATE_S + workers_end + agg_s + 2 * SFN_STATE_S
        self.now += round_s
        self.cost += cost
        rec = RoundRecord.model_construct(
            round=self.round,
            workers=n,
            memory_mb=m,
            local_steps=k,
            batch_size=w.batch,
            workers_ok=oks,
            timings=timings,
            aggregate_s=agg_s,
            round_s=round_s,
            train_loss=self.loss(self.tau),
            val_loss=loss,
            val_accuracy=acc,
            cost_usd=cost,
            time_limit_s=time_limit_s,
        )
        self.round += 1
        return rec

    def finalize(self) -> tuple[float, float]:
        """The last Plan's Choice and the Finalize state: the planner Lambda writes final/
        (copy + metrics); transitions Plan, ShouldTrain/Continue, Finalize, Done."""
        s = 1.0 * float(np.exp(0.2 * self._draws("final").standard_normal()))
        cost = float(bill.finalize_usd(self.prices, self.architecture, self.sizes.planner_memory_mb, s))
        self.now += s + 2 * SFN_STATE_S
        self.cost += cost
        return s, cost
