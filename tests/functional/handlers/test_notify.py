"""The team's notifications on moto's SNS. Finalize's: a decided version's message, and a publish
that fails kept on the version's record without failing anything (the whole path runs on the
local engine in tests/e2e/test_notify.py). PrepareData's: a refused upload's message, published
before the same named error fails the step, by the single function and by the step after a parts'
Map (on the local engine: tests/e2e/test_raw_upload.py and test_upload_parts.py)."""

from __future__ import annotations

import json

import boto3
import pytest

from smlt.runtime import keys
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.notify import Refusal, decision_message, refusal_message, refusal_told
from smlt.runtime.pipeline import VersionRecord
from smlt.runtime.steps import prepare as p
from smlt.runtime.steps import prepare_parts
from smlt.runtime.steps.events import MergeEvent, PartStatsEvent
from smlt.runtime.steps.finalize import _notify
from smlt.runtime.steps.prepare_limits import NoDataFile
from smlt.runtime.store import S3Store
from smlt.runtime.trigger import upload_of
from tests.functional.handlers.test_prepare_data import _csv, _event

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
    assert json.loads(envelope["Message"])["champion"] == 0.9
    stored = _stored(artifacts)
    assert stored.notified_at is not None and stored.model_copy(update={"notified_at": None}) == RECORD
    # A retried Finalize (its first attempt died after the publish) reads the stored record: nothing sent again.
    _notify(artifacts, topic, stored)
    assert sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []) == []


def test_a_failed_publish_is_kept_on_the_record_and_raises_nothing(aws, caplog):
    artifacts = S3Store("smlt-artifacts")
    artifacts.put(keys.pipeline_version_key("houses", "v3"), RECORD.model_dump_json().encode())
    missing = "arn:aws:sns:us-east-1:123456789012:deleted"
    _notify(artifacts, missing, RECORD)
    stored = _stored(artifacts)
    assert stored.notify_error is not None and stored.notify_error.startswith(f"{missing}: NotFoundException")
    assert stored.model_copy(update={"notify_error": None}) == RECORD  # the decision unchanged
    assert "the decision on houses v3 was not published" in caplog.text
    # A retried Finalize tries again: the decision is told at least once.
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="team")["TopicArn"]
    queue = sqs.create_queue(QueueName="q")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    _notify(artifacts, topic, stored)
    assert len(sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]) == 1
    assert _stored(artifacts).notify_error is None and _stored(artifacts).notified_at is not None


# --- a refused upload (PrepareData) ---

MARKER = "incoming/h/v1/_SUCCESS"
JOB = {"name": "h", "dataset": {"uri": "x", "label": "price", "task": "regression"}, "model": {"name": "mlp"}}


def _subscribed(refusals_only: bool = True) -> tuple[str, str]:
    """(the team's topic, an SQS queue subscribed to it: the refusals alone by a filter policy)."""
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="team")["TopicArn"]
    queue = sqs.create_queue(QueueName="refusals")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = {"FilterPolicy": json.dumps({"decision": ["refused"]})} if refusals_only else {}
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes=policy)
    return topic, queue


def _envelopes(queue: str) -> list[dict]:
    got = boto3.client("sqs").receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in got]


@pytest.fixture
def upload(aws):
    aws.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps(JOB).encode())
    aws.put_object(Bucket="smlt-data", Key=MARKER, Body=b"")
    return aws


def test_a_refusals_message_names_the_version_its_error_upload_and_execution():
    refusal = Refusal("h", "v1", "NoDataFile", "s3://d/incoming/h/v1/ has ... no data", "s3://d/" + MARKER, "r", "e")
    subject, body = refusal_message(refusal)
    assert subject == "smlt: h v1 refused"
    assert body == {
        "pipeline": "h",
        "version": "v1",
        "decision": "refused",
        "error": "NoDataFile",
        "message": "s3://d/incoming/h/v1/ has ... no data",
        "upload": "s3://d/incoming/h/v1/_SUCCESS",
        "run_id": "r",
        "execution": "e",
    }


