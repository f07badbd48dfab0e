"""The gate's decisions published to the team's SNS topic (cdk.json `notify_topic_arn`, set for
the session's engine in conftest.py) on the local engine: a promoted v1 and a rejected v2 each
arrive as one message on an SQS queue subscribed to the topic, as a team would subscribe. (A
refused upload's message: tests/e2e/test_raw_upload.py and test_upload_parts.py, `subscribed`.)"""

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from smlt.local.eventbridge import UploadTrigger, upload_version
from smlt.runtime import keys
from smlt.runtime import pipeline as pl
from smlt.runtime.store import S3Store
from tests.e2e.conftest import NOTIFY_TOPIC
from tests.e2e.test_pipeline import ROWS, _houses, _run


def _messages(sqs, queue, want):
    """The SNS envelopes on `queue`, `want` of them (moto delivers as the publish returns)."""
    got = []
    for _ in range(20):
        resp = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        got += [json.loads(m["Body"]) for m in resp.get("Messages", [])]
        if len(got) >= want:
            break
    return got


@contextmanager
def subscribed(engine, name: str, filter_policy: dict | None = None) -> Iterator[Callable[[int], list[dict]]]:
    """An SQS queue subscribed to the session's topic for the block (with a subscription filter
    policy, as a team selects what it is told); yields `received(want)`: the envelopes so far."""
    sns, sqs = engine.client("sns"), engine.client("sqs")
    queue = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    attributes = {"FilterPolicy": json.dumps(filter_policy)} if filter_policy else {}
    sub = sns.subscribe(TopicArn=NOTIFY_TOPIC, Protocol="sqs", Endpoint=queue_arn, Attributes=attributes)
    try:
        yield lambda want: _messages(sqs, queue, want)
    finally:
        sns.unsubscribe(SubscriptionArn=sub["SubscriptionArn"])
        sqs.delete_queue(QueueUrl=queue)


def test_a_promotion_and_a_rejection_each_publish_one_message(engine_as_aws, tmp_path):
    engine, names = engine_as_aws
    sns, sqs = engine.client("sns"), engine.client("sqs")
    queue = sqs.create_queue(QueueName="decisions")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sub = sns.subscribe(TopicArn=NOTIFY_TOPIC, Protocol="sqs", Endpoint=queue_arn)["SubscriptionArn"]
    try:
        root = tmp_path / "watched"
        job = {
            "name": "notified",
            "dataset": {"uri": "replaced-by-the-trigger"},
            "model": {"name": "logreg"},
            "training": {"max_rounds": 3, "local_steps": 15, "learning_rate": 0.3},
            "workers": {"initial": 2, "memory_mb": 1769},
        }
        (root / "incoming/notified").mkdir(parents=True)
        (root / "incoming/notified/job.json").write_text(json.dumps(job))
        trigger = UploadTrigger(engine, names.data_bucket)
        trigger.prime()
        artifacts = S3Store(names.artifacts_bucket)
        pl.prepare_version(_houses(tmp_path / "v1.csv", 1), str(root / "incoming/notified/v1"), shards=2)
        run1 = _run(engine, upload_version(trigger, root / "incoming/notified/v1", root))
        # v2: the train split's labels shuffled (prepare's split, seed 0): worse, rejected.
        order = np.random.default_rng(0).permutation(ROWS)
        shuffled = order[int(round(ROWS * 0.2)) :]
        pl.prepare_version(_houses(tmp_path / "v2.csv", 2, shuffle_train=shuffled), str(root / "incoming/notified/v2"))
        run2 = _run(engine, upload_version(trigger, root / "incoming/notified/v2", root))

        envelopes = _messages(sqs, queue, 2)
        assert [e["Subject"] for e in envelopes] == ["smlt: notified v1 promoted", "smlt: notified v2 rejected"]
        v1, v2 = (json.loads(e["Message"]) for e in envelopes)
        records = {
            v: pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("notified", v)))
            for v in ("v1", "v2")
        }
        assert records["v2"].status == "rejected" and records["v1"].status == "promoted"
        for body, record, run in ((v1, records["v1"], run1), (v2, records["v2"], run2)):
            assert body["run_id"] == run and body["decision"] == record.status and body["reason"] == record.reason
            assert body["metric"] == "val_accuracy" and body["challenger"] == record.challenger_value
            assert body["champion"] == record.champion_value and body["margin"] == record.margin
            assert body["cost_usd"] == record.cost_usd > 0 and body["model_sha256"] == record.model_sha256
            assert record.notify_error is None
        assert v1["champion"] is None and "no champion" in v1["reason"]
        assert v2["champion"] > v2["challenger"] and v2["champion_version"] == "v1" and "worse by" in v2["reason"]
        attrs = {k: a["Value"] for k, a in envelopes[1]["MessageAttributes"].items()}
        assert attrs == {"pipeline": "notified", "decision": "rejected"}
    finally:
        sns.unsubscribe(SubscriptionArn=sub)
        sqs.delete_queue(QueueUrl=queue)
