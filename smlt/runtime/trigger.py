"""Retraining on upload: turn an S3 "Object Created" event of a pipeline version into its run.

Layout in the data bucket:

    incoming/<pipeline>/job.json                 the pipeline's job (its dataset.uri is replaced)
    incoming/<pipeline>/<version>/manifest.json  a version prepared by `smlt data prepare` (+ its shards)
    incoming/<pipeline>/<version>/_SUCCESS       a raw version's completion marker, written after its
                                                 data (a CSV, Parquet or NPZ file, an image folder, a
                                                 zip/tar of one); the state machine's Prepare step
                                                 prepares it into prepared/<pipeline>/<version>/<tag>/

The run id derives from the object (pipeline, version, key, ETag, sequencer), so a duplicated
event maps to the same run and starts nothing new, and a new upload of the same object (a new
sequencer) is a new run. The run warm-starts from the pipeline's champion
(`pipelines/<pipeline>/latest.json` in the artifacts bucket; smlt.runtime.pipeline).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_settings import BaseSettings

from smlt.runtime import keys
from smlt.runtime.config import ENV
from smlt.runtime.errors import InvalidDataset, InvalidJob
from smlt.runtime.store import NotFound, S3Store

if TYPE_CHECKING:
    from smlt.runtime.data.manifest import Manifest
    from smlt.runtime.notify import Refusal


class _TopicSettings(BaseSettings):
    """The planner's team topic (Settings.notify_topic_arn), read here when the caller does not pass it."""

    model_config = ENV
    notify_topic_arn: str = ""


@dataclass(frozen=True)
class Upload:
    """The upload an event names: a prepared version's manifest or a raw version's marker."""

    bucket: str
    key: str
    pipeline: str
    version: str
    folder: str  # incoming/<pipeline>/<version...>, no trailing slash
    raw: bool  # a _SUCCESS marker: the data beside it is prepared in the cloud
    tag: str  # tells uploads of the same key apart
    run_id: str

    @property
    def dataset_folder(self) -> str:
        """Where the run's prepared dataset is: the version's folder, or a raw upload's own
        prepared/ prefix."""
        return keys.prepared_prefix(self.pipeline, self.version, self.tag).rstrip("/") if self.raw else self.folder

    @property
    def dataset_uri(self) -> str:
        return f"s3://{self.bucket}/{self.dataset_folder}/"


def upload_of(trigger: dict[str, Any]) -> Upload:
    """The upload of a trigger ({bucket, key, etag, sequencer}); InvalidJob for a key outside
    incoming/<pipeline>/<version>/{manifest.json,_SUCCESS}."""
    bucket, key = trigger.get("bucket"), str(trigger.get("key", ""))
    parts = key.split("/")
    names = (keys.MANIFEST, keys.SUCCESS_MARKER)
    if (
        not bucket
        or len(parts) < 4
        or f"{parts[0]}/" != keys.INCOMING
        or parts[-1] not in names
        or not all(parts[1:-1])
    ):
        raise InvalidJob(
            f"trigger: expected s3://DATA/{keys.INCOMING}<pipeline>/<version>/{keys.MANIFEST} or "
            f"{keys.SUCCESS_MARKER}, got s3://{bucket}/{key}"
        )
    from smlt.runtime.pipeline import version_name

    pipeline, version = parts[1], version_name(parts[2:-1])
    # The sequencer tells uploads of the same object apart (a re-upload after a failed run
    # retrains); a duplicated delivery of one event carries the same one.
    upload = f"{key}:{trigger.get('etag', '')}:{trigger.get('sequencer', '')}"
    tag = hashlib.sha1(upload.encode()).hexdigest()[:8]
    run_id = f"{re.sub(r'[^A-Za-z0-9_-]', '-', pipeline)[:28]}-{version}-{tag}"
    return Upload(
        bucket=str(bucket),
        key=key,
        pipeline=pipeline,
        version=version,
        folder="/".join(parts[:-1]),
        raw=parts[-1] == keys.SUCCESS_MARKER,
        tag=tag,
        run_id=run_id,
    )


