"""Plan: the first state of a round (planner Lambda, op "plan"), and Chain.

Round 0 validates the job and writes the run's META; every round reads the timings and metrics of
the rounds so far, asks the planner (`smlt.planner.decide`) for workers, memory tier and local
steps, assigns the train shards (with last round's lost shards), chooses the aggregators, and
writes the PLAN item. Chain hands a long run over to a fresh execution.

`plan_next` is idempotent: the round number comes from what DynamoDB says is aggregated, and the
PLAN item is written once; a repeated call returns the stored plan.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from smlt import keys
from smlt.aggregate.reduce import plan_slices
from smlt.config import Settings
from smlt.data.shards import load_manifest
from smlt.errors import AccessDenied, Infeasible, InvalidJob
from smlt.job import Job, parse_job
from smlt.planner import decide
from smlt.planner.types import Decision, RoundRecord, RunHistory, WorkerTiming
from smlt.records import RunTable
from smlt.roundspec import RoundSpec, shard_slice
from smlt.store import S3Store
from smlt.trigger import job_from_trigger


def _check_resources(job: Job, settings: Settings) -> dict[str, Any]:
    """Everything that can be checked before the first write. Raises a named error."""
    tiers = sorted(settings.train_functions)
    if job.workers.memory_mb is not None and job.workers.memory_mb not in tiers:
        raise InvalidJob(
            f"workers.memory_mb: {job.workers.memory_mb} is not a deployed memory tier "
            f"(deployed: {', '.join(map(str, tiers))})"
        )
    manifest = load_manifest(job.dataset.uri)
    if (
        manifest.task == "regression"
        and job.training.target_metric == "val_accuracy"
        and job.training.target_value is not None
    ):
        raise InvalidJob("training.target_metric: val_accuracy needs a classification dataset; use val_loss")
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
        "dataset_bytes": sum(sh.bytes for sh in manifest.train.shards),
        "features": manifest.features,
        "outputs": manifest.outputs,
        "task": manifest.task,
    }


def _check_access(job: Job, settings: Settings) -> None:
    """The stack's roles may read the data bucket (and artifacts for warm starts) only; say so
    up front instead of letting every worker fail with AccessDenied."""
    readable = {settings.data_bucket, settings.artifacts_bucket} - {""}
    for field, uri in (("dataset.uri", job.dataset.uri), ("warm_start", job.warm_start)):
        if not uri:
            continue
        try:
            bucket, _ = keys.parse_s3_uri(uri)
        except ValueError as e:
            raise InvalidJob(f"{field}: {e}") from None
        if settings.data_bucket and bucket not in readable:
            raise AccessDenied(
                f"{field}: the stack may read only s3://{settings.data_bucket}/ "
                f"(and its artifacts bucket), not s3://{bucket}/; copy the data there"
            )


def assign_shards(n_shards: int, workers: int, lost: list[int]) -> list[list[int]]:
    """Round-robin shards over workers, then hand the shards of last round's lost workers to
    the workers of this round, one each in turn, so no data is skipped twice in a row."""
    out = [shard_slice(n_shards, workers, w) for w in range(workers)]
    for i, shard in enumerate(sorted(set(lost))):
        target = out[i % workers]
        if shard not in target:
            target.append(shard)
    return out


def _lost_shards(prev_plan: dict[str, Any] | None, prev_round: dict[str, Any] | None, n_shards: int) -> list[int]:
    """Train shards of last round's workers whose updates were not applied."""
    if not prev_plan or not prev_round or prev_plan.get("action") != "train" or prev_round.get("eval_only"):
        return []
    if prev_round.get("diverged"):
        return []  # nothing was applied that round; every shard gets its normal turn again
    spec = RoundSpec.model_validate_json(prev_plan["spec"])
    accepted = {a["worker"] for a in prev_round.get("accepted", [])}
    return [s for w in range(spec.workers) if w not in accepted for s in spec.train_shards(w, n_shards)]


