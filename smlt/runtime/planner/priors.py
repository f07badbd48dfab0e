"""What the planner believes before it has measured anything (round 0), and the shape of its models.

Every number here comes from shared/facts.md or from a measurement made in this repository
(bench/planner_calibrate.py -> smlt/sim/calibration.json). The online models start from these
and move to the measurements as rounds arrive; see docs/planner.md.
"""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime import capacity
from smlt.runtime.capacity import vcpus

# --- CPU ------------------------------------------------------------------------------------
# Lambda's vCPU share by memory and the worker's torch threads: smlt.runtime.capacity (one rule
# for the worker, the planner and the simulator).
speed = capacity.speed

# calibration.json "steps": one thread of this machine trains at ~50 GFLOP/s with ~0.3 ms of
# per-step overhead (batch 32, MLPs 26k-6M params and a small CNN). A Lambda vCPU (a hyperthread)
# is assumed 0.8 of that.
FLOPS_PER_VCPU = 0.8 * 4.96e10
STEP_OVERHEAD_S = 0.3e-3 / 0.8
# Two-thread speedups measured there grow with the work per step W (FLOPs): 0.7x at 5 MFLOP,
# 1.0x at 0.36 GFLOP, 1.27x at 1.2 GFLOP (MLP), 1.8x at 2 GFLOP (CNN). Prior for the parallel
# efficiency of extra vCPUs, with a wide spread (the online model learns it per run):
EFF_HALF_FLOPS = 1.5e9
EFF_PRIOR_SD = 0.3


def efficiency_prior(step_flops: float) -> float:
    return 0.85 * step_flops / (step_flops + EFF_HALF_FLOPS)


# Training FLOPs per sample when the job does not say: dense layers cost ~6 FLOPs per parameter
# per sample (forward 2, backward 4). Convolutional models cost far more per parameter, so the
# prior on the compute coefficient is wide when this guess is used.
FLOPS_PER_PARAM_GUESS = 6.0

# --- Storage and network --------------------------------------------------------------------
# facts.md (Skyrise, arXiv 2501.07771, measured on AWS): a function's network bursts to ~1.2 GiB/s
# for ~250 ms (a ~300 MiB bucket), then holds ~75 MiB/s, the same at every memory size. The
# planner's shape: a transfer's first NET_BURST_MB go at the burst rate, the rest at the sustained
# rate; an idle function (computing, or between rounds) gets its burst back at the sustained rate.
# The load and upload regressions (timing.py) start from these rates and learn the run's own.
NET_BURST_MB_PER_S = 1.2 * 1024**3 / 1e6  # 1,288 MB/s
NET_SUSTAINED_MB_PER_S = 75 * 1024**2 / 1e6  # 78.6 MB/s
NET_BURST_MB = 300 * 1024**2 / 1e6  # 315 MB at the burst rate from a full bucket
S3_GET_LATENCY_S = 0.03
S3_PUT_LATENCY_S = 0.05
# An aggregator is a function too: past its burst it reads the updates at the sustained rate.
AGG_MB_PER_S = NET_SUSTAINED_MB_PER_S
AGG_SHARD_MB = 64.0  # an aggregator shard handles this many MB of the model
# The planner's and the aggregator's memory and the worker timeout are deployment settings
# (smlt.runtime.config.FunctionSizes), not priors.


def net_split(mb, burst_mb=NET_BURST_MB):
    """A transfer of `mb` with `burst_mb` of burst left: (the MB at the burst rate, the MB at the
    sustained rate). Memory does not enter: a function's network is the same at every size."""
    mb = np.asarray(mb, dtype=float)
    fast = np.minimum(mb, np.maximum(np.asarray(burst_mb, dtype=float), 0.0))
    return fast, mb - fast


def burst_left(burst_mb, used_mb, idle_s):
    """The burst a function has after using `used_mb` of `burst_mb` and idling `idle_s` seconds."""
    left = np.asarray(burst_mb, dtype=float) - np.asarray(used_mb, dtype=float)
    return np.minimum(NET_BURST_MB, left + NET_SUSTAINED_MB_PER_S * np.maximum(np.asarray(idle_s, dtype=float), 0.0))


# --- Cold starts and orchestration ----------------------------------------------------------
# train_step is a container image with torch: a cold start imports torch and reads the image
# (log-normal). facts.md: importing torch takes 3.8-4.6 s of one core, the handler about 5 s; the
# median is the middle of the import alone (the handler's other imports come on top). Lambda
# bills the init phase; it is capped at 10 s. (It was 3 s: with it a ResNet-18's first two rounds
# looked 1.5 s shorter than they can be, and the first plan admitted a 14.5 s deadline.)
COLD_INIT_MEDIAN_S = 4.2
COLD_INIT_SIGMA = 0.35
COLD_INIT_MAX_S = 10.0


