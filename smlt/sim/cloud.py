"""A simulated AWS: Lambda workers, the aggregator and planner Lambdas, Step Functions, S3.

It writes the `RoundRecord`s (with `WorkerTiming`s) the deployed system records, so the same
`smlt.runtime.planner.decide` plans in both. Its ground truth is nobody's model (docs/planner.md,
"The benchmark's world"):

- progress: the recorded curves (smlt.sim.curves), replayed at the samples the workers really did;
- compute: the step time per sample measured here on one thread x the world's Lambda-vCPU factor;
  the worker's torch threads and Lambda's vCPU share are smlt.runtime.capacity's (one thread per
  vCPU paid for, a fractional one included), every vCPU beyond the first adding the world's
  `efficiency`; below 1,769 MB the one thread runs at the CPU share (memory / 1,769);
- platform constants (cold starts, S3 latency, the Map's start-up, stragglers, noise): the scenario's
  `World` (smlt.sim.world), drawn around ../shared/facts.md, not the planner's priors;
- the network: each function's token bucket (smlt.sim.network, the world's constants, the same at
  every memory size). A worker loads (model, and its shards on a cache miss) from the bucket it
  starts with - full when cold, refilled at the sustained rate since a warm instance's last
  round - refills while it evaluates and computes, and uploads from what is left; the
  aggregator's function keeps its own bucket between rounds;
- the worker stops itself at 0.8 x the plan's compute limit (smlt/runtime/steps/train.py) after at least
  one step, and its partial update counts: it records the steps and samples it did and `cut`;
  Step Functions gives up on a worker at the plan's task timeout (its update is lost, its Lambda
  is billed until it ends or hits the function timeout);
- faults at the fault tests' rates: throttled invocations retried after Step Functions' backoff,
  duplicated invocations (both runs billed), overruns (a worker slowed 2-5x past where it would stop);
- bills: `smlt.runtime.bill` (the one source of per-request rules); every extra attempt (a retry, a
  duplicate) is one more invocation of the round's shape, its seconds in the workers' GB-s.

Random numbers are common across planners: round r's draws depend only on (seed, r, worker, what),
so the planners compared on a scenario meet the same luck.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from smlt.runtime import bill, capacity
from smlt.runtime.capacity import FULL_VCPU_MB
from smlt.runtime.config import FunctionSizes
from smlt.runtime.planner.types import RoundRecord, WorkerTiming
from smlt.runtime.prices import Prices, gb_seconds
from smlt.runtime.roundspec import INIT_MAX_S, round_limits
from smlt.sim.workloads import Workload
from smlt.sim.world import World

INIT_MAX = INIT_MAX_S  # Lambda's init phase is capped at 10 s
STOP_FRACTION = 0.8  # smlt/runtime/steps/train.py: the worker stops at 0.8 x its compute limit
AGG_SLICE_MB = 64.0
# A round's per-worker draws: standard normal, then uniform on [0, 1) (the order keys each stream)
NORMAL = ("init", "bw_in", "bw_out", "noise", "rest")
UNIFORM = ("u_strag", "slow", "fan", "recycle", "keep", "fault", "fault_x")


@lru_cache(maxsize=1 << 15)
def _drawn(seed: int, rnd: int, key: tuple[int, ...], normal: bool, size: int | None):
    """The draws of stream (seed, round, key): standard normal or uniform, one (size None) or
    `size`. Every planner a scenario compares meets the same draws, so they are drawn once per
    process and shared (read-only): a generator's seeding costs more than a round's arithmetic."""
    rng = np.random.default_rng([seed, rnd, *key])
    out = rng.standard_normal(size) if normal else rng.random(size)
    if size is not None:
        out.flags.writeable = False
    return out


@dataclass
class Instance:
    last_used: float
    keepalive: float
    tokens: float  # its network bucket when it finished (MB)


@dataclass
class _Worker:
    """One worker's round, before it becomes a WorkerTiming."""

    timing: WorkerTiming
    billed_s: float  # Lambda seconds billed (init + handler, duplicates and overruns included)
    end_s: float  # when Step Functions sees it finish (or gives up), from the Map's start
    attempts: int  # invocations beyond the first (retries, duplicates)
    tokens: float  # its network bucket at the end (MB)


