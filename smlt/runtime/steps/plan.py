"""Plan: the first state of a round (planner Lambda, op "plan"), and Chain.

Round 0 validates the job and writes the run's META; every round reads the timings and metrics of
the rounds so far, asks the planner (`smlt.runtime.planner.decide`) for workers, memory tier and local
steps, assigns the train shards (with last round's lost shards), chooses the aggregators, and
writes the PLAN item. Chain hands a long run over to a fresh execution.

`plan_next` is idempotent: the round number comes from what DynamoDB says is aggregated, and the
PLAN item is written once; a repeated call returns the stored plan.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from itertools import takewhile
from typing import Any

from botocore.exceptions import ClientError

from smlt.runtime import account, clients, keys, warmstart
from smlt.runtime.config import Settings
from smlt.runtime.data.shards import load_manifest, manifest_sha256
from smlt.runtime.errors import (
    AccessDenied,
    AlreadyFinished,
    ChainedExecutionFailed,
    ConcurrencyLimit,
    DataError,
    Infeasible,
    InvalidJob,
    RunInProgress,
)
from smlt.runtime.fanout import Fanout, plan_slices
from smlt.runtime.items import MetaItem, PlanItem, RoundItem, StopItem
from smlt.runtime.job import Job, check_dataset, parse_job
from smlt.runtime.planner import decide
from smlt.runtime.planner.footprint import ModelCost, model_cost
from smlt.runtime.planner.types import Decision, RoundRecord, RunHistory
from smlt.runtime.records import RunTable
from smlt.runtime.roundspec import RoundSpec, round_limits, shard_slice, val_slice
from smlt.runtime.steps.events import ChainAnswer, ChainEvent, PlanAnswer, PlanEvent, PlanOther, PlanTrain
from smlt.runtime.store import S3Store
from smlt.runtime.store.s3 import DATA_BUCKETS_DOC, bucket_region
from smlt.runtime.trigger import job_from_trigger
from smlt.runtime.usercode import check_code_location


def _check_resources(job: Job, settings: Settings) -> dict[str, Any]:
    """Everything that can be checked before the first write. Raises a named error."""
    tiers = sorted(settings.train_functions)
    if job.workers.memory_mb is not None and job.workers.memory_mb not in tiers:
        raise InvalidJob(
            f"workers.memory_mb: {job.workers.memory_mb} is not a deployed memory tier "
            f"(deployed: {', '.join(map(str, tiers))})"
        )
    manifest = load_manifest(job.dataset.uri)
    check_dataset(job, manifest)
    if job.warm_start:
        try:
            bucket, key = keys.parse_s3_uri(job.warm_start)
        except ValueError as e:
            raise InvalidJob(f"warm_start: {e}") from None
        if not S3Store(bucket).exists(key):
            raise InvalidJob(f"warm_start: no model at {job.warm_start}")
    return {
        "train_rows": manifest.train.rows,
        "train_shards": len(manifest.train.shards),
        "val_rows": manifest.validation.rows,
        "val_class_rows": manifest.validation.class_counts,
        "dataset_bytes": sum(sh.bytes for sh in manifest.train.shards),
        "shard_bytes": max((sh.bytes for sh in manifest.train.shards + manifest.validation.shards), default=0),
        "features": manifest.features,
        "outputs": manifest.outputs,
        "task": manifest.task,
        "target": manifest.target,
        "manifest_sha256": manifest_sha256(job.dataset.uri),
    }


def _check_concurrency(job: Job, settings: Settings) -> int | None:
    """The account's unreserved Lambda concurrency (None: not readable), after refusing a job that
    pins more workers at once than it and the stack's max_concurrency let run."""
    limits = account.try_read_limits()
    unreserved = limits.unreserved if limits else None
    runs = job.workers.concurrent_runs
    slots = account.worker_slots(settings.max_concurrency, unreserved, runs)
    fixed = job.workers.planner == "fixed"
    field, pinned = ("workers.initial", job.workers.initial) if fixed else ("workers.min", job.workers.min)
    if pinned > slots:
        if unreserved is not None and runs > 1 and account.run_share(unreserved, runs) <= settings.max_concurrency:
            why = (
                f"the account's Lambda concurrency ({unreserved}, UnreservedConcurrentExecutions) is shared by "
                f"{runs} runs at once (workers.concurrent_runs: a study's concurrency) and one for the study's "
                f"watcher, which leaves this run {slots}"
            )
            fix = f"run fewer at once (study.concurrency at most {max(1, (unreserved - 1) // pinned)}), or {account.raise_hint(pinned * runs + 2)}"
        elif unreserved is not None and unreserved <= settings.max_concurrency:
            why = f"the account's Lambda concurrency lets {slots} run at once (UnreservedConcurrentExecutions)"
            fix = account.raise_hint(pinned + 2)
        else:
            why = f"the stack's max_concurrency is {slots}"
            fix = f"deploy with a larger -c max_concurrency (at most the account's {unreserved or 'limit'})"
        raise ConcurrencyLimit(f"{field}: {pinned} workers at once, but {why}; lower {field} to {slots}, or {fix}")
    return unreserved


