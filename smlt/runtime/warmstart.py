"""A warm start's model, checked against the digest recorded when it was published.

A run's final model records its sha256 in the run's META (`final.model_sha256`); a study's best
model is a copy of its best trial's final model; a pipeline's latest names a run's final model.
A warm start from any of these in the stack's artifacts bucket is read and checked before round
0 starts from it, so a model replaced or damaged since it was published is refused
(DigestMismatch) instead of trained on. A model elsewhere (a file the user uploaded) has no
recorded digest and is taken as it is.
"""

from __future__ import annotations

from smlt.runtime import keys
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from smlt.runtime.study.items import StudyTable
from smlt.runtime.tensors.digest import check, sha256_hex

MODEL_NAME = "model.safetensors"


def published_run(table: str, key: str) -> str | None:
    """The run whose final model `key` (of the artifacts bucket) is, or None when it is none."""
    parts = key.split("/")
    if len(parts) < 2 or not parts[1]:
        return None
    if key == keys.final_model_key(parts[1]):
        return parts[1]
    if key == keys.study_best_prefix(parts[1]) + MODEL_NAME:
        study = StudyTable(table, parts[1]).study()
        return study.best_run_id if study is not None else None
    return None


def recorded_sha256(artifacts_bucket: str, table: str, bucket: str, key: str) -> str | None:
    if bucket != artifacts_bucket:
        return None
    run_id = published_run(table, key)
    if run_id is None:
        return None
    meta = RunTable(table, run_id).meta()
    return meta.final.model_sha256 if meta is not None and meta.final is not None else None


def read_checked(artifacts_bucket: str, table: str, uri: str) -> bytes:
    """The warm start's model bytes, refused (DigestMismatch) unless they match the recorded digest."""
    bucket, key = keys.parse_s3_uri(uri)
    blob = S3Store(bucket).get(key)
    check(key, sha256_hex(blob), recorded_sha256(artifacts_bucket, table, bucket, key), "warm_start model")
    return blob
