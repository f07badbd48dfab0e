"""A pipeline on the local engine: v1 (cold) then v2 (warm, through the gate), v2 with a fault."""

import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
os.environ.setdefault("SMLT_HOME", "/tmp/faults/home")
from pathlib import Path

from smlt.local.eventbridge import UploadTrigger
from smlt.runtime import keys
from smlt.runtime.store import S3Store
from tests.e2e.test_pipeline import _houses

TOPIC = "arn:aws:sns:us-east-1:123456789012:smlt-sweep"
JOB = {
    "dataset": {"uri": "replaced-by-the-trigger"},
    "model": {"name": "logreg"},
    "training": {"max_rounds": 2, "local_steps": 5, "learning_rate": 0.3},
    "workers": {"initial": 2, "memory_mb": 1769},
}
TMP = Path("/tmp/faults/data")
TMP.mkdir(parents=True, exist_ok=True)


class World:
    def __init__(self):
        from smlt.runner import start_engine

        os.environ.update(
            {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        )
        self.engine, self.names, _ = start_engine(None, context={"notify_topic_arn": TOPIC})
        os.environ["AWS_ENDPOINT_URL"] = self.engine.endpoint_url
        e = self.engine
        e.client("sns").create_topic(Name=TOPIC.rsplit(":", 1)[1])
        self.sqs = e.client("sqs")
        self.queue = self.sqs.create_queue(QueueName="sweep")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        e.client("sns").subscribe(TopicArn=TOPIC, Protocol="sqs", Endpoint=arn)
        self.trigger = UploadTrigger(e, self.names.data_bucket)
        self.trigger.prime()
        self.s3 = e.client("s3")
        self.messages = []
        for n in (1, 2):
            _houses(TMP / f"v{n}.csv", n)

    def drain(self):
        while True:
            r = self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            ms = r.get("Messages", [])
            if not ms:
                return
            for m in ms:
                self.messages.append(json.loads(json.loads(m["Body"])["Message"]))
                self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=m["ReceiptHandle"])

    def version(self, pipe, v, filt=None):
        b = self.names.data_bucket
        self.s3.put_object(Bucket=b, Key=keys.pipeline_job_key(pipe), Body=json.dumps({**JOB, "name": pipe}).encode())
        self.s3.put_object(Bucket=b, Key=f"incoming/{pipe}/{v}/data.csv", Body=(TMP / f"{v}.csv").read_bytes())
        self.s3.put_object(Bucket=b, Key=f"incoming/{pipe}/{v}/_SUCCESS", Body=b"")
        self.engine.invoke_filter = filt
        try:
            (arn,) = self.trigger.poll()
            desc = self.engine.wait(arn, interval=0.1)
        finally:
            self.engine.invoke_filter = None
        time.sleep(0.3)
        self.drain()
        return desc

    def outcome(self, pipe, v, desc):
        art = S3Store(self.names.artifacts_bucket)
        out = {"status": desc["status"], "error": desc.get("error")}
        try:
            rec = json.loads(art.get(keys.pipeline_version_key(pipe, v)))
            out.update(
                rec_status=rec["status"],
                promoted=rec["promoted"],
                value=rec.get("challenger_value"),
                champion_value=rec.get("champion_value"),
                notify_error=rec.get("notify_error"),
                reason=rec.get("reason"),
            )
            run = rec["run_id"]
            m = json.loads(art.get(keys.final_metrics_key(run)))["final"]
            out.update(model=m.get("model_sha256", "")[:12], rounds=m["rounds"], val=m.get("val_accuracy"))
            ddb = self.engine.client("dynamodb")
            items = ddb.query(
                TableName=self.names.table,
                KeyConditionExpression="pk = :p",
                ExpressionAttributeValues={":p": {"S": f"RUN#{run}"}},
            )["Items"]
            out["meta"] = next((i["status"]["S"] for i in items if i["sk"]["S"] == "META"), None)
            out["items"] = sorted({i["sk"]["S"].split("#")[0] for i in items} - {"ATTEMPT"})
        except Exception as e:
            out["read_error"] = repr(e)[:100]
        try:
            out["latest"] = json.loads(art.get(keys.pipeline_latest_key(pipe)))["version"]
        except Exception:
            out["latest"] = None
        out["messages"] = [m["decision"] for m in self.messages if m["pipeline"] == pipe and m["version"] == v]
        return out


def crash_nth(kind, nth, k, seen=None):
    """Crash the nth invocation (1-based) of `kind` right after write k."""
    count = {"n": 0}

    def kind_of(p):
        if not isinstance(p, dict) or "worker" in p:
            return None
        op = p.get("op")
        if op is None:
            return "aggregate" if "outcomes" in p else None
        return op

    def filt(function, payload):
        if kind_of(payload) == kind:
            count["n"] += 1
            if count["n"] == nth:
                return k if isinstance(k, str) else f"crash:{k}"
        return "ok"

    return filt
