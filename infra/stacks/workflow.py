"""The training state machine (Standard, JSONPath only), exactly as in docs/architecture.md.

Start → HowToStart → Plan → ShouldTrain → HowToTrain → Train (inline Map of TrainWorker, n ≤ 40) or
TrainDistributed (Distributed Map of TrainWorkerDistributed, Standard children) → HowToAggregate → Aggregate
→ Continue → … → Finalize → Done; ShouldTrain also routes "chain" → Chain → Chained and
"duplicate" → Duplicate. When the plan has k > 1 aggregators, HowToAggregate routes to the sharded
path instead: AggregatePrepare → Prepared → AggregateSlices (inline Map of AggregateSlice over
$.plan.slices) → AggregateFinish → Continue.
HowToStart routes a raw upload's trigger (its key ends in `/_SUCCESS`) through PrepareData (the
Prepare function: the raw data prepared into the run's dataset) → DataPrepared → Plan, or, for
a duplicated event, → Duplicate; everything else (a job, a manifest's trigger) goes to Plan.
A failed worker is caught inside the map child (WorkerFailed), so the map never fails because of
one worker. Every task has a timeout (TrainWorker: TimeoutSecondsPath from the plan) and retries
Lambda service errors and throttling with exponential backoff; Plan, Aggregate (each op) and
Finalize also retry a process that died (`Runtime.ExitError`, `Lambda.Unknown`), PrepareData once;
they and the steps after a table's parts retry `Throttled` (an S3 or DynamoDB request throttled
through botocore's attempts) three times, after 5, 10 and 20 s. A part's failure is final once its
Map caught it: the step after the Map raises it again as `PartFailed` (a part's named data error
by its own name), which none of that step's retriers take.
PrepareData failed for good is caught: PrepareFailed tells the team's topic, then PrepareDataFailed
fails the execution with PrepareData's error; so are the steps after a table's parts' Maps
(MergeStats, MergeMoments, FinishParts), with the same single message.
"""

from __future__ import annotations

from aws_cdk import Duration, Fn, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.stacks.storage import STATEFUL
from smlt.runtime import keys
from smlt.runtime.fanout import INLINE_MAX, PARTS_MAX_CONCURRENCY

# A raw upload's trigger: its key is a version's completion marker (smlt.runtime.trigger).
RAW_UPLOAD_KEY = f"{keys.INCOMING}*/{keys.SUCCESS_MARKER}"

# Lambda service errors Step Functions recommends retrying (what CDK adds by default).
LAMBDA_SERVICE_ERRORS = [
    "Lambda.ClientExecutionTimeoutException",
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
]
LAMBDA_THROTTLED = ["Lambda.TooManyRequestsException"]
# A function whose process died (a signal, out of memory): Runtime.ExitError, or Lambda.Unknown
# when no error type came back. Plan, Aggregate and Finalize are idempotent: they run again.
PROCESS_DIED = ["Runtime.ExitError", "Lambda.Unknown"]
# A control step whose S3 or DynamoDB request stayed throttled through botocore's 8 retries raises
# Throttled (smlt.runtime.retry.named_throttles): run again after 5, 10 and 20 s (35 s in all,
# beyond the ~1-2 minutes botocore's attempts already took), time for S3 to scale a prefix or a
# DynamoDB partition's burst to come back; no jitter, so the pause is at least that. The steps
# are idempotent (a crash sweep ran each again after each of its writes); a fourth throttle-out
# fails the execution with Throttled (resumed later).
THROTTLED = ["Throttled"]
THROTTLED_INTERVAL_S, THROTTLED_ATTEMPTS, THROTTLED_BACKOFF = 5, 3, 2.0
PREPARE_DEATH_RETRIES = 1  # PrepareData: once (an input too large for its memory would die again)

