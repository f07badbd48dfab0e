"""Retraining on upload: turn an S3 "Object Created" event for a manifest into a job.

Layout in the data bucket:

    incoming/<pipeline>/job.json                 the pipeline's job (its dataset.uri is replaced)
    incoming/<pipeline>/<version>/manifest.json  a new version of the data (+ its shards)

The run id derives from the object (pipeline, version, etag), so a duplicated event maps to the
same run and the planner starts nothing new. The run warm-starts from the pipeline's latest
model (`pipelines/<pipeline>/latest.json` in the artifacts bucket, written when a run finishes).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from smlt.runtime import keys
from smlt.runtime.errors import InvalidJob
from smlt.runtime.store import NotFound, S3Store

latest_key = keys.pipeline_latest_key


def job_from_trigger(trigger: dict[str, Any], artifacts_bucket: str) -> dict[str, Any]:
    bucket, key = trigger.get("bucket"), trigger.get("key", "")
    parts = key.split("/")
    if not bucket or len(parts) < 4 or parts[0] != "incoming" or parts[-1] != "manifest.json":
        raise InvalidJob(
            f"trigger: expected s3://DATA/incoming/<pipeline>/<version>/manifest.json, got s3://{bucket}/{key}"
        )
    pipeline, folder = parts[1], "/".join(parts[:-1])
    try:
        job = json.loads(S3Store(bucket).get(keys.pipeline_job_key(pipeline)))
    except NotFound:
        raise InvalidJob(
            f"trigger: pipeline {pipeline!r} has no job: upload s3://{bucket}/incoming/{pipeline}/job.json"
        ) from None
    except json.JSONDecodeError as e:
        raise InvalidJob(f"trigger: incoming/{pipeline}/job.json is not valid JSON ({e.msg})") from None
    version = re.sub(r"[^A-Za-z0-9_-]", "-", "-".join(parts[2:-1]))[:40]
    tag = hashlib.sha1(f"{key}:{trigger.get('etag', '')}".encode()).hexdigest()[:8]
    job.update(
        dataset={"uri": f"s3://{bucket}/{folder}/"},
        pipeline=pipeline,
        run_id=f"{re.sub(r'[^A-Za-z0-9_-]', '-', pipeline)[:28]}-{version}-{tag}",
    )
    try:
        latest = json.loads(S3Store(artifacts_bucket).get(latest_key(pipeline)))
        job["warm_start"] = latest["model"]
    except NotFound:
        job.pop("warm_start", None)
    return job