def _within_slots(job: Job, settings: Settings, meta: MetaItem) -> Job:
    """The job with its workers held to what can run at once (`account.worker_slots`)."""
    slots = account.worker_slots(settings.max_concurrency, meta.account_concurrency, job.workers.concurrent_runs)
    w = job.workers
    if w.max <= slots:
        return job
    held = w.model_copy(update={"max": slots, "initial": min(w.initial, slots), "min": min(w.min, slots)})
    return job.model_copy(update={"workers": held})


def _check_access(job: Job, settings: Settings) -> None:
    """The stack's roles may read the data bucket (and artifacts for warm starts) only; say so
    up front instead of letting every worker fail with AccessDenied. Code runs only from the
    stack's own code/ prefix (`check_code_location`)."""
    check_code_location(job, settings.artifacts_bucket)
    readable = {settings.data_bucket, settings.artifacts_bucket} - {""}
    for field, uri in (("dataset.uri", job.dataset.uri), ("warm_start", job.warm_start)):
        if not uri:
            continue
        try:
            bucket, key = keys.parse_s3_uri(uri)
        except ValueError as e:
            raise InvalidJob(f"{field}: {e}") from None
        if not settings.data_bucket or bucket in readable:
            continue
        folder = key.rstrip("/") + "/"
        if field == "dataset.uri" and any(
            b == bucket and folder.startswith(p) for b, _, p in (g.partition("/") for g in settings.data_buckets)
        ):
            continue
        given = "".join(f", s3://{g}" for g in settings.data_buckets)
        fix = (
            f'or give the stack read access to it: cdk.json context "data_buckets": ["{bucket}"] '
            f"(or `npx cdk deploy -c 'data_buckets=[\"{bucket}\"]'`), then deploy again "
            f"({DATA_BUCKETS_DOC})"
            if field == "dataset.uri"
            else "the stack reads warm starts from its own buckets only"
        )
        raise AccessDenied(
            f"{field}: the stack's roles may read only s3://{settings.data_bucket}/ (and its artifacts "
            f"bucket{given}), not {uri}; copy the data there, {fix}"
        )


def _check_region(job: Job, settings: Settings) -> None:
    """A stack with redis_reducer has its workers in a VPC that reaches S3 through a gateway
    endpoint of its own region only: a dataset bucket in another region would leave every worker
    waiting on connections that cannot open (and the round's quorum retries after them). Refused
    here, by the bucket's region (HeadBucket: s3:ListBucket, which the readers have)."""
    if not settings.workers_in_vpc:
        return
    bucket, _ = keys.parse_s3_uri(job.dataset.uri)
    if bucket == settings.data_bucket:
        return
    here = clients.client("s3").meta.region_name
    try:
        head = clients.client("s3").head_bucket(Bucket=bucket)
    except ClientError as e:
        there = bucket_region(e)
    else:
        there = head.get("BucketRegion") or head.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
            "x-amz-bucket-region"
        )
    if there and there != here:
        raise DataError(
            f"dataset.uri: s3://{bucket} is in {there}, not {here}: this stack's workers (redis_reducer) reach S3 "
            f"only through their VPC's gateway endpoint, which serves buckets of {here} only; copy the dataset "
            f"into a bucket in {here} (`aws s3 sync s3://{bucket}/... s3://DEST/... --source-region {there}`) "
            f"({DATA_BUCKETS_DOC})"
        )


