"""Fixture container-image function (the train_step stand-in). Behaviour per worker mode."""

import json
import os
import time

import boto3


class Flaky(Exception):
    pass


class WorkerBoom(Exception):
    pass


def _ok(run_id, rnd, i, t_start):
    boto3.client("s3").put_object(
        Bucket=os.environ["SMLT_ARTIFACTS_BUCKET"],
        Key=f"runs/{run_id}/rounds/{rnd:06d}/updates/{i:05d}.json",
        Body=json.dumps({"worker": i, "tier": os.environ["FIXTURE_TIER"]}),
    )
    boto3.resource("dynamodb").Table(os.environ["SMLT_TABLE"]).put_item(
        Item={
            "pk": f"RUN#{run_id}",
            "sk": f"WORKER#{rnd:06d}#{i:05d}",
            "pid": os.getpid(),
            "t_start": str(t_start),
            "t_end": str(time.time()),
            "function": context_name(),
        }
    )
    return {"worker": i, "samples": 10}


def context_name():
    return os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "")


def handler(event, context):
    t_start = time.time()
    run_id, rnd, w = event["run_id"], event["round"], event["worker"]
    i, mode = w["i"], w["mode"]
    name, _, arg = mode.partition(":")
    if name == "ok":
        return _ok(run_id, rnd, i, t_start)
    if name == "flaky":
        r = (
            boto3.resource("dynamodb")
            .Table(os.environ["SMLT_TABLE"])
            .update_item(
                Key={"pk": f"RUN#{run_id}", "sk": f"FLAKY#{rnd:06d}#{i:05d}"},
                UpdateExpression="ADD attempts :one",
                ExpressionAttributeValues={":one": 1},
                ReturnValues="UPDATED_NEW",
            )
        )
        n = int(r["Attributes"]["attempts"])
        if n <= int(arg):
            raise Flaky(f"attempt {n} of worker {i} fails on purpose")
        return _ok(run_id, rnd, i, t_start)
    if name == "boom":
        raise WorkerBoom(f"worker {i} exploded")
    if name == "sleep":
        time.sleep(float(arg))
        return _ok(run_id, rnd, i, t_start)
    if name == "big":
        return {"worker": i, "blob": "b" * (int(arg) * 1024)}
    if name == "exit":
        os._exit(3)
    raise ValueError(f"unknown mode {mode!r}")
