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
    from smlt.runtime.pipeline import start_version, version_name

    version = version_name(parts[2:-1])
    # The sequencer tells uploads of the same object apart (a re-upload after a failed run
    # retrains); a duplicated delivery of one event carries the same one.
    upload = f"{key}:{trigger.get('etag', '')}:{trigger.get('sequencer', '')}"
    tag = hashlib.sha1(upload.encode()).hexdigest()[:8]
    run_id = f"{re.sub(r'[^A-Za-z0-9_-]', '-', pipeline)[:28]}-{version}-{tag}"
    job.update(dataset={"uri": f"s3://{bucket}/{folder}/"}, pipeline=pipeline, run_id=run_id)
    warm, _ = start_version(S3Store(bucket), S3Store(artifacts_bucket), pipeline, version, folder, run_id)
    job["warm_start"] = warm
    if warm is None:
        job.pop("warm_start")
    return job
