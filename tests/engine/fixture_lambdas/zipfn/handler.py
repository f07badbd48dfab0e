"""Fixture zip function (planner + aggregate). Reads its configuration from the environment at
call time, reaches S3 and DynamoDB through the endpoint the local engine sets."""

import json
import os

import boto3


class InvalidJob(Exception):
    pass


def _s3():
    return boto3.client("s3")


def _table():
    return boto3.resource("dynamodb").Table(os.environ["SMLT_TABLE"])


def _plan(event):
    job, run_id = event["job"], event["execution"]
    if job.get("invalid"):
        raise InvalidJob(f"job.{job['invalid']}: field required")
    r = _table().update_item(
        Key={"pk": f"RUN#{run_id}", "sk": "META"},
        UpdateExpression="ADD #r :one",
        ExpressionAttributeNames={"#r": "round"},
        ExpressionAttributeValues={":one": 1},
        ReturnValues="UPDATED_NEW",
    )
    rnd = int(r["Attributes"]["round"]) - 1
    workers = [{"i": i, "mode": m} for i, m in enumerate(job["workers"])]
    spec = {
        "action": "stop" if rnd >= job["rounds"] else "train",
        "run_id": run_id,
        "round": rnd,
        "workers": workers,
        "function_name": json.loads(os.environ["FIXTURE_TRAIN_FUNCTIONS"])[job.get("tier", "small")],
        "max_concurrency": job["max_concurrency"],
        "worker_timeout_s": job.get("worker_timeout_s", 60),
    }
    _s3().put_object(
        Bucket=os.environ["SMLT_ARTIFACTS_BUCKET"],
        Key=f"runs/{run_id}/rounds/{rnd:06d}/plan.json",
        Body=json.dumps(spec),
    )
    if job.get("plan_pad"):
        spec["pad"] = "p" * int(job["plan_pad"])
    return spec


def _aggregate(event):
    run_id, rnd = event["run_id"], event["round"]
    outcomes = event["outcomes"]
    _s3().put_object(
        Bucket=os.environ["SMLT_ARTIFACTS_BUCKET"],
        Key=f"runs/{run_id}/rounds/{rnd:06d}/summary.json",
        Body=json.dumps(outcomes),
    )
    ok = sum(1 for o in outcomes if o.get("ok"))
    _table().put_item(Item={"pk": f"RUN#{run_id}", "sk": f"ROUND#{rnd:06d}", "workers_ok": ok})
    return {"round": rnd, "stop": rnd + 1 >= event["rounds"], "workers_ok": ok}


def _finalize(event):
    run_id = event["run_id"]
    _s3().put_object(Bucket=os.environ["SMLT_ARTIFACTS_BUCKET"], Key=f"runs/{run_id}/final.json", Body=b"{}")
    return {"final": True}


def handler(event, context):
    op = event.get("op")
    if op == "plan":
        return _plan(event)
    if op == "aggregate":
        return _aggregate(event)
    if op == "finalize":
        return _finalize(event)
    if op == "echo":
        return {
            "event": event,
            "function_name": context.function_name,
            "memory": context.memory_limit_in_mb,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("SMLT_", "FIXTURE_", "AWS_"))},
        }
    raise ValueError(f"unknown op {op!r}")