def _history(rounds: list[dict], meta: dict) -> RunHistory:
    records = []
    for r in rounds:
        records.append(
            RoundRecord(
                round=r["round"],
                workers=r["workers"],
                memory_mb=r["memory_mb"],
                local_steps=r["local_steps"],
                batch_size=r["batch_size"],
                workers_ok=r["workers_ok"],
                timings=[WorkerTiming(**t) for t in r.get("timings", [])],
                aggregate_s=r["aggregate_s"],
                round_s=r["round_s"],
                train_loss=r.get("train_loss"),
                val_loss=r.get("val_loss"),
                val_accuracy=r.get("val_accuracy"),
                cost_usd=r["cost_usd"],
                time_limit_s=r.get("time_limit_s"),
            )
        )
    return RunHistory(
        rounds=records,
        elapsed_s=time.time() - float(meta["created_at"]),
        cost_total_usd=float(rounds[-1]["cost_total_usd"]) if rounds else 0.0,
        param_count=int(rounds[-1]["param_count"]) if rounds else int(meta.get("param_count", 0)),
        train_rows=int(meta["train_rows"]),
        val_rows=int(meta.get("val_rows", 0)),
        dataset_bytes=int(meta.get("dataset_bytes", 0)),
    )


# Sharded aggregation runs its k aggregators in an inline Map (at most 40 iterations at once).
MAX_AGGREGATORS = 40
# Step Functions history events of one round (Plan, Train, Aggregate, choices; a few retries)
# and per aggregator (an inline Map iteration of one task); a Standard execution holds 25,000.
ROUND_EVENTS = 40
SLICE_EVENTS = 8
HISTORY_BUDGET = 20_000


def round_events(aggregators: int) -> int:
    return ROUND_EVENTS + (12 + SLICE_EVENTS * aggregators if aggregators > 1 else 0)


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
        max_aggregators=MAX_AGGREGATORS,
    )


def _result(item: dict[str, Any], settings: Settings) -> dict[str, Any]:
    if item["action"] != "train":
        return {"action": item["action"], "run_id": item["run_id"], "round": item["round"], "reason": item["reason"]}
    n = int(item["workers"])
    spec = RoundSpec.model_validate_json(item["spec"])
    limit = spec.time_limit_s
    k = int(item.get("aggregators", 1))
    # Per-step mode: every worker waits for all the others at each step, so all must run at once.
    concurrency = n if spec.job.training.mode == "sync" else min(n, settings.max_concurrency)
    return {
        "action": "train",
        "run_id": item["run_id"],
        "round": item["round"],
        "workers": list(range(n)),
        "function_name": item["function_name"],
        "memory_mb": item["memory_mb"],
        "local_steps": item["local_steps"],
        "max_concurrency": concurrency,
        # Sharded aggregation: the state machine maps the Aggregate function over the slices.
        "aggregators": k,
        "slices": list(range(k)),
        # Step Functions stops waiting for a straggler after this (TimeoutSecondsPath).
        "worker_timeout_s": int(math.ceil(limit)) if limit else settings.worker_timeout_s,
        "reason": item["reason"],
    }


def _straggler_limit(decision: Decision, rounds: list[dict], local_concurrency: int | None) -> float | None:
    """The planner's straggler cut-off, but never before timings exist (round 0 pays cold starts
    the model has not seen) and never under 10 s (a cut-off that tight only loses updates)."""
    if decision.worker_time_limit_s is None or not rounds:
        return None
    # The local engine runs SMLT_LOCAL_CONCURRENCY handlers at a time and its task timer starts
    # when the invocation is queued: a worker may wait for earlier waves (on AWS it does not).
    slots = local_concurrency or decision.workers or 1
    waves = math.ceil(max(decision.workers, 1) / max(slots, 1))
    return max(decision.worker_time_limit_s * waves, 10.0)


