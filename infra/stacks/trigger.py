"""Retraining trigger: an upload of a pipeline version under `incoming/` starts a training run.

EventBridge rule on the data bucket's "Object Created" events with key
`incoming/<pipeline>/<version>/manifest.json` (a version `smlt data prepare` prepared) or
`incoming/<pipeline>/<version>/_SUCCESS` (the completion marker of a raw version, written after
its data) → StartExecution of the state machine with the input

    {"trigger": {"bucket": "<bucket>", "key": "<key>", "etag": "<etag>", "sequencer": "<sequencer>"}}

A marker's execution first prepares the raw data (PrepareData, smlt/runtime/steps/prepare.py).
The planner turns the trigger into the pipeline's job (`incoming/<pipeline>/job.json`, dataset =
the manifest's folder or the raw version's prepared one, warm start from the pipeline's champion;
`smlt/runtime/trigger.py`). EventBridge cannot name the execution, so a duplicated event starts a
second execution; its run id is the same (derived from key, etag and the upload's sequencer: a new
upload of the same object is a new run), the first conditional write of the run (the planner's
META, a raw upload's PREPARE claim) finds the run owned by another execution, and the execution
ends in `Duplicate` (Succeed) without touching the run. See docs/architecture.md, "Trigger".
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

# incoming/<pipeline>/<version...>/manifest.json and .../_SUCCESS (EventBridge wildcards also match "/").
KEY_WILDCARDS = (keys.upload_key_pattern(keys.MANIFEST), keys.upload_key_pattern(keys.SUCCESS_MARKER))


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
            "VersionUploaded",
            description="Start a training run when s3://<data bucket>/" + " or ".join(KEY_WILDCARDS) + " is written",
            event_pattern=events.EventPattern(
                source=["aws.s3"],
                detail_type=["Object Created"],
                detail={
                    "bucket": {"name": [data_bucket.bucket_name]},
                    "object": {"key": [{"wildcard": w} for w in KEY_WILDCARDS]},
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
