"""SmltStack: storage, table, functions, workflow, trigger and monitoring wired together
(and, with context `redis_reducer: true`, the ElastiCache exchange and its VPC)."""

from __future__ import annotations

from typing import Any

from aws_cdk import ArnFormat, CfnOutput, Duration, Fn, Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.stacks.exchange import RedisExchange
from infra.stacks.functions import (
    AGGREGATE_TIMEOUT,
    PLANNER_TIMEOUT,
    PREPARE_TIMEOUT,
    Functions,
    retention,
)
from infra.stacks.monitoring import Monitoring
from infra.stacks.nag import acknowledge_allowed_wildcards
from infra.stacks.settings import Settings
from infra.stacks.storage import Storage
from infra.stacks.study import StudyWorkflow
from infra.stacks.table import RunTable
from infra.stacks.trigger import RetrainTrigger
from infra.stacks.workflow import Workflow
from smlt import stack_outputs as outputs


class SmltStack(Stack):
    def __init__(self, scope: Construct, id: str, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        settings = Settings.from_context(self)
        self.settings = settings

        self.storage = Storage(self, "Storage", update_expiry_days=settings.update_expiry_days)
        self.runs = RunTable(self, "Runs")
        self.exchange: RedisExchange | None = None
        if settings.redis_reducer:
            self.exchange = RedisExchange(
                self,
                "Exchange",
                node_type=settings.redis_node_type,
                log_retention=retention(settings.log_retention_days),
            )
        self.functions = Functions(
            self,
            "Functions",
            settings=settings,
            data_bucket=self.storage.data,
            artifacts_bucket=self.storage.artifacts,
            table=self.runs.table,
            exchange=self.exchange,
        )
        self.workflow = Workflow(
            self,
            "Workflow",
            planner=self.functions.planner,
            aggregate=self.functions.aggregate,
            train_functions=self.functions.train_functions,
            prepare_function=self.functions.prepare,
            planner_timeout=PLANNER_TIMEOUT,
            aggregate_timeout=AGGREGATE_TIMEOUT,
            prepare_timeout=PREPARE_TIMEOUT,
            log_retention=retention(settings.log_retention_days),
            execution_timeout=Duration.hours(settings.execution_timeout_hours),
        )
        # Chain: the planner starts the execution that continues a long run. A separate policy
        # (not the role's default policy, which the function depends on) avoids a cycle
        # function → policy → state machine → function.
        planner_role = self.functions.planner.role
        if planner_role is None:  # typed optional for imported functions; ours always has its role
            raise ValueError("the planner function has no execution role")
        iam.Policy(
            self,
            "PlannerChainPolicy",
            roles=[planner_role],
            statements=[
                iam.PolicyStatement(
                    actions=["states:StartExecution"],
                    resources=[self.workflow.state_machine.state_machine_arn],
                ),
                # An execution of the chained name that exists already: is it alive or failed?
                iam.PolicyStatement(
                    actions=["states:DescribeExecution"],
                    resources=[
                        self.format_arn(
                            service="states",
                            resource="execution",
                            resource_name=f"{self.workflow.state_machine.state_machine_name}:*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    ],
                ),
            ],
        )
        self.study = StudyWorkflow(
            self,
            "Study",
            functions=self.functions,
            artifacts_bucket=self.storage.artifacts,
            table=self.runs.table,
            training=self.workflow.state_machine,
            log_retention=retention(settings.log_retention_days),
            execution_timeout=Duration.hours(settings.execution_timeout_hours),
        )
        self.trigger = RetrainTrigger(
            self,
            "Trigger",
            data_bucket=self.storage.data,
            state_machine=self.workflow.state_machine,
        )
        fns = {
            "Planner": self.functions.planner,
            "Aggregate": self.functions.aggregate,
            "Prepare": self.functions.prepare,
        }
        fns.update({f"TrainStep{mb}": fn for mb, fn in self.functions.train_functions.items()})
        fns["StudyController"] = self.study.controller
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            state_machine=self.workflow.state_machine,
            functions=fns,
            dead_letters=self.trigger.dead_letters,
            alarm_topic_arn=settings.alarm_topic_arn,
        )

        CfnOutput(self, outputs.STATE_MACHINE, value=self.workflow.state_machine.state_machine_arn)
        CfnOutput(self, outputs.STUDY_STATE_MACHINE, value=self.study.state_machine.state_machine_arn)
        CfnOutput(self, outputs.DATA_BUCKET, value=self.storage.data.bucket_name)
        CfnOutput(self, outputs.ARTIFACTS_BUCKET, value=self.storage.artifacts.bucket_name)
        CfnOutput(self, outputs.TABLE, value=self.runs.table.table_name)
        CfnOutput(
            self,
            outputs.DASHBOARD_URL,
            value=f"https://{self.region}.console.aws.amazon.com/cloudwatch/home?region={self.region}"
            f"#dashboards:name={self.monitoring.dashboard.dashboard_name}",
        )
        if self.exchange is not None:
            CfnOutput(
                self,
                outputs.REDIS_ENDPOINT,
                description="The smlt exchange (ElastiCache, TLS): host:port of its primary endpoint, "
                "reachable from the stack's VPC only",
                value=Fn.join(":", [self.exchange.endpoint_address, self.exchange.endpoint_port]),
            )

        # Last: every IAM policy exists now; acknowledge only the allowlisted wildcards.
        self.acknowledged_wildcards = acknowledge_allowed_wildcards(self)
