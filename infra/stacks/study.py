"""The study state machine (Standard, JSONPath only) and its controller function.

Init (controller: validate the study file, write its items) → Run, a Parallel of
  - Trials: an inline Map over the trial numbers, MaxConcurrencyPath = the study's concurrency;
    each iteration: Admit (controller: reserve the trial's budget share, give its deadline) →
    Admitted? → RunTrial (`states:startExecution.sync:2` of the training state machine: the trial
    is an ordinary run, its own execution and ledger; Step Functions waits for it) → TrialEnded
    (controller: its ledger replaces its reservation); a start refused for the account's Step
    Functions rate (throttled StartExecution) is retried with backoff (START_RETRY); a failed
    execution is caught → TrialEnded with its error; a skipped trial → Skipped.
    After the Map: TrialsEnded, a Fail state that stops the Watcher (below).
  - Watcher: Watch (controller: the running trials' curves, ASHA's stops, the deadline) →
    WatchDone? → Wait (the poll interval Watch answers) → Watch …
→ (Run's catch of TrialsEnded) Finish (controller: the best trial's model under studies/<id>/best/) → Done.

The controller is a thin handler over `smlt.runtime.study.controller`; it reads and writes the table's
items and `studies/*` of the artifacts bucket, and reads the trials' `runs/*` items only through
the table. Its role can stop a trial only through its STOP item (`request_stop`): never
StopExecution, so every stopped trial still evaluates and publishes its model.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra.stacks.functions import TABLE_ITEM_ACTIONS, ZIP_HANDLER, Functions
from infra.stacks.nag import acknowledge
from infra.stacks.storage import STATEFUL
from infra.stacks.workflow import SERVICE_RETRY, THROTTLE_RETRY, lambda_task, logged_state_machine
from smlt.runtime import keys, metrics
from smlt.runtime.config import STUDY
from smlt.runtime.config import Settings as RuntimeSettings
from smlt.runtime.study import budget

# RunTrial's StartExecution refused for the account's rate (each Step Functions API action has its
# own token bucket per account and Region: docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html,
# "Quotas related to API action throttling") or its open executions (ExecutionLimitExceeded, 1,000,000).
# The optimized integration names an error "StepFunctions." + the API's error code (the AWS guide's
# example retries "StepFunctions.ExecutionLimitExceeded"); without this retrier the Catch took a
# throttled start for a failed trial. Jittered: a Map's trials start together and would collide again.
START_THROTTLED = ["StepFunctions.ThrottlingException", "StepFunctions.ExecutionLimitExceeded"]
START_RETRY = {
    "ErrorEquals": START_THROTTLED,
    "IntervalSeconds": 2,
    "MaxAttempts": 8,
    "BackoffRate": 2.0,
    "MaxDelaySeconds": 60,
    "JitterStrategy": "FULL",
}

CONTROLLER_TIMEOUT = Duration.minutes(2)
CONTROLLER_MEMORY_MB = budget.CONTROLLER_MEMORY_MB  # the study's own bill prices it
TRIALS_ENDED = "Study.TrialsEnded"  # the Trials branch's end, caught by Run into Finish


class StudyWorkflow(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        functions: Functions,
        artifacts_bucket: s3.IBucket,
        table: dynamodb.ITable,
        training: sfn.StateMachine,
        log_retention: logs.RetentionDays,
        execution_timeout: Duration,
    ) -> None:
        super().__init__(scope, id)
        role = iam.Role(
            self,
            "ControllerRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="smlt study controller execution role",
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject"],
                resources=[artifacts_bucket.arn_for_objects(keys.object_pattern(keys.study_prefix(keys.ANY)))],
            )
        )
        # The best trial's final model, copied (read) from its run's final/ prefix.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[artifacts_bucket.arn_for_objects(keys.object_pattern(keys.final_prefix(keys.ANY)))],
            )
        )
        role.add_to_principal_policy(iam.PolicyStatement(actions=TABLE_ITEM_ACTIONS, resources=[table.table_arn]))
        group = logs.LogGroup(self, "ControllerLogs", retention=log_retention, removal_policy=STATEFUL)
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[group.log_group_arn])
        )
        self.controller = lambda_.Function(
            self,
            "Controller",
            description="smlt study controller: trials' budget shares, ASHA stops, the study's result",
            runtime=functions.planner.runtime,
            architecture=functions.architecture,
            handler=ZIP_HANDLER,
            code=Functions._zip_code("study"),
            layers=[functions.layer],
            memory_size=CONTROLLER_MEMORY_MB,
            timeout=CONTROLLER_TIMEOUT,
            role=role,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=group,
            environment=RuntimeSettings.environment(
                STUDY,
                artifacts_bucket=artifacts_bucket.bucket_name,
                table=table.table_name,
                service_name=metrics.SERVICE,
            ),
        )
        acknowledge(self.controller, "AwsSolutions-L1")

        # Every controller step is retried when its process died: each finds what its earlier
        # invocation wrote (init its META, admit and ended their trial in META's shares/settled).
        def step(sid: str, op: str, payload: dict, result_path: str | None) -> tasks.LambdaInvoke:
            return lambda_task(
                self, sid, self.controller, CONTROLLER_TIMEOUT, {"op": op, **payload}, result_path, idempotent=True
            )

        study_id = sfn.JsonPath.string_at("$.study_id")
        init = step(
            "Init",
            "init",
            {"study": sfn.JsonPath.object_at("$"), "execution": sfn.JsonPath.string_at("$$.Execution.Name")},
            "$",
        )
        admit = step("Admit", "admit", {"study_id": study_id, "trial": sfn.JsonPath.number_at("$.trial")}, "$.admit")
        run_trial = sfn.CustomState(
            self,
            "RunTrial",
            state_json={
                "Type": "Task",
                "Resource": f"arn:{Stack.of(self).partition}:states:::states:startExecution.sync:2",
                "Parameters": {
                    "StateMachineArn": training.state_machine_arn,
                    "Name.$": "$.admit.run_id",
                    "Input.$": "$.admit.job",
                },
                "ResultSelector": {"status.$": "$.Status"},
                "ResultPath": "$.run",
                "Retry": [SERVICE_RETRY, THROTTLE_RETRY, START_RETRY],
            },
        )
        ended_ok = step("TrialEnded", "ended", {"study_id": study_id, "trial": sfn.JsonPath.number_at("$.trial")}, None)
        ended_failed = step(
            "TrialFailed",
            "ended",
            {
                "study_id": study_id,
                "trial": sfn.JsonPath.number_at("$.trial"),
                "error": sfn.JsonPath.object_at("$.error"),
            },
            None,
        )
        run_trial.add_catch(ended_failed, errors=[sfn.Errors.ALL], result_path="$.error")
        run_trial.next(ended_ok)
        admitted = (
            sfn.Choice(self, "Admitted")
            .when(sfn.Condition.boolean_equals("$.admit.start", True), run_trial)
            .otherwise(sfn.Pass(self, "Skipped"))
        )
        trials = sfn.Map(
            self,
            "Trials",
            items_path="$.trials",
            max_concurrency_path="$.concurrency",
            item_selector={"study_id.$": "$.study_id", "trial.$": "$$.Map.Item.Value"},
            result_path=sfn.JsonPath.DISCARD,
        )
        trials.item_processor(admit.next(admitted))

        watch = step("Watch", "watch", {"study_id": study_id}, "$.watch")
        wait = sfn.Wait(self, "Poll", time=sfn.WaitTime.seconds_path("$.watch.poll_seconds"))
        watch_done = (
            sfn.Choice(self, "WatchDone")
            .when(sfn.Condition.boolean_equals("$.watch.done", True), sfn.Succeed(self, "Watched"))
            .otherwise(wait)
        )
        wait.next(watch)
        # The last trial's end ends the study: a Parallel ends only when every branch has, and the
        # watcher may be in a Wait of up to the deadline (its paced last look), so the Trials branch
        # ends in a Fail state, which stops the other branch (its Wait at once; a Watch invocation
        # in flight runs to its end, `controller.watch` records it after Finish), and Run catches
        # that one error into Finish. Any other error of either branch still fails the study.
        trials.next(sfn.Fail(self, "TrialsEnded", error=TRIALS_ENDED, cause="every trial ended: end the watcher"))
        run = sfn.Parallel(self, "Run", result_path=sfn.JsonPath.DISCARD)
        run.branch(trials)
        run.branch(watch.next(watch_done))
        finish = step("Finish", "finish", {"study_id": study_id}, "$.result")
        run.add_catch(finish, errors=[TRIALS_ENDED], result_path=sfn.JsonPath.DISCARD)
        definition = init.next(run)
        finish.next(sfn.Succeed(self, "Done"))

        self.log_group, self.state_machine = logged_state_machine(
            self,
            "study",
            definition,
            "smlt: a hyper-parameter study (trials as training executions, ASHA, one budget)",
            log_retention,
            execution_timeout,
        )
        # startExecution.sync:2: start the training machine's executions, watch (describe) them
        # and stop them if the study execution is stopped; Step Functions' managed rule tells it
        # when a child ends.
        self.state_machine.add_to_role_policy(
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[training.state_machine_arn])
        )
        self.state_machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["states:DescribeExecution", "states:StopExecution"],
                resources=[
                    Stack.of(self).format_arn(
                        service="states",
                        resource="execution",
                        resource_name=f"{training.state_machine_name}:*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        self.state_machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                resources=[
                    Stack.of(self).format_arn(
                        service="events",
                        resource="rule",
                        resource_name="StepFunctionsGetEventsForStepFunctionsExecutionRule",
                    )
                ],
            )
        )
