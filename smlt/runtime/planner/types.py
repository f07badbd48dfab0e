"""What the planner reads (the run's history) and what it decides."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field


class WorkerTiming(BaseModel):
    """One worker's measured round, as recorded in DynamoDB (WORKER# item)."""

    worker: int
    memory_mb: int
    samples: int
    load_s: float = 0.0  # global model + shards from the store (cache hits are fast)
    eval_s: float = 0.0  # evaluation of the incoming model on the validation slice
    compute_s: float = 0.0  # k local steps
    upload_s: float = 0.0  # writing the update
    total_s: float = 0.0  # the whole handler (what Lambda bills)
    cold: bool = False  # first invocation of a fresh process/instance
    # Extensions (optional; older records parse with the defaults):
    init_s: float = 0.0  # cold-start init duration (billed since 2025; 0 when warm)
    start_s: float = 0.0  # invoke delay: from the Map's start to the handler's start
    cache_miss: bool = False  # the worker's shards were read from S3, not the /tmp cache
    error: str | None = None  # e.g. "OutOfMemory", "TimeLimit"; None when the update arrived
    steps: int = 0  # local steps actually taken (0: unknown, older records)
    cut: bool = False  # stopped early at the compute limit; its samples and steps are what it did

    @property
    def held(self) -> bool:
        """It ran to the plan's limit: stopped early at its compute limit, or cut off."""
        return self.cut or self.error == "TimeLimit"

    def steps_done(self, planned: int, batch: int) -> int:
        """The local steps this worker actually took: as recorded; in older records (steps 0)
        from the samples it trained; without those, the plan's."""
        if self.steps > 0:
            return self.steps
        if self.samples > 0 and batch > 0:
            return max(1, math.ceil(self.samples / batch))
        return planned


class RoundRecord(BaseModel):
    """One aggregated round (ROUND# item) with its plan and the workers that reported."""

    round: int
    workers: int  # n planned
    memory_mb: int
    local_steps: int
    batch_size: int
    workers_ok: int = 0
    timings: list[WorkerTiming] = Field(default_factory=list)
    aggregate_s: float = 0.0
    round_s: float = 0.0  # wall time from plan to aggregated
    train_loss: float | None = None
    val_loss: float | None = None  # of the model the round started from
    val_accuracy: float | None = None
    # the mean of the classes' recalls; None also when a worker sent no per-class sums
    val_balanced_accuracy: float | None = None
    val_rmse: float | None = None  # regression, in the user's units
    val_r2: float | None = None
    cost_usd: float = 0.0  # everything billed for this round
    # Extensions (optional):
    time_limit_s: float | None = None  # the straggler limit the plan set

    def steps_applied(self) -> float:
        """Mean local steps of the updates this round applied (the workers that reported, cut
        ones with the steps they took); the plan's steps for a record without timings."""
        done = [t.steps_done(self.local_steps, self.batch_size) for t in self.timings if t.error is None]
        return float(sum(done) / len(done)) if done else float(self.local_steps)

    @property
    def cut(self) -> bool:
        """A worker of this round stopped early at the plan's compute limit (or was cut off)."""
        return any(t.held for t in self.timings)


class RunHistory(BaseModel):
    rounds: list[RoundRecord] = Field(default_factory=list)
    elapsed_s: float = 0.0  # since the run started
    cost_total_usd: float = 0.0  # the ledger so far (plans, rounds, aggregation)
    param_count: int = 0  # model size, drives communication time
    train_rows: int = 0  # dataset size
    # Extensions (optional; 0/None = unknown, the planner falls back to priors):
    val_rows: int = 0  # validation split size (evaluation time, metric noise)
    # Validation rows per class (the manifest's validation.class_counts; None: unknown): the noise
    # of balanced accuracy, whose rare classes' recalls are measured on few rows (`noise_rows`).
    val_class_rows: list[int] | None = None
    dataset_bytes: int = 0  # prepared training shards in bytes (first-load time)
    flops_per_sample: float | None = None  # training FLOPs per sample if measured (else ~6 x params)
    shard_bytes: int = 0  # the largest dataset shard (a worker holds ~3 at once)
    activation_mb: float | None = None  # a batch's activations, as the workers measured them