def assign_shards(
    n_shards: int, workers: int, lost: list[int], failed_on: dict[int, int] | None = None
) -> list[list[int]]:
    """Round-robin shards over workers, then hand the shards of last round's lost workers to
    the workers of this round, one each in turn, so no data is skipped twice in a row. A shard
    a worker could not read (`failed_on`: shard -> that worker) moves to another worker, so its
    retry is by different hands (a second failure there fails the run: CorruptShard)."""
    out = [shard_slice(n_shards, workers, w) for w in range(workers)]
    for i, shard in enumerate(sorted(set(lost))):
        target = out[i % workers]
        if shard not in target:
            target.append(shard)
    for shard, bad in sorted((failed_on or {}).items()):
        _move_away(out, shard, bad)
    return out


def _move_away(out: list[list[int]], shard: int, bad: int) -> None:
    """Take `shard` from worker `bad` and give it to the least loaded other worker (one that
    holds it already, when the workers share shards); `bad` keeps at least one shard. With a
    single worker there is no other: its next invocation is the retry."""
    others = [w for w in range(len(out)) if w != bad]
    if not others:
        return
    if not any(shard in out[w] for w in others):
        target = min(others, key=lambda w: (len(out[w]), w))
        out[target].append(shard)
    else:
        target = next(w for w in others if shard in out[w])
    if bad < len(out) and shard in out[bad]:
        out[bad].remove(shard)
        if not out[bad]:  # it held only this shard: swap it for one of the target's
            spare = [s for s in out[target] if s != shard]
            if spare:
                out[target].remove(spare[0])
            else:  # more workers than shards (they share them): share another one
                spare = [s for held in out for s in held if s != shard] or [shard]
            out[bad].append(spare[0])


def _lost_shards(prev_plan: PlanItem | None, prev_round: RoundItem | None, n_shards: int) -> list[int]:
    """Train shards of last round's workers whose updates were not applied."""
    if prev_plan is None or prev_plan.spec is None or prev_round is None or prev_round.eval_only:
        return []
    if prev_round.diverged:
        return []  # nothing was applied that round; every shard gets its normal turn again
    spec = prev_plan.spec
    accepted = {a.worker for a in prev_round.accepted}
    return [s for w in range(spec.workers) if w not in accepted for s in spec.train_shards(w, n_shards)]


def _failed_shards(table: RunTable, prev_round: RoundItem | None) -> dict[str, dict[int, int]]:
    """Shards that a worker of last round failed on (its ERROR item names them), by split:
    shard -> that worker. Read only when a worker of that round did not report."""
    out: dict[str, dict[int, int]] = {"train": {}, "validation": {}}
    if prev_round is None or prev_round.workers_ok >= prev_round.workers:
        return out
    for w, e in sorted(table.errors(prev_round.round).items()):
        if e.shard is not None and e.shard.split in out:
            out[e.shard.split][e.shard.index] = w
    return out


def assign_val_shards(n_shards: int, workers: int, failed_on: dict[int, int]) -> list[list[int]] | None:
    """Validation shards per worker, each evaluated once: round-robin, with a shard a worker
    failed on last round moved to the least loaded other worker, so its retry is by different
    hands (as a train shard's is). None when nothing moves (the round-robin default)."""
    out = [val_slice(n_shards, workers, w) for w in range(workers)]
    moved = False
    for shard, bad in sorted(failed_on.items()):
        if workers < 2 or bad >= workers or shard not in out[bad]:
            continue  # a single worker is its own retry; a shard this round gives it anyway not
        target = min((w for w in range(workers) if w != bad), key=lambda w: (len(out[w]), w))
        out[bad].remove(shard)
        out[target].append(shard)
        moved = True
    return out if moved else None


def _record(r: RoundItem) -> RoundRecord:
    """The planner's view of a ROUND item: the fields it knows."""
    return RoundRecord.model_validate(r.model_dump())


def first_footprint(job: Job, state: _RunState) -> ModelCost | None:
    """Before round 0 no worker has measured the model: a built-in model's parameters and FLOPs
    per sample from its architecture and the dataset's sample shape (`smlt.runtime.planner.footprint`,
    the numbers round 0 would measure; one manifest read, at the first plan only). None for a
    user's model or transform, and after round 0."""
    if state.rounds or (job.code is not None and job.code.transform):
        return None
    manifest = load_manifest(job.dataset.uri)
    return model_cost(job.model, manifest.input_shape, manifest.outputs, manifest.vocab_size)


