"""The run table: pk/sk strings, on-demand, point-in-time recovery, encrypted."""

from __future__ import annotations

from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from infra.stacks.storage import STATEFUL


class RunTable(Construct):
    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # AWS-managed KMS key (aws/dynamodb): encrypted at rest, no key grants needed.
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            removal_policy=STATEFUL,
        )