# The decision rule that made a Decision, one name per rule (the reason says the same in words;
# tests and readers of the PLAN items match on this, never on the prose):
Rule = Literal[
    "feasible",  # adaptive: a plan that meets the constraints (at the safest level that fits)
    "best_effort",  # adaptive: nothing fits, the plan that buys the most progress within the guards
    "fixed",  # the fixed planner's plan (the job's n, m, k)
    "last_look",  # before a budget stop: an evaluation-only round of the newest model
    "final_evaluation",  # the controller's evaluation-only round after a stop (smlt.runtime.steps.plan)
    "target_reached",  # the last round's model reached the target
    "max_rounds",  # max_rounds rounds trained
    "work_done",  # no target: the progress of max_rounds planned rounds has been made
    "budget_guard",  # the money left cannot pay one more round's worst case plus finalisation
    "deadline",  # no round (and its evaluation) fits before the deadline
    "infeasible",  # round 0: the job is refused, even the optimistic forecast misses
    "give_up",  # mid-run: the run stalled and the target is out of reach ("stopping to save the budget")
    "stopped",  # a stop request: the dashboard's button, a study's early stop
]
# What shaped a train plan besides its rule (several may hold):
Note = Literal[
    "averaging_stalled",  # n capped at workers.min: models averaged from more workers stalled
    "speed_one_worker",  # n capped at workers.min: the speed objective does not count on averaging
    "short_round",  # the shorter-round probe: k / short_round_x steps instead of the plan's k
]


class Decision(BaseModel):
    action: Literal["train", "stop"]
    workers: int = 0
    memory_mb: int = 0
    local_steps: int = 0
    reason: str = ""
    # The constraint that bound the choice: "deadline", "budget", "target", "max_rounds", "none",
    # or "stopped" (a stop request: the dashboard's button, a study's early stop).
    bound: str = "none"
    rule: Rule | None = None  # None: a decision made outside the planner's rules (the simulator's baselines)
    notes: list[Note] = Field(default_factory=list)
    predicted_round_s: float | None = None
    predicted_round_cost_usd: float | None = None
    predicted_rounds_left: float | None = None
    # Straggler limit for workers of this round (seconds); None = function timeout.
    worker_time_limit_s: float | None = None
    infeasible: bool = False
    # Extensions (optional):
    predicted_total_s: float | None = None  # rest of the run (to the target) at this plan
    predicted_total_cost_usd: float | None = None
    # The same forecast at the 70th percentile of the rounds needed (the ETA's band).
    predicted_rounds_left_p70: float | None = None
    predicted_total_s_p70: float | None = None
    predicted_total_cost_usd_p70: float | None = None
    earliest_deadline_s: float | None = None  # set when infeasible: the earliest deadline that works
    min_budget_usd: float | None = None  # set when infeasible: the smallest budget that works
    explore: bool = False  # chosen partly to learn (uncertain model)

    @property
    def evaluates_first(self) -> bool:
        """A stop whose newest model is measured on the whole validation split before Finalize (an
        evaluation-only round): a stop bound by rounds, time, the target or a request, not by the
        budget (no money left for a round). The deployed Plan step and the simulator both ask here."""
        return self.bound in ("max_rounds", "deadline", "target", "stopped")


def noise_rows(metric: str, val_rows: int, class_rows: list[int] | None = None) -> float:
    """The rows whose binomial noise a proportion metric has: `val_rows` for val_accuracy. For
    val_balanced_accuracy, the mean of k recalls r_c measured on n_c rows each, the variance is
    (1/k^2) sum_c r_c (1 - r_c) / n_c, so with equal recalls the rows are k^2 / sum_c 1/n_c (k
    times the harmonic mean of n_c): val_rows for equal classes, far fewer when a class is rare.
    Unknown class rows: val_rows, the equal-classes case (a lower bound of the noise)."""
    present = [n for n in class_rows or [] if n > 0]
    if metric != "val_balanced_accuracy" or not present:
        return float(max(val_rows, 1))
    return len(present) ** 2 / sum(1.0 / n for n in present)