def _history(state: _RunState, meta: MetaItem, first: ModelCost | None = None) -> RunHistory:
    """What the planner reads: the rounds as `_run_state` converted them, each once (converting
    every round at every plan made the plans of a 1,000-round run ~10 ms slower by its end);
    before round 0, the built-in model's footprint (`first_footprint`)."""
    rounds = state.rounds
    measured = next((r.flops_per_sample for r in reversed(rounds) if r.flops_per_sample), None)
    return RunHistory(
        rounds=state.records,
        elapsed_s=time.time() - meta.created_at,
        cost_total_usd=rounds[-1].cost_total_usd if rounds else 0.0,
        param_count=rounds[-1].param_count if rounds else (first.params if first else 0),
        flops_per_sample=measured or (first.flops_per_sample if first and not rounds else None),
        train_rows=meta.train_rows,
        val_rows=meta.val_rows,
        val_class_rows=meta.val_class_rows,
        dataset_bytes=meta.dataset_bytes,
        shard_bytes=meta.shard_bytes,
        activation_mb=next((r.activation_mb for r in reversed(rounds) if r.activation_mb), None),
    )


# Step Functions history events of one round (Plan, Train, Aggregate, choices; a few retries)
# and per aggregator (an inline Map iteration of one task); a Standard execution holds 25,000.
ROUND_EVENTS = 40
SLICE_EVENTS = 8
HISTORY_BUDGET = 20_000


def round_events(fanout: Fanout, workers: int, aggregators: int) -> int:
    """A round's events in the parent's history: an inline Map's iterations count there."""
    sliced = 12 + SLICE_EVENTS * aggregators if aggregators > 1 else 0
    return ROUND_EVENTS + int(fanout.history_events(workers)) + sliced


def choose_aggregators(settings: Settings, param_count: int, workers: int, eval_only: bool) -> int:
    """How many aggregators reduce a round: sharded (k > 1) when the updates are large or many
    (`plan_slices`); 1 before the model's size is known (round 0) and for an evaluation round."""
    if eval_only or param_count <= 0:
        return 1
    return plan_slices(
        4 * param_count,
        workers,
        read_bytes_per_aggregator=settings.aggregator_read_bytes,
        min_slice_bytes=settings.min_slice_bytes,
    )


def _answer(item: PlanItem, settings: Settings) -> PlanAnswer:
    if item.spec is None:
        return PlanOther(action="stop", run_id=item.run_id, round=item.round, reason=item.reason)
    spec = item.spec
    limit = spec.time_limit_s
    # Per-step mode: every worker waits for all the others at each step, so all must run at once.
    concurrency = spec.workers if spec.job.training.mode == "sync" else min(spec.workers, settings.max_concurrency)
    return PlanTrain(
        run_id=item.run_id,
        round=item.round,
        workers=list(range(spec.workers)),
        function_name=spec.function_name,
        memory_mb=spec.memory_mb,
        local_steps=spec.local_steps,
        max_concurrency=concurrency,
        fanout=settings.fanout.kind(spec.workers),
        # Sharded aggregation: the state machine maps the Aggregate function over the slices.
        aggregators=item.aggregators,
        slices=list(range(item.aggregators)),
        worker_timeout_s=int(math.ceil(limit)) if limit else settings.worker_timeout_s,
        reason=item.reason,
    )


def chained_name(run_id: str, rnd: int) -> str:
    """The name of the execution Chain starts to continue run `run_id` at round `rnd`."""
    return f"{run_id[:66]}-r{rnd:06d}"


def _starts_cold(state: _RunState, run_id: str, execution: str) -> bool:
    """Whether the round's workers start cold, as round 0's do: the first round of an execution
    that did not chain from the last one (a resume: a fresh local engine's handler processes, or
    functions idle since the run stopped). The planner's limits come from warm rounds."""
    if not state.rounds:
        return True
    continues = state.prev_plan is not None and state.prev_plan.execution == execution
    return not continues and execution != chained_name(run_id, state.round)


def _round_limits(
    decision: Decision, state: _RunState, cold: bool, local_concurrency: int | None
) -> tuple[float | None, float | None]:
    """(compute limit, Map task timeout) of the round: `round_limits` of the planner's limit."""
    # The local engine runs SMLT_LOCAL_CONCURRENCY handlers at a time and its task timer starts
    # when the invocation is queued: a worker may wait for earlier waves (on AWS it does not).
    slots = local_concurrency or decision.workers or 1
    waves = math.ceil(max(decision.workers, 1) / max(slots, 1))
    resumed = cold and bool(state.rounds)
    return round_limits(decision.worker_time_limit_s, waves=waves, first=cold and not resumed, resumed=resumed)