@dataclass
class Cloud:
    workload: Workload
    prices: Prices = field(default_factory=Prices)
    architecture: str = "x86_64"
    seed: int = 0
    metric_noise: bool = True
    sizes: FunctionSizes = field(default_factory=FunctionSizes)
    world: World | None = None
    faults: bool = True

    def __post_init__(self) -> None:
        self.world = self.world or World.draw(self.seed, "calm", self.workload.family)
        self.now = 0.0
        self.acc = self.workload.curves.acc0  # the global model's true accuracy
        self.pools: dict[int, list[Instance]] = {}
        self.prev_n: int | None = None
        self.agg_last = -1e9
        self.agg_tokens = self.w.net_bucket_mb
        self.plan_last = -1e9
        self.round = 0
        self.cost = 0.0
        self.last_bill: bill.Bill | None = None  # of the last round run

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    # ----------------------------------------------------------------- truth helpers
    def speed(self, m: float) -> float:
        """Compute speed relative to one full vCPU running one thread."""
        return float(capacity.speed(m, self.w.efficiency))

    def step_s(self, m: float) -> float:
        """Seconds of one local step of a batch, before noise."""
        wl = self.workload
        return wl.batch * wl.step_s_per_sample * self.w.cpu_factor / self.speed(m)

    def loss(self, acc: float) -> float:
        return self.workload.curves.loss(acc)

    def _lambda(self, mb: float, seconds: float) -> float:
        return float(self.prices.lambda_cost(mb, seconds, self.architecture))

    # ----------------------------------------------------------------- random numbers
    def _normal(self, *key: int, size: int | None = None):
        """Standard normal draws of this round's stream `key` (`_drawn`)."""
        return _drawn(self.w.seed, self.round, key, True, size)

    def _uniform(self, *key: int, size: int | None = None):
        """Uniform draws on [0, 1) of this round's stream `key` (`_drawn`)."""
        return _drawn(self.w.seed, self.round, key, False, size)

    def _draws(self, n: int) -> dict[str, np.ndarray]:
        """Round r's per-worker draws: worker i's depend on (seed, r, i's position, what) only."""
        size = max(n, 1)
        return {
            what: self._normal(10, j, size=size) if what in NORMAL else self._uniform(10, j, size=size)
            for j, what in enumerate(NORMAL + UNIFORM)
        }

    # ----------------------------------------------------------------- one planner call
    def plan_call(self, seconds: float = 0.3) -> tuple[float, float]:
        cold = self.now - self.plan_last > 600.0
        s = seconds * float(np.exp(0.2 * self._normal(1))) + (0.9 if cold else 0.0)
        self.plan_last = self.now + s
        return s, self._lambda(self.sizes.planner_memory_mb, s)

    # ----------------------------------------------------------------- one worker
    def _worker(
        self,
        i: int,
        z: dict[str, np.ndarray],
        mkn: tuple[int, int, int],
        cold: bool,
        miss: bool,
        tokens: float,
        limits: tuple,
    ) -> _Worker:
        wl, w = self.workload, self.w
        m, k, n = mkn
        compute_limit, task_timeout, common = limits
        timeout = float(self.sizes.worker_timeout_s)
        init = min(INIT_MAX, w.init_median_s * math.exp(w.init_sigma * z["init"][i]) * max(1.0, FULL_VCPU_MB / m))
        init = init if cold else 0.0
        link = w.link
        shard_mb = wl.dataset_bytes / 1e6 / n
        slow = (
            (w.straggler_slow[0] + (w.straggler_slow[1] - w.straggler_slow[0]) * z["slow"][i])
            if z["u_strag"][i] < w.straggler_p
            else 1.0
        )
        fault = self._fault(z["fault"][i])
        noise = common * math.exp(w.worker_sigma * z["noise"][i]) * slow
        start = (
            i * w.child_start_s * 2 * z["fan"][i]
            if self.sizes.fanout.kind(n) == "distributed"
            else 0.3 + i * w.inline_per_worker_s * (0.7 + 0.6 * z["fan"][i])
        )
        attempts, retry_s = 0, 0.0
        if fault == "throttle":  # 429, not billed by Lambda; Step Functions retries after 1 s (x2)
            attempts, retry_s = 1, 1.0 + z["fault_x"][i]
        # the model, then (a cache miss) the shards, from the bucket it has when its handler starts
        tokens = link.refill(tokens, start + retry_s + init)
        read_s, tokens = link.transfer(
            wl.model_mb + (shard_mb if miss else 0.0), tokens, math.exp(w.bw_sigma * z["bw_in"][i])
        )
        load = w.get_s + (w.get_s if miss else 0.0) + read_s
        if not wl.fits(m):
            t = WorkerTiming.model_construct(
                worker=i,
                memory_mb=m,
                samples=0,
                load_s=load,
                total_s=load + 0.5,
                cold=cold,
                init_s=init,
                start_s=start + retry_s,
                cache_miss=miss,
                error="OutOfMemory",
                steps=0,
                cut=False,
            )
            return _Worker(t, init + load + 0.5, start + retry_s + init + load + 0.5, attempts, tokens)
        speed = self.speed(m)
        step = self.step_s(m) * noise
        ev = 0.01 + (wl.val_rows / n) * wl.step_s_per_sample / 3 * w.cpu_factor / speed * noise
        before = load + ev
        steps = k
        if k > 0 and compute_limit is not None:
            stop_at = STOP_FRACTION * compute_limit
            steps = min(k, max(1, math.ceil((stop_at - before) / step)))
        cut = steps < k
        comp = steps * step
        tokens = link.refill(tokens, ev + comp)  # no transfer while it evaluates and trains
        up = 0.0
        if k:
            write_s, tokens = link.transfer(wl.model_mb, tokens, math.exp(w.bw_sigma * z["bw_out"][i]))
            up = w.put_s + write_s
        total = before + comp + up + 0.04 * math.exp(0.3 * z["rest"][i])
        if fault == "overrun":
            # A slow host or a slow read: the handler takes 2-5x as long, past the point where it
            # would have stopped itself. One draw, one slowdown, whatever the plan: a plan with a
            # Map task timeout loses the worker if the slowdown passes it (the Lambda runs on,
            # billed), a plan without one waits for it. (It was a slowdown without a limit and a
            # hang to the task timeout with one: the same fault cost smlt >= 10 s and the update
            # where it cost the oracle 2-5x a handler, and analytic.py already priced it as 3.5x.)
            total = (2.0 + 3.0 * float(z["fault_x"][i])) * total
        error = None
        billed = init + min(total, timeout)
        if init + total > task_timeout:  # Step Functions gives up; the Lambda runs on, billed
            error = "TimeLimit"
        if init + total > timeout:
            error = "TimeLimit"
        if fault == "duplicate":  # the handler runs twice; the second's update is rejected
            attempts += 1
            billed += min(total, timeout)
        seen = min(init + total, task_timeout)
        t = WorkerTiming.model_construct(
            worker=i,
            memory_mb=m,
            samples=steps * wl.batch if error is None else 0,
            load_s=load,
            eval_s=ev,
            compute_s=comp,
            upload_s=up,
            total_s=min(total, timeout),
            cold=cold,
            init_s=init,
            start_s=start + retry_s,
            cache_miss=miss,
            error=error,
            steps=steps,
            cut=cut,
        )
        return _Worker(t, billed, start + retry_s + seen, attempts, tokens)

    def _fault(self, u: float) -> str | None:
        if not self.faults:
            return None
        w = self.w
        for name, p in (("throttle", w.throttle_p), ("duplicate", w.duplicate_p), ("overrun", w.overrun_p)):
            if u < p:
                return name
            u -= p
        return None

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
        wl, w = self.workload, self.w
        timeout = float(self.sizes.worker_timeout_s)
        # the plan's limit as the controller applies it (smlt/runtime/steps/plan.py): the worker's compute
        # limit and the Map task's timeout (in whole seconds: TimeoutSecondsPath)
        compute_limit, task = round_limits(time_limit_s or None, first=self.round == 0)
        task_timeout = min(float(math.ceil(task)), timeout) if task else timeout
        plan_s, _ = plan if plan is not None else self.plan_call()  # its cost is in the round's bill
        t_start = self.now + plan_s + 3 * w.state_s
        z = self._draws(n)
        common = math.exp(w.round_sigma * float(self._normal(2)))

        pool = self._warm_pool(m, t_start, z)
        warm = min(n, len(pool))
        reshard = self.prev_n != n
        # a warm instance's bucket refilled while it idled; a new one starts full
        tokens = [
            w.link.refill(pool[i].tokens, t_start - pool[i].last_used) if i < warm else w.net_bucket_mb
            for i in range(n)
        ]
        workers = [
            self._worker(
                i, z, (m, k, n), i >= warm, i >= warm or reshard, tokens[i], (compute_limit, task_timeout, common)
            )
            for i in range(n)
        ]
        timings = [x.timing for x in workers]
        ends = [x.end_s for x in workers]
        used = [
            Instance(
                t_start + ends[i],
                pool[i].keepalive if i < warm else 300.0 + 600.0 * float(z["keep"][i]),
                workers[i].tokens,
            )
            for i in range(n)
        ]
        self.pools[m] = used + pool[warm:]
        self.prev_n = n
        distributed = self.sizes.fanout.kind(n) == "distributed"
        lo, hi = w.distributed_overhead_s
        map_run = lo + (hi - lo) * float(self._uniform(3)) if distributed else 0.0
        workers_end = max(ends) + map_run
        oks = [t for t in timings if t.error is None]
        agg_s = self._aggregate_s(len(oks), k, t_start + workers_end)
        attempts = sum(x.attempts for x in workers)
        self.last_bill = bill.price(
            bill.RoundShape(
                workers=n + attempts,
                worker_gb_s=sum(float(gb_seconds(m, x.billed_s)) for x in workers),
                planner_memory_mb=self.sizes.planner_memory_mb,
                aggregate_memory_mb=self.sizes.aggregate_memory_mb,
                plan_s=plan_s,
                aggregate_s=agg_s,
                reported=len(oks),
                aggregators=max(1, math.ceil(wl.model_mb / AGG_SLICE_MB)),
                eval_only=k == 0,
                shard_reads=sum(1 for t in timings if t.cache_miss),
                fanout=self.sizes.fanout,
            ),
            self.prices,
            self.architecture,
        )
        cost = float(self.last_bill.usd)
        acc, loss = self._metrics(self.acc)
        applied = k > 0 and oks and len(oks) >= quorum * n - 1e-9
        if applied:
            samples = sum(t.samples for t in oks)
            k_eff = samples / (len(oks) * wl.batch)
            self.acc = wl.curves.advance(self.acc, len(oks), k_eff, samples / w.curve_scale)
        round_s = plan_s + 3 * w.state_s + workers_end + agg_s + 2 * w.state_s
        self.now += round_s
        self.cost += cost
        rec = RoundRecord.model_construct(
            round=self.round,
            workers=n,
            memory_mb=m,
            local_steps=k,
            batch_size=wl.batch,
            workers_ok=len(oks),
            timings=timings,
            aggregate_s=agg_s,
            round_s=round_s,
            train_loss=self.loss(self.acc),
            val_loss=loss,
            val_accuracy=acc,
            cost_usd=cost,
            time_limit_s=time_limit_s,
        )
        self.round += 1
        return rec

    def _warm_pool(self, m: int, t_start: float, z: dict[str, np.ndarray]) -> list[Instance]:
        old = self.pools.get(m, [])
        recycle = z["recycle"]
        return [
            inst
            for j, inst in enumerate(old)
            if t_start - inst.last_used <= inst.keepalive and recycle[j % len(recycle)] > self.w.recycle_p
        ]

    def _aggregate_s(self, oks: int, k: int, t: float) -> float:
        """Sharded aggregation after the Map: each slice's function reads its part of every update
        through its network bucket (refilled since the last round's aggregation; full when cold),
        sums at 0.5 G elements/s, writes its slice; ~1 s cold start."""
        wl, w = self.workload, self.w
        shards = max(1, math.ceil(wl.model_mb / AGG_SLICE_MB))
        cold = t - self.agg_last > 600.0
        sl = wl.model_mb / shards
        tokens = w.net_bucket_mb if cold else w.link.refill(self.agg_tokens, t - self.agg_last)
        read_s, tokens = w.link.transfer(oks * sl, tokens)
        sum_s = oks * (wl.params / shards) / 5e8
        write_s = 0.0
        if k > 0:
            write_s, tokens = w.link.transfer(sl, w.link.refill(tokens, sum_s))
            write_s += w.put_s
        s = ((1.0 if cold else 0.0) + 0.2 + oks * w.get_s + read_s + sum_s + write_s) * math.exp(
            0.1 * float(self._normal(4))
        )
        self.agg_last = t + s
        self.agg_tokens = tokens
        return s

    def _metrics(self, acc: float) -> tuple[float, float]:
        """The round's metrics: of the model it started from, measured on the validation rows."""
        loss = self.loss(acc)
        if self.metric_noise:
            z = self._normal(5, size=2)
            v = self.workload.val_rows
            acc = float(np.clip(acc + z[0] * math.sqrt(max(acc * (1 - acc), 1e-4) / v), 0, 1))
            loss = float(loss * math.exp(0.01 * z[1]))
        return acc, loss

    def finalize(self) -> tuple[float, float]:
        """The last Plan's Choice and the Finalize state: the planner Lambda writes final/
        (copy + metrics); transitions Plan, ShouldTrain/Continue, Finalize, Done."""
        s = 1.0 * float(np.exp(0.2 * self._normal(6)))
        cost = float(bill.finalize_usd(self.prices, self.architecture, self.sizes.planner_memory_mb, s))
        self.now += s + 2 * self.w.state_s
        self.cost += cost
        return s, cost
