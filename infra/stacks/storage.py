"""Buckets: data (datasets, EventBridge notifications on), artifacts (runs/), access logs."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.stacks.nag import acknowledge
from smlt.runtime import keys

# Workers write their per-round deltas with this object tag so a lifecycle rule can expire them:
# S3 lifecycle filters take a literal prefix (no wildcards), so `runs/*/rounds/*/updates/` can
# only be selected by prefix `runs/` AND a tag. See docs/architecture.md, "Storage".
# One source: the tag the workers' PUT carries (smlt.runtime.keys.UPDATE_TAG, "key=value").
UPDATE_TAG_KEY, _, UPDATE_TAG_VALUE = keys.UPDATE_TAG.partition("=")

# The stack's stateful resources (buckets, the table, the functions' and the state machine's log
# groups) outlive `cdk destroy` and a replacement, but not a failed first create: CloudFormation
# deletes what a rolled-back create made (DeletionPolicy RetainExceptOnCreate), so a first deploy
# that fails (a memory quota, a name clash) leaves nothing behind. docs/deploy.md, "Destroy".
STATEFUL = RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE


def _private_bucket(
    scope: Construct,
    id: str,
    *,
    lifecycle_rules: list[s3.LifecycleRule],
    object_ownership: s3.ObjectOwnership = s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
    server_access_logs_bucket: s3.IBucket | None = None,
    server_access_logs_prefix: str | None = None,
) -> s3.Bucket:
    """Every bucket of the stack: S3-managed encryption, TLS only, no public access, retained (STATEFUL)."""
    return s3.Bucket(
        scope,
        id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=object_ownership,
        removal_policy=STATEFUL,
        server_access_logs_bucket=server_access_logs_bucket,
        server_access_logs_prefix=server_access_logs_prefix,
        lifecycle_rules=lifecycle_rules,
    )


class Storage(Construct):
    def __init__(self, scope: Construct, id: str, *, update_expiry_days: int) -> None:
        super().__init__(scope, id)

        self.access_logs = _private_bucket(
            self,
            "AccessLogs",
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(id="expire-logs", expiration=Duration.days(90))],
        )
        acknowledge(self.access_logs, "AwsSolutions-S1")

        self.data = _private_bucket(
            self,
            "Data",
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=[
                s3.LifecycleRule(id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(1)),
            ],
        )

        # EventBridge notifications set natively on AWS::S3::Bucket (NotificationConfiguration.
        # EventBridgeConfiguration) instead of `event_bridge_enabled=True`, which deploys a
        # custom-resource Lambda (BucketNotificationsHandler) just to flip this switch.
        cfn_data: s3.CfnBucket = self.data.node.default_child  # type: ignore[assignment]
        cfn_data.notification_configuration = s3.CfnBucket.NotificationConfigurationProperty(
            event_bridge_configuration=s3.CfnBucket.EventBridgeConfigurationProperty(event_bridge_enabled=True)
        )

        self.artifacts = _private_bucket(
            self,
            "Artifacts",
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="artifacts/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-worker-updates",
                    prefix="runs/",
                    tag_filters={UPDATE_TAG_KEY: UPDATE_TAG_VALUE},
                    expiration=Duration.days(update_expiry_days),
                ),
                s3.LifecycleRule(id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(1)),
            ],
        )
