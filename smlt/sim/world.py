"""The simulated platform's constants, drawn per scenario from ranges around ../shared/facts.md.

Independent of the planner's priors (smlt/runtime/planner/priors.py, smlt/runtime/fanout.py's defaults): each
scenario-seed draws its own world, so a planner tuned to one set of constants meets others.
Two kinds of world:

- calm: the ranges below, 2 % stragglers.
- noisy: 4x the timing noise, 10 % stragglers, cold starts 1.5-2x slower.

Faults are injected at the rates of the fault tests (smlt/faults.py's documented spec,
tests/e2e: duplicate 0.05, throttle 0.05, timeout 0.02): a throttled invocation is retried by
Step Functions after its backoff (1 s, x2), a duplicated one runs the handler twice (both billed,
the second's update rejected by the conditional write), and an overrun slows a worker's handler
2-5x (a slow host, a slow read) for every plan alike: where that passes the Map task's timeout,
Step Functions gives up on it (its update is lost) and its Lambda runs on, billed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from smlt.sim.network import GIB, MIB, Link

Kind = Literal["calm", "noisy"]
KINDS: tuple[Kind, ...] = ("calm", "noisy")

# Multi-thread speed-up per extra thread, by model family (only one thread was measured here):
# a tiny MLP gains nothing from more threads, convolutions most.
EFFICIENCY = {"mlp": (0.0, 0.15), "cnn": (0.1, 0.4), "transformer": (0.3, 0.6), "resnet": (0.5, 0.8)}


@dataclass(frozen=True)
class World:
    kind: Kind
    seed: int
    cpu_factor: float  # a Lambda vCPU's step time / this machine's thread's (measured one thread)
    efficiency: float  # speed-up per extra torch thread beyond the first
    # A function's network, the same at every memory size (smlt.sim.network; facts: bursts to
    # ~1.2 GiB/s for ~250 ms, a ~300 MiB bucket, then ~75 MiB/s)
    net_burst_mbps: float
    net_sustained_mbps: float
    net_bucket_mb: float
    get_s: float  # S3 GET latency
    put_s: float  # S3 PUT latency
    init_median_s: float  # torch container cold start (facts: torch import 3.8-4.6 s, handler ~5 s)
    init_sigma: float
    inline_per_worker_s: float  # inline Map start stagger (SMLT: 100 workers in 20.6 s)
    distributed_overhead_s: tuple[float, float]  # Map Run start-up range (facts: 2-7 s)
    child_start_s: float  # Distributed Map per-child start
    straggler_p: float
    straggler_slow: tuple[float, float]
    worker_sigma: float  # per-worker timing noise (log-normal)
    round_sigma: float  # per-round common timing noise
    bw_sigma: float
    curve_scale: float  # this seed's run-to-run variation of the samples a curve needs
    throttle_p: float = 0.05
    duplicate_p: float = 0.05
    overrun_p: float = 0.02
    state_s: float = 0.05  # Step Functions latency per state on the critical path
    keepalive_s: tuple[float, float] = (300.0, 900.0)  # idle Lambda instances live this long
    recycle_p: float = 0.02  # a warm instance is recycled anyway

    @property
    def link(self) -> Link:
        """Every function's network in this world (workers and aggregators alike)."""
        return Link(self.net_burst_mbps, self.net_sustained_mbps, self.net_bucket_mb)

    @staticmethod
    def draw(seed: int, kind: Kind = "calm", family: str = "mlp") -> World:
        if kind not in KINDS:
            raise ValueError(f"world kind must be one of {', '.join(KINDS)}, got {kind!r}")
        rng = np.random.default_rng([seed, 77_001])
        noisy = kind == "noisy"
        u = rng.uniform
        init = u(2.5, 5.0) * (u(1.5, 2.0) if noisy else 1.0)
        lo = u(1.5, 3.0)
        world = World(
            kind=kind,
            seed=seed,
            cpu_factor=u(1.1, 1.6),
            efficiency=u(*EFFICIENCY.get(family, (0.2, 0.6))),
            net_sustained_mbps=u(55.0, 95.0) * MIB,
            net_burst_mbps=0.0,
            net_bucket_mb=0.0,
            get_s=u(0.02, 0.05),
            put_s=u(0.03, 0.08),
            init_median_s=init,
            init_sigma=u(0.2, 0.4),
            inline_per_worker_s=u(0.1, 0.3),
            distributed_overhead_s=(u(1.5, 3.0), u(5.0, 8.0)),
            child_start_s=u(0.005, 0.02),
            straggler_p=0.10 if noisy else 0.02,
            straggler_slow=(lo, lo + u(0.5, 2.0)),
            worker_sigma=(4.0 if noisy else 1.0) * u(0.04, 0.08),
            round_sigma=(4.0 if noisy else 1.0) * u(0.02, 0.05),
            bw_sigma=(2.0 if noisy else 1.0) * 0.15,
            curve_scale=float(np.exp(0.08 * rng.standard_normal())),
        )
        # drawn last, so the constants drawn before them stay what they were for each seed
        return replace(world, net_burst_mbps=u(0.9, 1.5) * GIB, net_bucket_mb=u(200.0, 400.0) * MIB)