def cold_start_scale(memory_mb):
    """A cold start's seconds relative to one at a full vCPU: the import is CPU-bound (seconds of
    one core), so below 1,769 MB it takes 1 / (the vCPU share) as long, and no less above. (It was
    the square root: at 1,024 MB a cold start looked 1.31x where it takes 1.73x, and the digits
    jobs that moved to a cold 1,024 MB tier in round 1 ran out of deadline.)"""
    return 1.0 / np.minimum(1.0, vcpus(memory_mb))


WARM_IDLE_S = 300.0  # an idle instance is kept at least ~5 minutes
# The Map's own seconds are the deployed configuration's (smlt.runtime.fanout, cdk.json `fanout`).
ROUND_BASE_OVERHEAD_S = 1.0  # Plan + Choices + Aggregate invoke + Continue
PLAN_S = 0.4
FINALIZE_S = 1.5

# --- Memory need ----------------------------------------------------------------------------
# The worker's own rule (smlt.runtime.capacity.memory_needed_mb): candidates.tiers_usable applies it.

# --- Progress -------------------------------------------------------------------------------
# Fitted on measured local-SGD curves (calibration.json "fit"): the effective momentum of a
# round that starts from a fresh optimizer was 0.735 (digits) and 0.83 (synthetic) for mu = 0.9.
MOMENTUM_EFFECTIVE_RATIO = 0.87
# Critical-batch ratio beta = B_noise / b at b = 32: measured 0.33 (digits, 1.4k rows) and 0.67
# (synthetic, 16k rows); McCandlish et al. (2018) report critical batches of hundreds to thousands
# for CIFAR/ImageNet-scale training (beta ~ 10-100). The prior median follows a power law in the
# dataset size through those anchors, 0.3 * (rows / 1000) ** 0.65 (0.4 at 1.4k rows, 4 at 50k,
# 30 at 1.3M), with a wide spread; the curve refines it when n varies.
BETA_GRID = np.array([0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
BETA_PRIOR_SD_LOG = math.log(4.0)


def beta_prior_median(train_rows: int) -> float:
    return float(np.clip(0.3 * (max(train_rows, 1) / 1000.0) ** 0.65, 0.25, 64.0))


# Drift K: the local steps after which a round's steps stop adding up (h(k) = 1 / (1 + (k-1)/K)).
# No drift was measurable up to k = 50 on digits (calibration.json), but on the recorded curves
# (smlt/sim/curves, replayed beyond their grid) a round of 800 steps is worth ~3x one of 20 on
# ResNet-18 and the transformer (K ~ 40) and ~25x on the digits CNN (K ~ 1,500): K is learned per
# run over this grid, from a prior wide enough for both (a large k is discounted once measured).
# Median 10,000 (no drift until the run shows it): calibrated alone (bench/progress_calibration.py
# --loo) 300 gave the best intervals, but in the decision loop a prior that discounts large k
# before the run has tried it makes the short jobs (digits on 8x the rows: 4 rounds of 500 steps)
# plan timid first rounds, and the step bound (PlannerConfig.step_up_x) already keeps k from jumping past
# what was measured. Tuning seeds 5-7, deadline met of 138 (docs/planner.md Model 2): 300 -> 48,
# 3,000 -> 76, 10,000 -> 83, with the epochs prior below. The price: K moves slowly (14 rounds
# alternating 20 and 200 steps that bought 2.4x take it to ~3,000).
DRIFT_K_GRID = np.array([10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0])
DRIFT_K_PRIOR_MEDIAN = 10000.0
DRIFT_K_PRIOR_SD_LOG = math.log(4.0)
# Steady steps (tau) to the target, in epochs (tau * batch / rows): 1.2 (digits, acc 0.93) and
# 1.8 (synthetic, acc 0.80) measured; bigger models on harder data need more. Median 2, spread x4:
# leave-one-workload-out on the recorded curves chose 4 and x2 (round-0 intervals held the truth
# 85 % of the time; x4: 98 %, too wide), but in the loop that prior called the short jobs out of
# reach at round 0 (best effort) where the wide one finds them feasible at its p20 and plans the
# fastest affordable round (digits MLP x8: 11 of 24 met vs 4 of 24, same seeds).
EPOCHS_TO_TARGET_MEDIAN = 2.0
EPOCHS_TO_TARGET_SD_LOG = math.log(4.0)
# Curve shape exponent p of the stretched exponential: 0.76 (digits), 0.39-0.47 (synthetic).
# p > 1 is a slow start, then a jump (ResNet-18 and the transformer recorded here).
P_GRID = np.array([0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.2, 1.6, 2.4])
# The fitted family's remaining tau is off by a log-normal factor of this sd: on the recorded
# curves its 80 % interval without it covered 35 % (bench/progress_calibration.py); chosen
# leave-one-workload-out (every held-out workload chose 0.8 of 0.3 / 0.5 / 0.8).
FORECAST_SD_LOG = 0.8
# A plateau below the target may end (the recorded ones that did lasted 0.3-3.6 epochs): the
# fitted family's P(out of reach) is trusted only with 1 - exp(-flat epochs / this).
PLATEAU_ESCAPE_EPOCHS = 1.5