@dataclass
class _Seen:
    """The ROUND items this process has read of one run, in order, and the planner's view of each."""

    created: float  # the run's created_at: a run recreated under the same id is another run
    rounds: list[RoundItem]
    records: list[RoundRecord]


# Per (table, run). A ROUND item is written once and never changed, so each planner call reads
# and converts only the rounds after the last one it knows (a warm Lambda container keeps this
# between rounds).
_rounds_seen: dict[tuple[str, str], _Seen] = {}
MAX_RUNS_SEEN = 16  # a warm container may plan many runs over its life: keep the recent ones


@dataclass
class _RunState:
    rounds: list[RoundItem]  # aggregated, in round order
    records: list[RoundRecord]  # the same rounds as the planner reads them
    round: int  # the round to plan
    meta: MetaItem | None
    plan: PlanItem | None  # of this round, when already planned
    prev_plan: PlanItem | None
    stop: StopItem | None = None  # a stop request (the dashboard's button, a study's early stop)


def _run_state(table: RunTable) -> _RunState:
    """The ROUND items, the round to plan, META and the PLAN items of that round and of the last
    one: two requests, reading only the rounds this process has not seen."""
    key = (table.table, table.run_id)
    while True:
        seen = _rounds_seen.get(key)
        known = seen.rounds if seen else []
        new = sorted(table.rounds(after=known[-1].round) if known else table.rounds(), key=lambda r: r.round)
        rounds = known + new
        records = (seen.records if seen else []) + [_record(r) for r in new]
        rnd = rounds[-1].round + 1 if rounds else 0
        items = table.get_many(keys.META, keys.STOP, keys.plan_sk(rnd), *([keys.plan_sk(rnd - 1)] if rnd > 0 else []))
        meta = items.item(keys.META, MetaItem)
        created = meta.created_at if meta else None
        if seen is not None and seen.created != created:
            del _rounds_seen[key]  # the cached rounds are of a run since recreated under this id
            continue
        if rounds and created is not None:
            _rounds_seen.pop(key, None)  # newest last: the least recently planned run goes first
            _rounds_seen[key] = _Seen(created, rounds, records)
            while len(_rounds_seen) > MAX_RUNS_SEEN:
                del _rounds_seen[next(iter(_rounds_seen))]
        prev_plan = items.item(keys.plan_sk(rnd - 1), PlanItem) if rnd > 0 else None
        plan = items.item(keys.plan_sk(rnd), PlanItem)
        return _RunState(rounds, records, rnd, meta, plan, prev_plan, items.item(keys.STOP, StopItem))


# An execution in one of these may still drive its run (PENDING_REDRIVE: being redriven).
DRIVING = ("RUNNING", "PENDING_REDRIVE")


def _driver_status(state_machine: str | None, name: str) -> str | None:
    """The status of execution `name` of the state machine; None when no such execution exists (a
    local engine started afresh: the crashed run's executions are gone) or the state machine is not
    known (a direct invocation, not the state machine's)."""
    if not state_machine:
        return None
    sfn = clients.client("stepfunctions")
    arn = state_machine.replace(":stateMachine:", ":execution:") + ":" + name
    try:
        return str(sfn.describe_execution(executionArn=arn)["status"])
    except sfn.exceptions.ExecutionDoesNotExist:
        return None