# The ROUND items this process has read, per (table, run): (the run's created_at, rounds in
# order). A ROUND item is written once and never changed, so each planner call reads only the
# rounds after the last one it knows (a warm Lambda container keeps this between rounds).
_rounds_seen: dict[tuple[str, str], tuple[Any, list[dict[str, Any]]]] = {}
MAX_RUNS_SEEN = 16  # a warm container may plan many runs over its life: keep the recent ones


def _run_state(table: RunTable) -> tuple[list[dict[str, Any]], int, dict[str, dict[str, Any] | None]]:
    """(the ROUND items in round order; the round to plan; META, PLAN of that round and of the
    last one): two requests, reading only the rounds this process has not seen."""
    key = (table.table, table.run_id)
    while True:
        stamp, known = _rounds_seen.get(key, (None, []))
        new = table.rounds(after=known[-1]["round"]) if known else table.rounds()
        rounds = known + sorted(new, key=lambda r: r["round"])
        rnd = rounds[-1]["round"] + 1 if rounds else 0
        items = table.get_many(keys.META, keys.plan_sk(rnd), *([keys.plan_sk(rnd - 1)] if rnd > 0 else []))
        created = (items[keys.META] or {}).get("created_at")
        if stamp is not None and stamp != created:
            del _rounds_seen[key]  # the cached rounds are of a run since recreated under this id
            continue
        if rounds and created is not None:
            _rounds_seen.pop(key, None)
            _rounds_seen[key] = (created, rounds)  # newest last: the least recently planned run goes first
            while len(_rounds_seen) > MAX_RUNS_SEEN:
                del _rounds_seen[next(iter(_rounds_seen))]
        return rounds, rnd, items


