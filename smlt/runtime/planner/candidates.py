"""The adaptive planner's candidate plans: every (n workers, m MB, k local steps) the job allows,
and which of them the next round may use (the bounded step, the stall caps, held dimensions).
numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smlt.runtime.capacity import memory_needed_mb, shard_bytes_held
from smlt.runtime.job import Job
from smlt.runtime.planner.config import active as cfg
from smlt.runtime.planner.stall import stalled_averaging
from smlt.runtime.planner.types import RunHistory


def tiers_usable(job: Job, history: RunHistory, tiers: list[int]) -> list[int]:
    tiers = sorted(set(int(t) for t in tiers))
    if job.workers.memory_mb:
        return [job.workers.memory_mb]
    oom = [t.memory_mb for r in history.rounds for t in r.timings if t.error and "memory" in t.error.lower()]
    floor = max(oom) if oom else 0
    # The worker's own ModelTooLarge rule, with what the run knows (the activations once measured)
    need = memory_needed_mb(
        history.param_count or 0,
        data_bytes=shard_bytes_held(history.shard_bytes),
        activation_mb=history.activation_mb or 0.0,
    )
    ok = [t for t in tiers if t > floor and t >= need]
    if not ok:
        ok = [t for t in tiers if t > floor] or [max(tiers)]
        ok = ok[-1:]
    return ok


@dataclass
class Candidates:
    n: np.ndarray
    m: np.ndarray
    k: np.ndarray
    reach: np.ndarray  # within step_reach: the plans the next round may use (the rest inform admission)
    averaging_stalled: bool = False  # n capped at one: models averaged from n > 1 workers stalled
    speed_one_worker: bool = False  # n capped at one: the speed objective (`speed_trains_one_worker`)


@dataclass(frozen=True)
class Hold:
    """Dimensions of the plan held fixed (the ablations of smlt.sim.ablations); None: chosen."""

    workers: int | None = None
    memory_mb: int | None = None
    local_steps: int | None = None


def step_reach(job: Job, history: RunHistory) -> tuple[int, int]:
    """The largest n and k the planner may try next: step_up_x times the largest tried so far (the
    workers that reported; the steps they actually took, a cut round counts what it did), at least
    the job's initial workers and local steps; in round 0 of a cost-objective job, k up to
    first_steps_up_x times the job's."""
    n_seen, k_seen = job.workers.initial, job.training.local_steps
    for r in history.rounds:
        done = [t.steps_done(r.local_steps, r.batch_size) for t in r.timings if t.error is None]
        if r.local_steps > 0 and done:
            n_seen, k_seen = max(n_seen, len(done)), max(k_seen, max(done))
    if not history.rounds and job.constraints.objective == "cost":
        return cfg().step_up_x * n_seen, cfg().first_steps_up_x * k_seen
    return cfg().step_up_x * n_seen, cfg().step_up_x * k_seen


def speed_trains_one_worker(job: Job, hold: Hold) -> bool:
    """The speed objective trains on one worker (`workers.min` if higher) from round 0: it
    presumes the stall that caps the cost objective's n (`stalled_averaging`). A speed run spends
    its budget, so n workers' n-fold round (and n-fold worst case, which the hard guard reserves)
    is paid for with a slower tier or a shorter run, for a gain the model credits from its
    averaging prior, which the run learns little about; on the recorded curves n > 1 plateaus
    below one worker's level. Measured: docs/planner.md, "The decision rule", the speed objective.
    Not when a dimension is held: an ablation (`workers_only`) chooses n itself."""
    return job.constraints.objective == "speed" and hold == Hold()


def candidates(
    job: Job, history: RunHistory, tiers: list[int], hold: Hold | None = None, val_rows: int | None = None
) -> Candidates:
    w, hold = job.workers, hold or Hold()
    n_max, k_max = step_reach(job, history)
    averaging_stalled = val_rows is not None and hold.workers is None and stalled_averaging(job, history, val_rows)
    speed_one_worker = speed_trains_one_worker(job, hold)
    if averaging_stalled or speed_one_worker:
        # Averaged workers' models stalled below the target, or the speed objective presumes they
        # would: more of them will not get past it (on the recorded ResNet-18 / transformer curves
        # n > 1 plateaus below one worker's level).
        n_max = max(1, w.min)
    ns = sorted({x for x in cfg().n_set if w.min <= x <= w.max} | {w.min, w.max, min(w.max, n_max), w.initial})
    ks = sorted(set(cfg().k_set) | {job.training.local_steps})
    ms = tiers_usable(job, history, tiers)
    if hold.workers is not None:
        ns = [hold.workers]
    if hold.local_steps is not None:
        ks = [hold.local_steps]
    if hold.memory_mb is not None:
        # a held tier that ran out of memory gives way to the next usable one
        ms = [hold.memory_mb] if hold.memory_mb in ms else ms[:1]
    N, M, K = np.meshgrid(np.array(ns, float), np.array(ms, float), np.array(ks, float), indexing="ij")
    n, m, k = N.ravel(), M.ravel(), K.ravel()
    # The step bound limits what the next round tries, not what the job could reach later: admission
    # and giving up judge every plan (a job that needs k = 500 is feasible even if round 0 tries 80).
    reach = (hold.workers is not None) | (n <= n_max) | ((n == w.initial) & (w.initial <= n_max))
    reach &= (hold.local_steps is not None) | (k <= k_max) | (k == job.training.local_steps)
    return Candidates(n, m, k, reach, averaging_stalled, speed_one_worker and not averaging_stalled)
