"""Finalize's notification on moto's SNS: a decided version's message, and a publish that fails
kept on the version's record without failing anything (the whole path runs on the local engine
in tests/e2e/test_notify.py)."""

from __future__ import annotations

import json

import boto3

from smlt.runtime import keys
from smlt.runtime.notify import decision_message
from smlt.runtime.pipeline import VersionRecord
from smlt.runtime.steps.finalize import _notify
from smlt.runtime.store import S3Store

RECORD = VersionRecord(
    pipeline="houses",
    version="v3",
    data="s3://smlt-data/prepared/houses/v3/t/",
    run_id="r3",
    status="rejected",
    features="f",
    generation=1,
    champion_run="r1",
    champion_version="v1",
    metric="val_accuracy",
    challenger_value=0.61,
    champion_value=0.9,
    margin=0.0,
    reason="val_accuracy 0.61 vs the champion v1's 0.9 on the same rows: worse by 0.29, more than the margin 0",
    cost_usd=0.0012,
    model="s3://smlt-artifacts/runs/r3/final/model.safetensors",
    model_sha256="ab" * 32,
)


def _stored(artifacts):
    return VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("houses", "v3")))


def test_the_decision_arrives_on_a_subscribed_queue_and_nothing_is_rewritten(aws):
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="team")["TopicArn"]
    queue = sqs.create_queue(QueueName="q")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    artifacts = S3Store("smlt-artifacts")
    artifacts.put(keys.pipeline_version_key("houses", "v3"), RECORD.model_dump_json().encode())
    _notify(artifacts, topic, RECORD)
    (m,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    envelope = json.loads(m["Body"])
    assert envelope["Subject"] == "smlt: houses v3 rejected"
    assert json.loads(envelope["Message"]) == decision_message(RECORD)[1]
    assert json.loads(envelope["Message"])["champion"] == 0.9 and _stored(artifacts) == RECORD


def test_a_failed_publish_is_kept_on_the_record_and_raises_nothing(aws, caplog):
    artifacts = S3Store("smlt-artifacts")
    artifacts.put(keys.pipeline_version_key("houses", "v3"), RECORD.model_dump_json().encode())
    missing = "arn:aws:sns:us-east-1:123456789012:deleted"
    _notify(artifacts, missing, RECORD)
    stored = _stored(artifacts)
    assert stored.notify_error is not None and stored.notify_error.startswith(f"{missing}: NotFoundException")
    assert stored.model_copy(update={"notify_error": None}) == RECORD  # the decision unchanged
    assert "the decision on houses v3 was not published" in caplog.text