def _claim(table: RunTable, meta: MetaItem, state: _RunState, execution: str, state_machine: str | None) -> MetaItem:
    """One driver per run id: META names the execution that drives the run (the first, which wrote
    META). Another execution of the run id takes it over only from an execution that has ended (a
    resume after a failure or a crash) or when the driver handed the run to it (Chain: its name
    derives from the round, and the driver planned the round before); otherwise RunInProgress (or
    AlreadyFinished), before anything is planned, trained or billed beyond this check. The
    takeover is a conditional write, so of two racing executions one drives."""
    run_id = table.run_id
    if meta.execution == execution:
        return meta
    if meta.status == "SUCCEEDED":
        raise AlreadyFinished(
            f"run {run_id} has finished (execution {meta.execution}); execution {execution} trains nothing: "
            f"its outputs stay as they are (`smlt fetch {run_id}`); start a new run id to train again"
        )
    handed = (
        execution == chained_name(run_id, state.round)
        and state.prev_plan is not None
        and state.prev_plan.execution == meta.execution
    )
    if not handed:
        status = _driver_status(state_machine, meta.execution)
        if status in DRIVING:
            raise RunInProgress(
                f"run {run_id} is driven by execution {meta.execution} ({status}); execution {execution} "
                f"ends here and trains nothing (one driver per run): wait for it to end, or stop it "
                f"and continue with `smlt resume {run_id}`"
            )
    took = table.update(
        keys.META, MetaItem, execution=execution, only_if="#execution = :driver", values={":driver": meta.execution}
    )
    if not took:
        driver = table.meta()
        raise RunInProgress(
            f"run {run_id} was taken over by execution {driver.execution if driver else '?'} first; "
            f"execution {execution} ends here and trains nothing (one driver per run)"
        )
    return meta.model_copy(update={"execution": execution})


def _create_run(settings: Settings, table: RunTable, job: Job, execution: str) -> MetaItem:
    """Round 0: check the job's data and access, write META (first writer wins). Nothing is
    written for a bad job. The rest of the run's start is `_start_inputs`'."""
    _check_access(job, settings)
    _check_region(job, settings)
    facts = _check_resources(job, settings)
    facts["account_concurrency"] = _check_concurrency(job, settings)
    meta = MetaItem(
        run_id=table.run_id,
        execution=execution,
        job=job,
        status="RUNNING",
        created_at=time.time(),
        **facts,
    )
    _, meta = table.put_once(keys.META, meta)  # another execution's, when it created the run first
    return meta


def _start_inputs(settings: Settings, run_id: str, job: Job) -> None:
    """Before round 0 is planned, by the run's driver: job.json and the warm start's model as
    model 0 (each written once). Every Plan before PLAN 0 writes them, not only the one that wrote
    META: a Plan that died after META (the warm start's read is its largest) is retried, and its
    retry must not leave round 0's workers to store a fresh initialisation as model 0."""
    artifacts = S3Store(settings.artifacts_bucket)
    artifacts.put(keys.job_key(run_id), job.model_dump_json(indent=1).encode(), if_absent=True)
    if job.warm_start:
        model = warmstart.read_checked(settings.artifacts_bucket, settings.table, job.warm_start)
        artifacts.put(keys.model_key(run_id, 0), model, if_absent=True)


def _decide(settings: Settings, job: Job, meta: MetaItem, state: _RunState) -> Decision:
    """The planner's decision, held to what sync mode can run at once."""
    stop = state.stop
    if stop is not None:
        return Decision(action="stop", reason=f"stopped by {stop.by}: {stop.reason}", bound="stopped", rule="stopped")
    tiers = sorted(settings.train_functions)
    history = _history(state, meta, first_footprint(job, state))
    job = _within_slots(job, settings, meta)
    decision = decide(job, history, tiers, settings.prices, settings.architecture, sizes=settings)
    if decision.infeasible and not job.constraints.best_effort:
        raise Infeasible(decision.reason)
    if job.training.mode == "sync" and decision.action == "train":
        # All workers of a per-step round must run at once (each step waits for every worker).
        slots = min(settings.max_concurrency, settings.local_concurrency or settings.max_concurrency)
        if decision.workers > slots:
            decision = decision.model_copy(
                update={
                    "workers": max(1, slots),
                    "reason": f"{decision.reason} (sync mode: at most {slots} concurrent workers)",
                }
            )
    return decision


MAX_EVALUATIONS = 3  # evaluation rounds of one final model whose metric stayed partial


def _final_evaluation(decision: Decision, rounds: list[RoundItem]) -> Decision | None:
    """A stop whose newest model has not been evaluated yet: one evaluation-only round measures it,
    again while a failed worker leaves its metric partial (at most MAX_EVALUATIONS in a row; then
    finalize publishes the newest model measured on the whole split)."""
    if not rounds or rounds[-1].stop or not decision.evaluates_first:
        return None
    if sum(1 for _ in takewhile(lambda r: r.eval_only, reversed(rounds))) >= MAX_EVALUATIONS:
        return None
    last = rounds[-1]
    return Decision(
        action="train",
        workers=last.workers,
        memory_mb=last.memory_mb,
        local_steps=0,
        reason=f"final evaluation ({decision.reason})",
        bound=decision.bound,
        rule="final_evaluation",
        worker_time_limit_s=decision.worker_time_limit_s,
    )