def pipeline_job(bucket: str, pipeline: str) -> dict[str, Any]:
    """The pipeline's job (incoming/<pipeline>/job.json), as uploaded; InvalidJob naming what to
    upload when it is missing or not a JSON object."""
    try:
        job = json.loads(S3Store(bucket).get(keys.pipeline_job_key(pipeline)))
    except NotFound:
        raise InvalidJob(
            f"trigger: pipeline {pipeline!r} has no job: upload s3://{bucket}/{keys.pipeline_job_key(pipeline)}"
        ) from None
    except json.JSONDecodeError as e:
        raise InvalidJob(f"trigger: {keys.pipeline_job_key(pipeline)} is not valid JSON ({e.msg})") from None
    if not isinstance(job, dict):
        raise InvalidJob(f"trigger: {keys.pipeline_job_key(pipeline)} is not a JSON object (a job)")
    return job


def run_job(upload: Upload, job: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's job as the upload's run: its dataset (the job's source options kept), the
    pipeline and the run id."""
    dataset = job.get("dataset")
    options = {k: v for k, v in dataset.items() if k != "uri"} if isinstance(dataset, dict) else {}
    return {
        **job,
        "dataset": {**options, "uri": upload.dataset_uri},
        "pipeline": upload.pipeline,
        "run_id": upload.run_id,
    }


def job_from_trigger(
    trigger: dict[str, Any], artifacts_bucket: str, *, notify_topic_arn: str | None = None, execution: str = ""
) -> dict[str, Any]:
    """The upload's run's job, its version recorded (`start_version`). A version refused here (a
    data error: the same rows as an earlier version, other features, shards not uploaded; or a job
    that cannot run on it: its label, task, batch or model) is told to the team's topic
    (`notify_topic_arn`; None: the function's SMLT_NOTIFY_TOPIC_ARN) once per run
    (smlt.runtime.notify.refusal_told_once), then raised; a bad or missing job.json is not told."""
    upload = upload_of(trigger)
    job = run_job(upload, pipeline_job(upload.bucket, upload.pipeline))
    from smlt.runtime.job import check_dataset, parse_job
    from smlt.runtime.notify import refusal_told_once
    from smlt.runtime.pipeline import start_version

    # The job checked against the version before the version is recorded: a job that cannot run
    # on it (another label or task, a batch larger than its rows, another model than the
    # champion's) fails the execution by name and leaves no version "starting" forever.
    parsed = parse_job(job)

    def check(manifest: Manifest) -> None:
        try:
            check_dataset(parsed, manifest)
        except InvalidJob as e:
            fixed = str(e).startswith(("dataset.label", "dataset.task"))
            raise InvalidJob(
                f"{keys.pipeline_job_key(upload.pipeline)} against version {upload.version}: {e}"
                + (
                    " (a pipeline's label and task are its features', fixed by its first version: to change them, "
                    "prepare the version with `smlt data prepare SOURCE --out .../incoming/<pipeline>/<version>/ "
                    "--new-features`, a new generation)"
                    if fixed
                    else ""
                )
            ) from None

    topic = _TopicSettings().notify_topic_arn if notify_topic_arn is None else notify_topic_arn
    artifacts = S3Store(artifacts_bucket)
    with refusal_told_once(topic, lambda e: refusal_of(upload, execution, e), (InvalidDataset, InvalidJob), artifacts):
        warm, _ = start_version(
            S3Store(upload.bucket),
            artifacts,
            upload.pipeline,
            upload.version,
            upload.dataset_folder,
            upload.run_id,
            check=check,
            model=parsed.model.model_dump(mode="json"),
            job=parsed.model_dump(mode="json"),
        )
    if warm is not None:
        job["warm_start"] = warm
    else:
        job.pop("warm_start", None)
    return job


def refusal_of(upload: Upload, execution: str, error: Exception) -> Refusal:
    """The upload's refusal by `error`, as the team's topic is told it (smlt.runtime.notify)."""
    from smlt.runtime.notify import Refusal

    return Refusal(
        pipeline=upload.pipeline,
        version=upload.version,
        error=type(error).__name__,
        message=str(error),
        upload=f"s3://{upload.bucket}/{upload.key}",
        run_id=upload.run_id,
        execution=execution,
    )