# Retriers as ASL (used verbatim for the custom TrainWorker state, and via add_retry elsewhere).
SERVICE_RETRY = {"ErrorEquals": LAMBDA_SERVICE_ERRORS, "IntervalSeconds": 2, "MaxAttempts": 6, "BackoffRate": 2.0}
THROTTLE_RETRY = {
    "ErrorEquals": LAMBDA_THROTTLED,
    "IntervalSeconds": 1,
    "MaxAttempts": 10,
    "BackoffRate": 2.0,
    "MaxDelaySeconds": 60,
    "JitterStrategy": "FULL",
}

# Seconds a task may run: the function timeout plus headroom for invoke overhead.
TASK_HEADROOM = Duration.seconds(60)


def _add_retries(state: sfn.TaskStateBase) -> None:
    state.add_retry(
        errors=LAMBDA_SERVICE_ERRORS,
        interval=Duration.seconds(2),
        max_attempts=6,
        backoff_rate=2.0,
    )
    state.add_retry(
        errors=LAMBDA_THROTTLED,
        interval=Duration.seconds(1),
        max_attempts=10,
        backoff_rate=2.0,
        max_delay=Duration.seconds(60),
        jitter_strategy=sfn.JitterType.FULL,
    )


def _add_death_retry(state: sfn.TaskStateBase, attempts: int = 3) -> None:
    """Retry a control step whose process died (idempotent steps only), with backoff."""
    state.add_retry(errors=PROCESS_DIED, interval=Duration.seconds(2), max_attempts=attempts, backoff_rate=2.0)


def _add_throttled_retry(state: sfn.TaskStateBase) -> None:
    """Retry a control step whose S3 or DynamoDB request stayed throttled (idempotent steps only)."""
    state.add_retry(
        errors=THROTTLED,
        interval=Duration.seconds(THROTTLED_INTERVAL_S),
        max_attempts=THROTTLED_ATTEMPTS,
        backoff_rate=THROTTLED_BACKOFF,
    )


def _task_timeout(function_timeout: Duration) -> sfn.Timeout:
    return sfn.Timeout.duration(Duration.seconds(function_timeout.to_seconds() + TASK_HEADROOM.to_seconds()))


def lambda_task(
    scope: Construct,
    sid: str,
    function: lambda_.IFunction,
    timeout: Duration,
    payload: dict | None,
    result_path: str | None,
    *,
    idempotent: bool,
    death_retries: int = 3,
) -> tasks.LambdaInvoke:
    """A control step invoking `function` with `payload` (None: the state's input), its answer at
    `result_path`; retried on Lambda's service errors and throttling, and when its process died or
    its request stayed throttled (`Throttled`) only if the step is `idempotent` (doing it again does
    the same)."""
    task = tasks.LambdaInvoke(
        scope,
        sid,
        lambda_function=function,
        payload_response_only=True,
        retry_on_service_exceptions=False,
        payload=None if payload is None else sfn.TaskInput.from_object(payload),
        result_path=result_path,
        task_timeout=_task_timeout(timeout),
    )
    _add_retries(task)
    if idempotent:
        _add_death_retry(task, death_retries)
        _add_throttled_retry(task)
    return task


def logged_state_machine(
    scope: Construct,
    kind: str,
    definition: sfn.IChainable,
    comment: str,
    log_retention: logs.RetentionDays,
    execution_timeout: Duration,
) -> tuple[logs.LogGroup, sfn.StateMachine]:
    """A Standard state machine traced with X-Ray and logging every event with its data to its own
    log group (kept with the other stateful resources): the training machine's and the study's.

    The group is kept on destroy, so its name is per stack instance (the stack id's UUID): the
    next `cdk deploy` after `cdk destroy` creates a new group instead of failing on the kept one
    (AlreadyExists). The /aws/vendedlogs/ prefix keeps it out of CloudWatch Logs' size-limited
    resource policy."""
    stack = Stack.of(scope)
    instance = Fn.select(2, Fn.split("/", stack.stack_id))
    log_group = logs.LogGroup(
        scope,
        "Logs",
        log_group_name=f"/aws/vendedlogs/states/{stack.stack_name}-{kind}-{instance}",
        retention=log_retention,
        removal_policy=STATEFUL,
    )
    machine = sfn.StateMachine(
        scope,
        "StateMachine",
        state_machine_type=sfn.StateMachineType.STANDARD,
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        comment=comment,
        tracing_enabled=True,
        timeout=execution_timeout,
        logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
    )
    return log_group, machine