def test_a_refused_upload_is_told_to_the_topic_and_fails_with_the_same_error(upload):
    topic, queue = _subscribed()
    upload.put_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv", Body=b"size,city,price\n1.0,a,\n2.0,b,x\n")
    with pytest.raises(InvalidDataset) as e:
        p.prepare_upload(p.PrepareSettings(notify_topic_arn=topic), _event(MARKER))
    assert type(e.value) is InvalidDataset
    message = "s3://smlt-data/incoming/h/v1/houses.csv: column 'price', line 3: 'x' is not a number"
    assert str(e.value).startswith(message)  # named as without a topic (test_prepare_data.py)
    (envelope,) = _envelopes(queue)
    assert envelope["Subject"] == "smlt: h v1 refused"
    body = json.loads(envelope["Message"])
    assert body == {
        "pipeline": "h",
        "version": "v1",
        "decision": "refused",
        "error": "InvalidDataset",
        "message": str(e.value),
        "upload": f"s3://smlt-data/{MARKER}",
        "run_id": upload_of(_event(MARKER).trigger).run_id,
        "execution": "exec-1",
    }
    attrs = {k: a["Value"] for k, a in envelope["MessageAttributes"].items()}
    assert attrs == {"pipeline": "h", "decision": "refused"}


def test_a_refusal_not_published_is_logged_and_the_error_is_the_steps(upload, caplog):
    missing = "arn:aws:sns:us-east-1:123456789012:deleted"
    with pytest.raises(NoDataFile, match=r"incoming/h/v1/ has a _SUCCESS marker but no data"):
        p.prepare_upload(p.PrepareSettings(notify_topic_arn=missing), _event(MARKER))
    assert f"the refusal of h v1 was not published: {missing}: NotFoundException" in caplog.text


def test_without_a_topic_or_for_a_prepared_upload_nothing_is_published(upload):
    _, queue = _subscribed(refusals_only=False)
    with pytest.raises(NoDataFile):
        p.prepare_upload(p.PrepareSettings(), _event(MARKER))
    upload.put_object(Bucket="smlt-data", Key="incoming/h/v2/houses.csv", Body=_csv(1))
    answer = p.prepare_upload(p.PrepareSettings(), _event("incoming/h/v2/_SUCCESS"))
    assert answer.action == "plan" and _envelopes(queue) == []


def test_a_refusal_that_cannot_be_described_is_logged_and_the_error_raised_unchanged(caplog):
    error = NoDataFile("nothing here")

    def undescribed(e: InvalidDataset) -> Refusal:
        raise KeyError("where")

    with pytest.raises(NoDataFile) as raised, refusal_told("arn:aws:sns:us-east-1:1:t", undescribed):
        raise error
    assert raised.value is error
    assert "the refusal (NoDataFile) was not published: KeyError" in caplog.text


def test_a_parts_error_is_told_by_the_step_after_the_map_which_raises_it(upload):
    topic, queue = _subscribed()
    bad = _csv(2).decode().splitlines()
    bad[3] = bad[3].rsplit(",", 1)[0] + ",x"  # line 4 of part 1 (the header is line 1): a price that is text
    upload.put_object(Bucket="smlt-data", Key="incoming/h/v1/part-00000.csv", Body=_csv(1))
    upload.put_object(Bucket="smlt-data", Key="incoming/h/v1/part-00001.csv", Body=("\n".join(bad) + "\n").encode())
    started = p.prepare_upload(p.PrepareSettings(notify_topic_arn=topic), _event(MARKER, execution="exec-9"))
    assert started.action == "parts" and started.bucket and started.folder and _envelopes(queue) == []
    steps = {"run_id": started.run_id, "bucket": started.bucket, "folder": started.folder, "execution": "exec-9"}
    results: list[dict] = []
    for item in started.parts:  # the Map's children: a child's error is the Map's result, told to no one
        child = PartStatsEvent.model_validate({"op": "part_stats", **item.model_dump(), **steps})
        try:
            results.append(prepare_parts.handle(child, topic))
        except InvalidDataset as failed:
            results.append({**item.model_dump(), "error": type(failed).__name__})
    assert _envelopes(queue) == []
    with pytest.raises(InvalidDataset) as e:
        prepare_parts.handle(MergeEvent.model_validate({"op": "merge_stats", "results": results, **steps}), topic)
    assert type(e.value).__name__ == "InvalidDataset"
    assert str(e.value).startswith(
        "s3://smlt-data/incoming/h/v1/part-00001.csv: column 'price', line 4: 'x' is not a number"
    )
    (envelope,) = _envelopes(queue)
    body = json.loads(envelope["Message"])
    assert envelope["Subject"] == "smlt: h v1 refused" and body["message"] == str(e.value)
    assert body["error"] == "InvalidDataset" and body["upload"] == f"s3://smlt-data/{MARKER}"
    assert body["run_id"] == started.run_id and body["execution"] == "exec-9" and body["version"] == "v1"


