"""A small CDK app that mirrors the shape of the real smlt stack (docs/architecture.md), so the
local engine is tested without depending on infra/.

Shape: Start (Pass, intrinsics) -> Mode (Choice: spin loop for the history limit test) ->
Plan (Task, payload response only, zip function) -> ShouldTrain (Choice) -> Train (Distributed Map,
ItemsPath / MaxConcurrencyPath / ItemSelector, child Task with dynamic ``FunctionName.$``, Retry,
TimeoutSecondsPath, Catch States.ALL -> Pass) -> Aggregate (Task) -> Continue (Choice loop) -> Finalize -> Done.

Two S3 buckets and a DynamoDB table reach the handlers through env vars (Ref). Workers are
container-image functions (DockerImageCode.from_image_asset: staged at synth, never built).
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

HERE = Path(__file__).resolve().parent
ZIP_DIR = HERE / "fixture_lambdas" / "zipfn"
IMG_DIR = HERE / "fixture_lambdas" / "img"
IMG_CMD = "tests.engine.fixture_lambdas.img.app.handler"
STACK_ID = "SmltFixture"

# tier name -> (construct id, timeout seconds)
TIERS = {"small": ("TrainSmall", 30), "tiny": ("TrainTiny", 1)}


class FixtureStack(cdk.Stack):
    def __init__(self, scope: Construct, cid: str, **kw) -> None:
        super().__init__(scope, cid, **kw)

        data = s3.Bucket(self, "DataBucket", removal_policy=cdk.RemovalPolicy.DESTROY, auto_delete_objects=True)
        artifacts = s3.Bucket(self, "ArtifactsBucket", versioned=True)
        table = ddb.Table(
            self,
            "Table",
            partition_key=ddb.Attribute(name="pk", type=ddb.AttributeType.STRING),
            sort_key=ddb.Attribute(name="sk", type=ddb.AttributeType.STRING),
            billing_mode=ddb.BillingMode.PAY_PER_REQUEST,
        )
        common_env = {
            "SMLT_ARTIFACTS_BUCKET": artifacts.bucket_name,
            "SMLT_DATA_BUCKET": data.bucket_name,
            "SMLT_TABLE": table.table_name,
            "FIXTURE_TABLE_ARN": table.table_arn,
            "FIXTURE_SUB": cdk.Fn.sub("${AWS::Region}/${AWS::AccountId}/${AWS::Partition}/x"),
        }

        tiers = {}
        for tier, (cid_, timeout) in TIERS.items():
            fn = lambda_.DockerImageFunction(
                self,
                cid_,
                code=lambda_.DockerImageCode.from_image_asset(str(IMG_DIR), cmd=[IMG_CMD]),
                memory_size=1769 if tier == "small" else 512,
                timeout=cdk.Duration.seconds(timeout),
                environment={**common_env, "FIXTURE_TIER": tier},
            )
            artifacts.grant_read_write(fn)
            table.grant_read_write_data(fn)
            tiers[tier] = fn

        planner = lambda_.Function(
            self,
            "Planner",
            runtime=lambda_.Runtime.PYTHON_3_11,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(ZIP_DIR)),
            memory_size=1024,
            timeout=cdk.Duration.seconds(30),
            environment={
                **common_env,
                "FIXTURE_TRAIN_FUNCTIONS": self.to_json_string({t: f.function_name for t, f in tiers.items()}),
                "FIXTURE_TRAIN_ARNS": cdk.Fn.join(",", [f.function_arn for f in tiers.values()]),
            },
        )
        aggregate = lambda_.Function(
            self,
            "Aggregate",
            runtime=lambda_.Runtime.PYTHON_3_11,
            handler="handler.handler",
            code=lambda_.Code.from_asset(str(ZIP_DIR)),
            memory_size=3008,
            timeout=cdk.Duration.seconds(30),
            environment=common_env,
        )
        for fn in (planner, aggregate):
            artifacts.grant_read_write(fn)
            data.grant_read(fn)
            table.grant_read_write_data(fn)

        start = sfn.Pass(
            self,
            "Start",
            parameters={
                "job.$": "$",
                "execution.$": "$$.Execution.Name",
                "n_workers.$": "States.ArrayLength($.workers)",
                "key.$": "States.Format('runs/{}/job.json', $$.Execution.Name)",
                "merged.$": "States.JsonMerge($.defaults, $.overrides, false)",
                "uuid.$": "States.UUID()",
                "range.$": "States.ArrayRange(0, 4, 2)",
                "sum.$": "States.MathAdd($.spins, 1)",
            },
        )
        spin = sfn.Pass(
            self,
            "Spin",
            parameters={
                "job.$": "$.job",
                "execution.$": "$.execution",
                "count.$": "States.MathAdd($.count, 1)",
            },
        )
        spin_init = sfn.Pass(self, "SpinInit", parameters={"job.$": "$.job", "execution.$": "$.execution", "count": 0})
        spun = sfn.Succeed(self, "Spun")
        spin_check = (
            sfn.Choice(self, "SpinCheck")
            .when(sfn.Condition.number_less_than_json_path("$.count", "$.job.spins"), spin)
            .otherwise(spun)
        )
        spin.next(spin_check)
        spin_init.next(spin)

        plan = tasks.LambdaInvoke(
            self,
            "Plan",
            lambda_function=planner,
            payload_response_only=True,
            payload=sfn.TaskInput.from_object({"op": "plan", "job.$": "$.job", "execution.$": "$.execution"}),
            result_path="$.plan",
        )
        worker = sfn.CustomState(
            self,
            "TrainWorker",
            state_json={
                "Type": "Task",
                "Resource": f"arn:{cdk.Aws.PARTITION}:states:::lambda:invoke",
                "TimeoutSecondsPath": "$.timeout_s",
                "Parameters": {
                    "FunctionName.$": "$.function_name",
                    "Payload": {"run_id.$": "$.run_id", "round.$": "$.round", "worker.$": "$.worker"},
                },
                "ResultSelector": {"worker.$": "$.Payload.worker", "ok": True},
            },
        )
        worker.add_retry(
            errors=["Lambda.TooManyRequestsException", "Lambda.ServiceException"],
            interval=cdk.Duration.seconds(1),
            max_attempts=2,
            backoff_rate=1,
        )
        worker.add_retry(errors=["Flaky"], interval=cdk.Duration.seconds(1), max_attempts=2, backoff_rate=1)
        failed = sfn.Pass(
            self,
            "WorkerFailed",
            parameters={"worker.$": "$.worker", "ok": False, "error.$": "$.error.Error", "cause.$": "$.error.Cause"},
        )
        worker.add_catch(failed, errors=["States.ALL"], result_path="$.error")

        train = sfn.DistributedMap(
            self,
            "Train",
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
        train.item_processor(worker)

        agg = tasks.LambdaInvoke(
            self,
            "AggregateRound",
            lambda_function=aggregate,
            payload_response_only=True,
            payload=sfn.TaskInput.from_object(
                {
                    "op": "aggregate",
                    "run_id.$": "$.plan.run_id",
                    "round.$": "$.plan.round",
                    "outcomes.$": "$.outcomes",
                    "rounds.$": "$.job.rounds",
                }
            ),
            result_path="$.agg",
        )
        final = tasks.LambdaInvoke(
            self,
            "Finalize",
            lambda_function=planner,
            payload_response_only=True,
            payload=sfn.TaskInput.from_object({"op": "finalize", "run_id.$": "$.plan.run_id"}),
            result_path="$.final",
        )
        done = sfn.Succeed(self, "Done")
        final.next(done)
        cont = (
            sfn.Choice(self, "Continue").when(sfn.Condition.boolean_equals("$.agg.stop", True), final).otherwise(plan)
        )
        should_train = (
            sfn.Choice(self, "ShouldTrain")
            .when(sfn.Condition.string_equals("$.plan.action", "stop"), final)
            .otherwise(train)
        )
        plan.next(should_train)
        train.next(agg)
        agg.next(cont)

        mode = (
            sfn.Choice(self, "Mode").when(sfn.Condition.string_equals("$.job.mode", "spin"), spin_init).otherwise(plan)
        )
        start.next(mode)

        sm = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(start),
            state_machine_type=sfn.StateMachineType.STANDARD,
        )
        for fn in tiers.values():
            fn.grant_invoke(sm)

        cdk.CfnOutput(self, "StateMachineArn", value=sm.state_machine_arn)


def build_app(outdir: str | None = None, context: dict | None = None) -> cdk.App:
    context = context or {}
    app = cdk.App(outdir=outdir, context=context)
    FixtureStack(
        app, context.get("fixture:stack", STACK_ID)
    )  # environment-agnostic: pseudo parameters stay in the template
    return app