def plan_next(settings: Settings, raw_job: Any, execution: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    triggered = isinstance(raw_job, dict) and "trigger" in raw_job
    if triggered:
        raw_job = job_from_trigger(raw_job["trigger"], settings.artifacts_bucket)
    job = parse_job(raw_job)
    run_id = job.run_id or execution
    table = RunTable(settings.table, run_id)
    artifacts = S3Store(settings.artifacts_bucket)
    rounds, rnd, items = _run_state(table)
    meta = items[keys.META]
    if meta is None:
        _check_access(job, settings)
        facts = _check_resources(job, settings)  # nothing is written for a bad job
        _, meta = table.put_once(
            keys.META,
            {
                "job": job.model_dump(mode="json"),
                "status": "RUNNING",
                "created_at": time.time(),
                "run_id": run_id,
                "execution": execution,
                **facts,
            },
        )
        artifacts.put(keys.job_key(run_id), job.model_dump_json(indent=1).encode(), if_absent=True)
        if job.warm_start:
            bucket, key = keys.parse_s3_uri(job.warm_start)
            artifacts.put(keys.model_key(run_id, 0), S3Store(bucket).get(key), if_absent=True)

    if triggered and meta.get("execution") != execution:
        # The same upload event delivered twice (or raced): its run already exists.
        return {
            "action": "duplicate",
            "run_id": run_id,
            "round": 0,
            "reason": f"duplicate event: run {run_id} belongs to execution {meta.get('execution')}",
        }

    existing = items[keys.plan_sk(rnd)]
    if existing is not None:
        return _result(existing, settings)
    prev_plan = items.get(keys.plan_sk(rnd - 1))
    same = bool(prev_plan and prev_plan.get("execution") == execution)
    ran_here = int(prev_plan.get("execution_rounds", 1)) if same else 0
    events_here = int(prev_plan.get("execution_events", 0)) if same else 0
    next_events = round_events(int(prev_plan.get("aggregators", 1)) if prev_plan else 1)
    if ran_here >= job.rounds_per_execution or events_here + next_events > HISTORY_BUDGET:
        # Hand over to a fresh execution (see chain) before this one's history grows too long.
        return {
            "action": "chain",
            "run_id": run_id,
            "round": rnd,
            "reason": f"{ran_here} rounds in this execution; continuing in a new one",
        }

    tiers = sorted(settings.train_functions)
    decision: Decision = decide(job, _history(rounds, meta), tiers, settings.prices, settings.architecture)
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
    item: dict[str, Any] = {
        "run_id": run_id,
        "round": rnd,
        "reason": decision.reason,
        "bound": decision.bound,
        "predicted_round_s": decision.predicted_round_s,
        "predicted_round_cost_usd": decision.predicted_round_cost_usd,
        "planned_at": time.time(),
        "execution": execution,
        "execution_rounds": ran_here + 1,
    }
    if decision.action == "stop":
        measured = rounds and rounds[-1]["stop"] is False and decision.bound in ("max_rounds", "deadline", "target")
        if measured:
            # The newest model has not been evaluated yet: one evaluation-only round measures it.
            last = rounds[-1]
            decision = Decision(
                action="train",
                workers=last["workers"],
                memory_mb=last["memory_mb"],
                local_steps=0,
                reason=f"final evaluation ({decision.reason})",
                bound=decision.bound,
                worker_time_limit_s=decision.worker_time_limit_s,
            )
            item["stop_reason"] = item["reason"]
            item["reason"] = decision.reason
        else:
            item["action"] = "stop"
    if decision.action == "train":
        lr = job.training.learning_rate * float(meta.get("lr_scale", 1.0))
        lost = _lost_shards(prev_plan, rounds[-1] if rounds else None, int(meta["train_shards"]))
        n_params = int(rounds[-1]["param_count"]) if rounds else 0
        k = choose_aggregators(settings, n_params, decision.workers, decision.local_steps == 0)
        spec = RoundSpec(
            run_id=run_id,
            round=rnd,
            workers=decision.workers,
            memory_mb=decision.memory_mb,
            aggregators=k,
            local_steps=decision.local_steps,
            function_name=settings.train_functions[decision.memory_mb],
            planned_at=item["planned_at"],
            time_limit_s=_straggler_limit(decision, rounds, settings.local_concurrency),
            compute_limit_s=decision.worker_time_limit_s if rounds else None,
            learning_rate=lr,
            reason=decision.reason,
            job=job,
            assignments=assign_shards(int(meta["train_shards"]), decision.workers, lost),
        )
        item.update(
            action="train",
            workers=spec.workers,
            memory_mb=spec.memory_mb,
            local_steps=spec.local_steps,
            function_name=spec.function_name,
            aggregators=k,
            spec=spec.model_dump_json(),
        )
    item["execution_events"] = events_here + round_events(int(item.get("aggregators", 1)))
    item["plan_s"] = time.perf_counter() - t0
    _, stored = table.put_once(keys.plan_sk(rnd), item)
    return _result(stored, settings)


def chain(settings: Settings, job: dict[str, Any], run_id: str, rnd: int, state_machine_arn: str) -> dict[str, Any]:
    """Start the execution that continues this run from its checkpoint. The name derives from
    the round, so a repeated call starts nothing new (StartExecution is idempotent by name)."""
    import boto3

    sfn = boto3.client("stepfunctions")
    name = f"{run_id[:66]}-r{rnd:06d}"
    # The validated job of the run, not this execution's input: an upload-triggered run's input
    # is the S3 event, which the next execution would take for a duplicate event.
    stored = (RunTable(settings.table, run_id).meta() or {}).get("job") or job
    try:
        arn = sfn.start_execution(
            stateMachineArn=state_machine_arn, name=name, input=json.dumps({**stored, "run_id": run_id})
        )["executionArn"]
    except sfn.exceptions.ExecutionAlreadyExists:
        arn = state_machine_arn.replace(":stateMachine:", ":execution:") + ":" + name
    return {"execution_arn": arn, "name": name}