class Workflow(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        planner: lambda_.Function,
        aggregate: lambda_.Function,
        train_functions: dict[int, lambda_.Function],
        prepare_function: lambda_.Function,
        planner_timeout: Duration,
        aggregate_timeout: Duration,
        prepare_timeout: Duration,
        log_retention: logs.RetentionDays,
        execution_timeout: Duration,
    ) -> None:
        super().__init__(scope, id)

        start = sfn.Pass(
            self,
            "Start",
            parameters={"job.$": "$", "execution.$": "$$.Execution.Name"},
        )

        plan = lambda_task(
            self,
            "Plan",
            planner,
            planner_timeout,
            {
                "op": "plan",
                "job": sfn.JsonPath.object_at("$.job"),
                "execution": sfn.JsonPath.string_at("$.execution"),
                # One driver per run: the planner looks up the execution that drives it.
                "state_machine": sfn.JsonPath.string_at("$$.StateMachine.Id"),
            },
            "$.plan",
            idempotent=True,
        )

        # --- the round's Map: inline for a few workers, Distributed above (smlt/runtime/fanout.py) ---
        def worker_map(suffix: str, distributed: bool) -> sfn.Map | sfn.DistributedMap:
            """A Map of TrainWorker over $.plan.workers. State names are unique in the whole
            machine, so the Distributed Map's states carry `suffix`."""
            train_worker = sfn.CustomState(
                self,
                f"TrainWorker{suffix}",
                state_json={
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke",
                    "Parameters": {
                        "FunctionName.$": "$.function_name",
                        "Payload": {"run_id.$": "$.run_id", "round.$": "$.round", "worker.$": "$.worker"},
                    },
                    "ResultSelector": {"worker.$": "$.Payload.worker", "ok": True},
                    # The planner sets the per-round limit; a straggler past it is abandoned (the
                    # round's seal refuses its late write) and reported as WorkerFailed.
                    "TimeoutSecondsPath": "$.timeout_s",
                    "Retry": [SERVICE_RETRY, THROTTLE_RETRY],
                },
            )
            worker_failed = sfn.Pass(
                self,
                f"WorkerFailed{suffix}",
                parameters={"worker.$": "$.worker", "ok": False, "error.$": "$.error.Error"},
            )
            train_worker.add_catch(worker_failed, errors=[sfn.Errors.ALL], result_path="$.error")
            props: dict = dict(
                items_path="$.plan.workers",
                max_concurrency_path="$.plan.max_concurrency",
                item_selector={
                    "run_id.$": "$.plan.run_id",
                    "round.$": "$.plan.round",
                    "worker.$": "$$.Map.Item.Value",
                    "function_name.$": "$.plan.function_name",
                    "timeout_s.$": "$.plan.worker_timeout_s",
                },
                result_path="$.outcomes",
            )
            # Standard children (the default): a worker may run 15 minutes, an Express child 5.
            fan: sfn.Map | sfn.DistributedMap = (
                sfn.DistributedMap(self, f"Train{suffix}", **props)
                if distributed
                else sfn.Map(self, f"Train{suffix}", **props)
            )
            fan.item_processor(train_worker)
            return fan

        train = worker_map("", distributed=False)
        train_distributed = worker_map("Distributed", distributed=True)
        how_to_train = (
            sfn.Choice(self, "HowToTrain")
            .when(sfn.Condition.string_equals("$.plan.fanout", "distributed"), train_distributed)
            .otherwise(train)
        )

        aggregate_task = lambda_task(
            self,
            "Aggregate",
            aggregate,
            aggregate_timeout,
            {
                "run_id": sfn.JsonPath.string_at("$.plan.run_id"),
                "round": sfn.JsonPath.number_at("$.plan.round"),
                "outcomes": sfn.JsonPath.list_at("$.outcomes"),
            },
            "$.agg",
            idempotent=True,
        )

        # --- sharded aggregation: prepare, k slices in parallel, finish (same function, op) ---
        def aggregate_op(sid: str, op: str, result_path: str | None, base: str = "$.plan") -> tasks.LambdaInvoke:
            payload = {
                "op": op,
                "run_id": sfn.JsonPath.string_at(f"{base}.run_id"),
                "round": sfn.JsonPath.number_at(f"{base}.round"),
            }
            if op == "slice":
                payload.update(slice=sfn.JsonPath.number_at("$.slice"), of=sfn.JsonPath.number_at("$.of"))
            return lambda_task(self, sid, aggregate, aggregate_timeout, payload, result_path, idempotent=True)

        prepare = aggregate_op("AggregatePrepare", "prepare", "$.agg")
        slice_task = aggregate_op("AggregateSlice", "slice", sfn.JsonPath.DISCARD, base="$")
        slices = sfn.Map(
            self,
            "AggregateSlices",
            items_path="$.plan.slices",
            max_concurrency=INLINE_MAX,
            item_selector={
                "run_id.$": "$.plan.run_id",
                "round.$": "$.plan.round",
                "slice.$": "$$.Map.Item.Value",
                "of.$": "$.plan.aggregators",
            },
            result_path=sfn.JsonPath.DISCARD,
        )
        slices.item_processor(slice_task)
        finish = aggregate_op("AggregateFinish", "finish", "$.agg")

        finalize = lambda_task(
            self,
            "Finalize",
            planner,
            planner_timeout,
            {"op": "finalize", "run_id": sfn.JsonPath.string_at("$.plan.run_id")},
            "$.final",
            idempotent=True,
        )
        done = sfn.Succeed(self, "Done")
        finalize.next(done)

        # Long runs continue in a fresh execution (history limit): the planner starts it.
        chain = lambda_task(
            self,
            "Chain",
            planner,
            planner_timeout,
            {
                "op": "chain",
                "job": sfn.JsonPath.object_at("$.job"),
                "run_id": sfn.JsonPath.string_at("$.plan.run_id"),
                "round": sfn.JsonPath.number_at("$.plan.round"),
                "state_machine": sfn.JsonPath.string_at("$$.StateMachine.Id"),
            },
            "$.chain",
            # It starts the next execution, by a name derived from the round: run again after its
            # process died (after StartExecution, before it answered), it finds that execution
            # alive and answers it (smlt.runtime.steps.plan.chain), so the run does not end FAILED
            # while its continuation trains on.
            idempotent=True,
        )
        chain.next(sfn.Succeed(self, "Chained", comment="The run continues in $.chain.execution_arn"))

        # A duplicated upload event (see "Trigger" in docs/architecture.md): the run belongs to
        # another execution, the planner answers "duplicate" and nothing else runs.
        duplicate = sfn.Succeed(self, "Duplicate", comment="The run is owned by another execution")

        should_train = (
            sfn.Choice(self, "ShouldTrain")
            .when(sfn.Condition.string_equals("$.plan.action", "stop"), finalize)
            .when(sfn.Condition.string_equals("$.plan.action", "chain"), chain)
            .when(sfn.Condition.string_equals("$.plan.action", "duplicate"), duplicate)
            .otherwise(how_to_train)
        )
        continue_choice = (
            sfn.Choice(self, "Continue")
            .when(sfn.Condition.boolean_equals("$.agg.stop", True), finalize)
            .otherwise(plan)
        )
        # prepare answers proceed=false for a quorum retry or an already aggregated round.
        prepared = (
            sfn.Choice(self, "Prepared")
            .when(sfn.Condition.boolean_equals("$.agg.proceed", True), slices)
            .otherwise(continue_choice)
        )
        how = (
            sfn.Choice(self, "HowToAggregate")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.is_present("$.plan.aggregators"),
                    sfn.Condition.number_greater_than("$.plan.aggregators", 1),
                ),
                prepare,
            )
            .otherwise(aggregate_task)
        )
        prepare.next(prepared)
        slices.next(finish).next(continue_choice)
        train.next(how)
        train_distributed.next(how)
        aggregate_task.next(continue_choice)

        # --- a raw upload: its data prepared (smlt.runtime.steps.prepare), then the run as any other ---
        # Retried once when its process died (a host's fault; an attempt that died is taken over:
        # the claim is the execution's, a written manifest answers, shards are replaced): not more,
        # as an input too large for its memory dies again (its size is checked before it is read).
        prepare_data = lambda_task(
            self,
            "PrepareData",
            prepare_function,
            prepare_timeout,
            {
                "op": "prepare_data",
                "trigger": sfn.JsonPath.object_at("$.job.trigger"),
                "execution": sfn.JsonPath.string_at("$.execution"),
            },
            "$.prepared",
            idempotent=True,
            death_retries=PREPARE_DEATH_RETRIES,
        )
        # Failed for good: the refusal told to the team's topic (unless PrepareData told it),
        # then the execution fails with PrepareData's error. Told once: not retried when it dies.
        prepare_failed = lambda_task(
            self,
            "PrepareFailed",
            prepare_function,
            prepare_timeout,
            {
                "op": "prepare_failed",
                "trigger": sfn.JsonPath.object_at("$.job.trigger"),
                "execution": sfn.JsonPath.string_at("$.execution"),
                "error": sfn.JsonPath.object_at("$.error"),
            },
            "$.failed",
            idempotent=False,
        )
        prepare_data.add_catch(prepare_failed, errors=[sfn.Errors.ALL], result_path="$.error")
        prepare_failed.next(
            sfn.Fail(self, "PrepareDataFailed", error_path="$.error.Error", cause_path="$.failed.cause")
        )
        prepare_failed.add_catch(
            sfn.Fail(self, "PrepareDataFailedUntold", error_path="$.error.Error", cause_path="$.error.Cause"),
            errors=[sfn.Errors.ALL],
            result_path="$.notify_error",
        )
        parts = self._parts(prepare_function, prepare_timeout, plan, prepare_failed)
        data_prepared = (
            sfn.Choice(self, "DataPrepared")
            .when(sfn.Condition.string_equals("$.prepared.action", "duplicate"), duplicate)
            .when(sfn.Condition.string_equals("$.prepared.action", "parts"), parts)
            .otherwise(plan)
        )
        prepare_data.next(data_prepared)
        how_to_start = (
            sfn.Choice(self, "HowToStart")
            .when(
                sfn.Condition.and_(
                    sfn.Condition.is_present("$.job.trigger.key"),
                    sfn.Condition.string_matches("$.job.trigger.key", RAW_UPLOAD_KEY),
                ),
                prepare_data,
            )
            .otherwise(plan)
        )
        plan.next(should_train)
        definition = start.next(how_to_start)

        self.log_group, self.state_machine = logged_state_machine(
            self,
            "training",
            definition,
            "smlt: adaptive serverless training (plan, train on n workers, aggregate, repeat)",
            log_retention,
            execution_timeout,
        )
        # The worker task picks its function from the state (FunctionName.$): allow exactly the tiers.
        # (the parts' Maps start child executions of this machine: CDK grants that with each DistributedMap)
        self.state_machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"],
                resources=[fn.function_arn for fn in train_functions.values()],
            )
        )

    def _parts(
        self,
        prepare_function: lambda_.IFunction,
        prepare_timeout: Duration,
        then: sfn.IChainable,
        failed: sfn.IChainable,
    ) -> sfn.IChainable:
        """A raw upload of one table in many files (smlt.runtime.steps.prepare_parts): three
        Distributed Maps of the Prepare function over $.prepared.parts, one step after each.

        PartStats → MergeStats → StatsMerged (a column text in some part: ReadAsText, PartStats
        again) → PartMoments → MergeMoments → PartShards → FinishParts → `then` (Plan). A child's
        error is caught in the child (PartStatsFailed, ...) and raised again by its name by the
        step after the Map, which names the part's object and line. A step after a Map failed for
        good (after its retries) is caught as PrepareData is: `failed` (PrepareFailed) tells the
        team's topic once, unless the step told it (a named data error, a part's)."""
        prepared = "$.prepared"
        common = {
            "run_id.$": f"{prepared}.run_id",
            "bucket.$": f"{prepared}.bucket",
            "folder.$": f"{prepared}.folder",
            "execution.$": "$.execution",
        }

        def task(sid: str, payload: dict | None, result_path: str | None, idempotent: bool) -> tasks.LambdaInvoke:
            return lambda_task(
                self, sid, prepare_function, prepare_timeout, payload, result_path, idempotent=idempotent
            )

        def fan(sid: str, op: str, extra: dict[str, str]) -> sfn.DistributedMap:
            child = task(f"{sid}Part", None, None, idempotent=False)  # the item (ItemSelector's) is the event
            # Not retried when it died or stayed throttled: final once caught, the step after the Map
            # raises it as `PartFailed`, which none of that step's retriers take.
            failed = sfn.Pass(
                self,
                f"{sid}Failed",
                # the error's name only: its message is in the scratch (a thousand causes with their
                # stack traces would pass the state's 256 KiB)
                parameters={"part.$": "$.part", "key.$": "$.key", "error.$": "$.error.Error"},
            )
            child.add_catch(failed, errors=[sfn.Errors.ALL], result_path="$.error")
            m = sfn.DistributedMap(
                self,
                sid,
                items_path=f"{prepared}.parts",
                max_concurrency=PARTS_MAX_CONCURRENCY,
                item_selector={
                    "op": op,
                    "part.$": "$$.Map.Item.Value.part",
                    "key.$": "$$.Map.Item.Value.key",
                    **common,
                    **extra,
                },
                result_path="$.part_results",
            )
            m.item_processor(child)
            return m

        def after(sid: str, op: str, result_path: str) -> tasks.LambdaInvoke:
            payload = {
                "op": op,
                "run_id": sfn.JsonPath.string_at(f"{prepared}.run_id"),
                "bucket": sfn.JsonPath.string_at(f"{prepared}.bucket"),
                "folder": sfn.JsonPath.string_at(f"{prepared}.folder"),
                "execution": sfn.JsonPath.string_at("$.execution"),
                "results": sfn.JsonPath.list_at("$.part_results"),
            }
            # idempotent: it reads the children's scratch objects again
            step = task(sid, payload, result_path, idempotent=True)
            step.add_catch(failed, errors=[sfn.Errors.ALL], result_path="$.error")
            return step

        stats = fan("PartStats", "part_stats", {"text.$": f"{prepared}.text"})
        merge_stats = after("MergeStats", "merge_stats", "$.merged")
        read_as_text = sfn.Pass(self, "ReadAsText", input_path="$.merged.text", result_path=f"{prepared}.text")
        moments = fan("PartMoments", "part_moments", {})
        merge_moments = after("MergeMoments", "merge_moments", sfn.JsonPath.DISCARD)
        shards = fan("PartShards", "part_shards", {})
        finish = after("FinishParts", "finish_parts", prepared)
        stats_merged = (
            sfn.Choice(self, "StatsMerged")
            .when(sfn.Condition.boolean_equals("$.merged.again", True), read_as_text)
            .otherwise(moments)
        )
        read_as_text.next(stats)
        moments.next(merge_moments).next(shards).next(finish).next(then)
        return stats.next(merge_stats).next(stats_merged)
