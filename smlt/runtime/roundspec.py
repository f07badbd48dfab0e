"""The round spec: what the planner decided for a round, as the workers and aggregators read it
(the `spec` of the round's PLAN item in DynamoDB)."""

from __future__ import annotations

from pydantic import BaseModel

from smlt.runtime.job import Job


class RoundSpec(BaseModel):
    run_id: str
    round: int
    workers: int
    memory_mb: int
    local_steps: int  # 0 = evaluation only (the final model's measurement)
    function_name: str
    planned_at: float  # epoch seconds
    time_limit_s: float | None = None  # a worker finishing later than this is a straggler
    # The planner's own limit on a worker's handler time; the worker stops its steps in time.
    compute_limit_s: float | None = None
    learning_rate: float
    reason: str = ""
    # Train shards per worker; None = round-robin (shard_slice). The planner adds the shards of
    # workers lost last round to the survivors' lists.
    assignments: list[list[int]] | None = None
    # Validation shards per worker (a partition: each row evaluated once); None = round-robin.
    # The planner moves a validation shard a worker failed on to another worker.
    val_assignments: list[list[int]] | None = None
    # How many aggregators reduce this round's updates (sharded aggregation when > 1).
    aggregators: int = 1
    # Rows of the whole validation split (META's val_rows): the round's metric is final only when
    # its workers evaluated all of them. None in specs written before it (taken as whole).
    val_rows: int | None = None
    job: Job

    @property
    def eval_only(self) -> bool:
        return self.local_steps == 0

    def train_shards(self, worker: int, n_shards: int) -> list[int]:
        """The train shards `worker` owns this round (the planner's assignment, else round-robin)."""
        return self.assignments[worker] if self.assignments else shard_slice(n_shards, self.workers, worker)

    def val_shards(self, worker: int, n_shards: int) -> list[int]:
        """The validation shards `worker` evaluates: the planner's assignment, else round-robin;
        with more workers than shards, only the first owner of a shard evaluates it (each row is
        counted once)."""
        if self.val_assignments:
            return self.val_assignments[worker]
        return val_slice(n_shards, self.workers, worker)

    def whole_split(self, val_rows: int) -> bool:
        """`val_rows` evaluated rows cover the whole validation split."""
        return self.val_rows is None or val_rows >= self.val_rows


def shard_slice(n_shards: int, workers: int, worker: int) -> list[int]:
    """Shards a worker owns: round-robin; with more workers than shards, workers share a shard."""
    if workers <= n_shards:
        return list(range(worker, n_shards, workers))
    return [worker % n_shards]


def val_slice(n_shards: int, workers: int, worker: int) -> list[int]:
    """Validation shards a worker evaluates by default: round-robin, no shard twice."""
    return [] if worker >= n_shards else shard_slice(n_shards, workers, worker)


# Lambda caps a function's init phase (its cold start) at 10 s, and a round's limits count from
# the handler's start: a round that starts cold allows for it on top of the planner's limit.
INIT_MAX_S = 10.0
# An init past the cap is retried in the first invocation (AWS, "Lambda execution environment
# lifecycle"), so a cold worker may start 10 s + its init late. Locally the cold start is a real
# torch import, uncapped: two runs on a loaded 2-core CI machine took 10 s for round 0's cold
# 5-step MLP round, near its 13.5 s task timeout (tests/e2e/test_crash_resume.py failed on CI
# with a model that differs, as one abandoned worker would make it).
COLD_START_ALLOWANCE_S = 2 * INIT_MAX_S
MIN_TASK_TIMEOUT_S = 10.0  # a Map task timeout tighter than this only loses updates


def round_limits(
    limit_s: float | None, *, waves: int = 1, first: bool = False, resumed: bool = False
) -> tuple[float | None, float | None]:
    """The planner's worker limit as a round applies it: (the worker's compute limit, the Map
    task's timeout; None for none). The controller (smlt/runtime/steps/plan.py) and the benchmark's
    world (smlt/sim) both take them from here.

    - A resumed run's first round has neither: its cold starts are of a run the timings no longer
      describe (fresh handler processes, or functions idle since the run stopped).
    - Round 0 keeps the planner's probe as the compute limit (a wrong prior costs at most that),
      and its task allows the cold start on top (`COLD_START_ALLOWANCE_S`), so a hung worker costs
      a bounded wait, not the function's timeout.
    - A worker may wait `waves` times for earlier handlers before it starts (the local engine
      runs a few at a time and its task timer starts when the invocation is queued)."""
    if limit_s is None or resumed:
        return None, None
    task = limit_s * max(waves, 1) + (COLD_START_ALLOWANCE_S if first else 0.0)
    return limit_s, max(task, MIN_TASK_TIMEOUT_S)