def test_a_parts_final_failure_is_raised_under_a_name_no_retrier_of_the_step_takes(upload):
    """A part throttled out (or dead, or timed out) stored no error: MergeStats raises it as
    PartFailed, naming the part and its error. Raised by its own name (`Throttled`), the step's
    Throttled retrier ran MergeStats 3 more times, each reading the same final failure."""
    from infra.stacks.workflow import LAMBDA_SERVICE_ERRORS, LAMBDA_THROTTLED, PROCESS_DIED, THROTTLED

    topic, queue = _subscribed()
    for i in range(2):
        upload.put_object(Bucket="smlt-data", Key=f"incoming/h/v1/part-{i:05d}.csv", Body=_csv(1))
    started = p.prepare_upload(p.PrepareSettings(notify_topic_arn=topic), _event(MARKER, execution="exec-3"))
    steps = {"run_id": started.run_id, "bucket": started.bucket, "folder": started.folder, "execution": "exec-3"}
    retried = {*LAMBDA_SERVICE_ERRORS, *LAMBDA_THROTTLED, *PROCESS_DIED, *THROTTLED}
    for error in ("Throttled", "Runtime.ExitError", "Lambda.TooManyRequestsException", "Sandbox.Timedout"):
        results = [{"part": 0, "rows": 40}, {**started.parts[1].model_dump(), "error": error}]
        with pytest.raises(prepare_parts.PartFailed) as e:
            prepare_parts.handle(MergeEvent.model_validate({"op": "merge_stats", "results": results, **steps}), topic)
        assert type(e.value).__name__ == "PartFailed" not in retried
        assert str(e.value).startswith(
            f"s3://smlt-data/incoming/h/v1/part-00001.csv: its preparation failed with {error} (after the part's own "
        ), str(e.value)
    (envelope,) = _envelopes(queue)  # told once, by the first step that raised it
    assert json.loads(envelope["Message"])["error"] == "PartFailed"


def test_a_version_refused_at_its_runs_first_plan_is_told_once_per_run(upload):
    """After PrepareData (or for a prepared upload, in its place) the run's first Plan refuses a
    version whose job cannot run on it: told to the topic once, however often the event comes."""
    from smlt.runtime.errors import InvalidJob
    from smlt.runtime.trigger import job_from_trigger

    topic, queue = _subscribed()
    upload.put_object(Bucket="smlt-data", Key="incoming/h/v1/houses.csv", Body=_csv(1))
    assert p.prepare_upload(p.PrepareSettings(notify_topic_arn=topic), _event(MARKER)).action == "plan"
    assert _envelopes(queue) == []  # prepared: nothing refused yet
    # the pipeline's job now names another label than the features the version was prepared with
    upload.put_object(
        Bucket="smlt-data", Key="incoming/h/job.json", Body=json.dumps({**JOB, "dataset": {"label": "size"}}).encode()
    )
    trigger = _event(MARKER).trigger
    for _ in range(2):  # the event delivered twice (or Plan retried): one message
        with pytest.raises(InvalidJob, match=r"incoming/h/job.json against version v1: dataset.label") as e:
            job_from_trigger(trigger, "smlt-artifacts", notify_topic_arn=topic, execution="exec-1")
    (envelope,) = _envelopes(queue)
    assert envelope["Subject"] == "smlt: h v1 refused"
    body = json.loads(envelope["Message"])
    assert body["error"] == "InvalidJob" and body["message"] == str(e.value) and body["execution"] == "exec-1"
    assert body["run_id"] == upload_of(trigger).run_id and body["upload"] == f"s3://smlt-data/{MARKER}"
    told = json.loads(S3Store("smlt-artifacts").get(f"runs/{upload_of(trigger).run_id}/refused.json"))
    assert told == body  # the run's refusal, kept where its run's objects are
    # a bad job.json is the pipeline's, not a version's refusal: not told (as at PrepareData)
    upload.put_object(Bucket="smlt-data", Key="incoming/h/job.json", Body=b"{not json")
    with pytest.raises(InvalidJob, match="is not valid JSON"):
        job_from_trigger(_event(MARKER, sequencer="0A2").trigger, "smlt-artifacts", notify_topic_arn=topic)
    assert _envelopes(queue) == []
