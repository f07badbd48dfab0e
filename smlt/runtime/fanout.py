"""The Maps that fan a round out (its workers; its aggregators, `plan_slices`), and what the
workers' Map costs in time, transitions and history.

The rule (docs/architecture.md, "The round's Map"): an inline Map for n <= `inline_max_workers`
(AWS recommends it below 40 items and runs at most 40 iterations at once), a Distributed Map of
Standard child executions above it. Standard children, not Express: a worker may run up to the
15-minute Lambda limit and an Express child is cut at 5 minutes; Standard's exactly-once
transitions also keep the conditional writes' reasoning simple.

The planner chooses the kind (`PlanTrain.fanout`), the state machine's `HowToTrain` choice
follows it, and the ledger, the planner's forecast and the simulators count it here. The
latencies are priors with their sources (`../shared/facts.md`); a user who measures their own
account puts the measured values in cdk.json's `fanout`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["inline", "distributed"]
INLINE_MAX = 40  # Step Functions runs at most 40 inline Map iterations at once
# A table uploaded in parts (smlt.runtime.steps.prepare_parts): children of its Maps run at once,
# each a Prepare function (2 GB): 100 of them is 200 GB of Lambda memory, within a new account's
# 1,000 concurrent executions beside a round's workers.
PARTS_MAX_CONCURRENCY = 100

# Transitions per worker. Inline: its one Task state in the parent. Distributed: the child
# execution's start (billed per child) plus its Task and its end (Standard children).
INLINE_TRANSITIONS_PER_WORKER = 1
DISTRIBUTED_TRANSITIONS_PER_WORKER = 3
# History events per worker in the parent execution. Inline: MapIterationStarted,
# TaskStateEntered, TaskScheduled, TaskStarted, TaskSucceeded, TaskStateExited,
# MapIterationSucceeded, and one for a retry. Distributed: none (children have their own
# history; the parent records MapRunStarted/Succeeded, counted in the round's constant part).
INLINE_EVENTS_PER_WORKER = 8


class Fanout(BaseModel):
    """cdk.json's `fanout`: where the rule switches and the Map's start-up latency priors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inline_max_workers: int = Field(INLINE_MAX, ge=0, le=INLINE_MAX)
    # SMLT (2021) measured 100 workers launched in 20.6 s through an inline Map.
    inline_per_worker_s: float = Field(0.206, ge=0)
    # One published figure (re:Post): a 100-item no-op Distributed Map took 7+ s from MapRunStarted
    # to MapRunSucceeded, its children done within the first second: a fixed overhead, mostly
    # at the end (the parent learning the run finished). Range 2-7 s; per child ~0.01 s.
    distributed_overhead_s: float = Field(6.0, ge=0)
    distributed_per_worker_s: float = Field(0.01, ge=0)

    def kind(self, workers: int) -> Kind:
        return "inline" if workers <= self.inline_max_workers else "distributed"

    def is_inline(self, workers: Any) -> Any:
        """kind == "inline", on numbers or numpy arrays (the planner's candidates)."""
        return np.asarray(workers, dtype=float) <= self.inline_max_workers

    def overhead_s(self, workers: Any) -> Any:
        """The Map's own seconds in a round beyond its slowest worker (the prior): the inline
        Map's staggered starts, the Distributed Map's fixed overhead and per-child starts."""
        n = np.asarray(workers, dtype=float)
        inline = (n - 1).clip(min=0) * self.inline_per_worker_s
        distributed = self.distributed_overhead_s + n * self.distributed_per_worker_s
        return np.where(self.is_inline(n), inline, distributed)

    def transitions(self, workers: Any) -> Any:
        n = np.asarray(workers, dtype=float)
        per = np.where(self.is_inline(n), INLINE_TRANSITIONS_PER_WORKER, DISTRIBUTED_TRANSITIONS_PER_WORKER)
        return per * n

    def history_events(self, workers: Any) -> Any:
        """The workers' events in the parent execution's history (25,000 at most)."""
        n = np.asarray(workers, dtype=float)
        return np.where(self.is_inline(n), INLINE_EVENTS_PER_WORKER * n, 0.0)


# --------------------------------------------------------------------------- the aggregation's fan-out


def plan_slices(
    param_bytes: int,
    n_workers: int,
    *,
    read_bytes_per_aggregator: int = 256 << 20,
    min_slice_bytes: int = 4 << 20,
    max_aggregators: int = INLINE_MAX,
) -> int:
    """How many aggregators to use for n_workers updates of param_bytes each.

    Each aggregator reads n_workers * param_bytes / k bytes. k is the smallest count that keeps
    that under `read_bytes_per_aggregator` (about 3-4 s at the ~70-100 MB/s one Lambda gets from
    S3, and far below a 3 GB aggregator's memory), so the aggregation time stays flat as workers
    grow; slices stay at least `min_slice_bytes` (below that, request latency dominates) and
    k at most `max_aggregators` (the slices' inline Map runs at most INLINE_MAX at once). 1
    means the single aggregator.
    """
    if param_bytes <= 0 or n_workers <= 0:
        return 1
    k = math.ceil(n_workers * param_bytes / read_bytes_per_aggregator)
    k = min(k, max(1, param_bytes // min_slice_bytes), max_aggregators)
    return max(1, int(k))