def _spec(
    settings: Settings, job: Job, meta: MetaItem, state: _RunState, decision: Decision, planned_at: float, cold: bool
) -> RoundSpec:
    """The round spec of a training (or evaluation) round: learning rate, shards, aggregators,
    time limits (`round_limits`)."""
    rounds = state.rounds
    compute_limit, task_timeout = _round_limits(decision, state, cold, settings.local_concurrency)
    lost = _lost_shards(state.prev_plan, rounds[-1] if rounds else None, meta.train_shards)
    failed = _failed_shards(RunTable(settings.table, meta.run_id), rounds[-1] if rounds else None)
    n_params = rounds[-1].param_count if rounds else 0
    return RoundSpec(
        run_id=meta.run_id,
        round=state.round,
        workers=decision.workers,
        memory_mb=decision.memory_mb,
        aggregators=choose_aggregators(settings, n_params, decision.workers, decision.local_steps == 0),
        local_steps=decision.local_steps,
        function_name=settings.train_functions[decision.memory_mb],
        planned_at=planned_at,
        time_limit_s=task_timeout,
        compute_limit_s=compute_limit,
        learning_rate=job.training.learning_rate * meta.lr_scale,
        reason=decision.reason,
        job=job,
        assignments=assign_shards(meta.train_shards, decision.workers, lost, failed["train"]),
        val_assignments=_val_assignments(job, decision.workers, failed["validation"]),
        val_rows=meta.val_rows or None,  # 0: a META written before it was recorded
    )


def _val_assignments(job: Job, workers: int, failed_on: dict[int, int]) -> list[list[int]] | None:
    """Validation shards moved away from the workers that failed on them (the manifest, cached per
    process, is read only then: it gives the split's shard count)."""
    if not failed_on or workers < 2:
        return None
    return assign_val_shards(len(load_manifest(job.dataset.uri).validation.shards), workers, failed_on)


def _so_far(prev: PlanItem | None, execution: str) -> tuple[int, int]:
    """(rounds, history events) this execution has planned so far, from the last round's plan."""
    if prev is None or prev.execution != execution:
        return 0, 0
    return prev.execution_rounds, prev.execution_events


def _chain_reason(state: _RunState, job: Job, execution: str, fanout: Fanout) -> str | None:
    """Why this execution hands over to a fresh one (see chain) before its history grows too
    long, or None."""
    ran_here, events_here = _so_far(state.prev_plan, execution)
    # The next round is not planned yet: reserve for the most its Map could write here (an
    # inline Map of the most workers it takes).
    prev_aggregators = state.prev_plan.aggregators if state.prev_plan else 1
    next_events = round_events(fanout, fanout.inline_max_workers, prev_aggregators)
    if ran_here >= job.rounds_per_execution or events_here + next_events > HISTORY_BUDGET:
        return f"{ran_here} rounds in this execution; continuing in a new one"
    return None


def plan_next(settings: Settings, event: PlanEvent) -> PlanAnswer:
    t0 = time.perf_counter()
    raw_job, execution = event.job, event.execution
    triggered = isinstance(raw_job, dict) and "trigger" in raw_job
    if triggered:
        raw_job = job_from_trigger(
            raw_job["trigger"],
            settings.artifacts_bucket,
            notify_topic_arn=settings.notify_topic_arn,
            execution=execution,
        )
    job = parse_job(raw_job)
    run_id = job.run_id or execution
    table = RunTable(settings.table, run_id)
    state = _run_state(table)
    meta = state.meta or _create_run(settings, table, job, execution)
    if triggered and meta.execution != execution:
        # The same upload event delivered twice (or raced): its run already exists.
        reason = f"duplicate event: run {run_id} belongs to execution {meta.execution}"
        return PlanOther(action="duplicate", run_id=run_id, round=0, reason=reason)
    meta = _claim(table, meta, state, execution, event.state_machine)
    if state.plan is not None:
        if state.plan.attempts > state.plan.handed_out:  # a quorum retry: the Map runs the next attempt
            table.update(keys.plan_sk(state.round), PlanItem, handed_out=state.plan.attempts)
        return _answer(state.plan, settings)
    if state.round == 0:
        _start_inputs(settings, run_id, meta.job)
    chain_reason = _chain_reason(state, job, execution, settings.fanout)
    if chain_reason is not None:
        return PlanOther(action="chain", run_id=run_id, round=state.round, reason=chain_reason)
    item = _plan_item(settings, job, meta, state, execution)
    item.plan_s = time.perf_counter() - t0
    _, stored = table.put_once(keys.plan_sk(state.round), item)
    return _answer(stored, settings)


