"""Retraining trigger: a manifest uploaded under `incoming/` starts a training run.

EventBridge rule on the data bucket's "Object Created" events with key
`incoming/<pipeline>/<version>/manifest.json` → StartExecution of the state machine with the input

    {"trigger": {"bucket": "<bucket>", "key": "<key>", "etag": "<etag>", "sequencer": "<sequencer>"}}

The planner turns it into the pipeline's job (`incoming/<pipeline>/job.json`, dataset = the
manifest's folder, warm start from the pipeline's latest model; `smlt/runtime/trigger.py`). EventBridge
cannot name the execution, so a duplicated event starts a second execution; its run id is the
same (derived from key, etag and the upload's sequencer: a new upload of the same manifest is a
new run), the planner's conditional write finds the run owned by another
execution and answers `"action": "duplicate"`, and the execution ends in `Duplicate` (Succeed)
without touching the run. See docs/architecture.md, "Trigger". No extra Lambda is involved.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.stacks.nag import acknowledge
from smlt.runtime import keys

INCOMING_PREFIX = keys.INCOMING
MANIFEST_NAME = "manifest.json"
# incoming/<pipeline>/<version...>/manifest.json (EventBridge wildcards also match "/").
KEY_WILDCARD = f"{INCOMING_PREFIX}*/*/{MANIFEST_NAME}"


def trigger_input() -> events.RuleTargetInput:
    return events.RuleTargetInput.from_object(
        {
            "trigger": {
                "bucket": events.EventField.from_path("$.detail.bucket.name"),
                "key": events.EventField.from_path("$.detail.object.key"),
                "etag": events.EventField.from_path("$.detail.object.etag"),
                "sequencer": events.EventField.from_path("$.detail.object.sequencer"),
            }
        }
    )


class RetrainTrigger(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        data_bucket: s3.IBucket,
        state_machine: sfn.IStateMachine,
    ) -> None:
        super().__init__(scope, id)

        # Events EventBridge could not deliver (after its retries) land here for inspection.
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        acknowledge(self.dead_letters, "AwsSolutions-SQS3")

        self.rule = events.Rule(
            self,
            "ManifestUploaded",
            description=f"Start a training run when s3://<data bucket>/{KEY_WILDCARD} is written",
            event_pattern=events.EventPattern(
                source=["aws.s3"],
                detail_type=["Object Created"],
                detail={
                    "bucket": {"name": [data_bucket.bucket_name]},
                    "object": {"key": [{"wildcard": KEY_WILDCARD}]},
                },
            ),
        )
        self.rule.add_target(
            targets.SfnStateMachine(
                state_machine,
                input=trigger_input(),
                dead_letter_queue=self.dead_letters,
                retry_attempts=8,
                max_event_age=Duration.hours(2),
            )
        )