def _plan_item(settings: Settings, job: Job, meta: MetaItem, state: _RunState, execution: str) -> PlanItem:
    """The round's PLAN item: stop, or train (an evaluation-only round when the newest model
    has not been measured), with its round spec."""
    decision = _decide(settings, job, meta, state)
    ran_here, events_here = _so_far(state.prev_plan, execution)
    item = PlanItem(
        run_id=meta.run_id,
        round=state.round,
        action="stop",
        reason=decision.reason,
        bound=decision.bound,
        rule=decision.rule,
        notes=list(decision.notes),
        predicted_round_s=decision.predicted_round_s,
        predicted_round_cost_usd=decision.predicted_round_cost_usd,
        planned_at=time.time(),
        execution=execution,
        execution_rounds=ran_here + 1,
        eta_rounds=decision.predicted_rounds_left,
        eta_rounds_p70=decision.predicted_rounds_left_p70,
        eta_s=decision.predicted_total_s,
        eta_s_p70=decision.predicted_total_s_p70,
        eta_cost_usd=decision.predicted_total_cost_usd,
        eta_cost_usd_p70=decision.predicted_total_cost_usd_p70,
    )
    item.elapsed_s = item.planned_at - meta.created_at
    if decision.action == "stop":
        evaluation = _final_evaluation(decision, state.rounds)
        if evaluation is None:
            item.execution_events = events_here + round_events(settings.fanout, 0, 1)
            return item
        # The aggregator stops the run after the evaluation round, for the stop's reason.
        item.stop_reason, item.reason = item.reason, evaluation.reason
        item.stop_rule, item.rule = item.rule, evaluation.rule
        decision = evaluation
    spec = _spec(settings, job, meta, state, decision, item.planned_at, _starts_cold(state, meta.run_id, execution))
    item.action, item.spec = "train", spec
    # The spec's shape at top level too, for readers of the table (smlt status, a local run's log).
    item.workers, item.memory_mb, item.local_steps = spec.workers, spec.memory_mb, spec.local_steps
    item.function_name, item.aggregators = spec.function_name, spec.aggregators
    item.execution_events = events_here + round_events(settings.fanout, spec.workers, spec.aggregators)
    return item


# A continuing execution in one of these is the run going on (PENDING_REDRIVE: being redriven).
CHAIN_ALIVE = ("RUNNING", "SUCCEEDED", "PENDING_REDRIVE")


def chain(settings: Settings, event: ChainEvent) -> ChainAnswer:
    """Start the execution that continues this run from its checkpoint. The name derives from
    the round, so a repeated call starts nothing new (StartExecution is idempotent by name); an
    existing execution of that name that failed, timed out or was aborted is ChainedExecutionFailed."""
    sfn = clients.client("stepfunctions")
    name = chained_name(event.run_id, event.round)
    # The validated job of the run, not this execution's input: an upload-triggered run's input
    # is the S3 event, which the next execution would take for a duplicate event.
    meta = RunTable(settings.table, event.run_id).meta()
    stored = meta.job.model_dump(mode="json") if meta is not None else event.job
    try:
        arn = sfn.start_execution(
            stateMachineArn=event.state_machine, name=name, input=json.dumps({**stored, "run_id": event.run_id})
        )["executionArn"]
    except sfn.exceptions.ExecutionAlreadyExists:
        arn = event.state_machine.replace(":stateMachine:", ":execution:") + ":" + name
        status = sfn.describe_execution(executionArn=arn)["status"]
        if status not in CHAIN_ALIVE:
            raise ChainedExecutionFailed(
                f"run {event.run_id}: the execution {name} that continues it at round {event.round} is {status} "
                f"(see its history); resume the run with `smlt resume {event.run_id}` once the cause is fixed"
            ) from None
    return ChainAnswer(execution_arn=arn, name=name)
