"""Datasets in the user's own buckets (cdk context `data_buckets`, `data_kms_keys`: docs/deploy.md,
"Datasets in your own buckets"), with the handlers refusing what their role's policies deny, as
AWS does (smlt/local/iam_record.py, `iam_enforced`): a granted bucket trains, an ungranted one
and an object under a KMS key the stack was not given fail naming the object, the role and the
context key that grants it."""

import json
from pathlib import Path

import pytest

from smlt.datasets import local_dataset_folder, upload_dataset
from smlt.local import iam_record
from smlt.runner import execute
from smlt.runtime.errors import RunFailed
from tests.e2e.conftest import DATA_BUCKET_OF_USER, USER_KMS_KEY

ROOT = Path(__file__).resolve().parents[2]
OTHER_KEY = "arn:aws:kms:us-east-1:123456789012:key/0e2e0000-0000-4000-8000-0000000bad00"


def _job(s3, bucket: str, key_arn: str | None = None, folder: str = "") -> dict:
    """A one-round digits job whose dataset is uploaded into `bucket` (copied under `folder` with
    its objects encrypted with SSE-KMS under `key_arn` when given: a uri no handler process has
    read and cached before)."""
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job["training"]["max_rounds"] = 1
    job["workers"].update(initial=2, max=2)
    uri = upload_dataset(local_dataset_folder(job["dataset"]["uri"]), bucket, s3)
    if key_arn:
        prefix = uri.removeprefix(f"s3://{bucket}/")
        for obj in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
            s3.copy_object(
                Bucket=bucket,
                Key=folder + obj["Key"],
                CopySource={"Bucket": bucket, "Key": obj["Key"]},
                ServerSideEncryption="aws:kms",
                SSEKMSKeyId=key_arn,
            )
        uri = f"s3://{bucket}/{folder}{prefix}"
    job["dataset"] = {"uri": uri}
    return job


@pytest.fixture
def user_bucket(local):
    engine, _ = local
    s3 = engine.client("s3")
    s3.create_bucket(Bucket=DATA_BUCKET_OF_USER)
    yield s3
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=DATA_BUCKET_OF_USER):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=DATA_BUCKET_OF_USER, Key=obj["Key"])
    s3.delete_bucket(Bucket=DATA_BUCKET_OF_USER)


def test_a_dataset_in_a_granted_bucket_under_a_granted_key_trains(local, iam_log, iam_enforced, user_bucket, tmp_path):
    engine, names = local
    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    job = _job(user_bucket, DATA_BUCKET_OF_USER, USER_KMS_KEY, "kms/")
    head = user_bucket.head_object(
        Bucket=DATA_BUCKET_OF_USER, Key=job["dataset"]["uri"].rstrip("/").split("/", 3)[3] + "/manifest.json"
    )
    assert head["SSEKMSKeyId"] == USER_KMS_KEY  # what the handlers' GetObject needs kms:Decrypt on
    metrics = execute(engine, names, "user-bucket", job, tmp_path / "out")
    assert metrics["final"]["rounds"] == 1
    calls, _ = iam_record.read(iam_log, start)
    assert not iam_record.check(calls, iam_enforced).denied
    # the planner and the workers read the user's bucket, and S3 decrypted with the user's key for them
    readers = {c["function"] for c in calls for r in c["requests"] if DATA_BUCKET_OF_USER in r["resource"]}
    assert any("Planner" in f for f in readers) and any("TrainStep" in f for f in readers), readers
    assert any(r["action"] == "kms:Decrypt" and r["resource"] == USER_KMS_KEY for c in calls for r in c["requests"])


def test_a_bucket_the_stack_was_not_given_fails_before_any_worker_naming_the_context_key(local, iam_enforced, tmp_path):
    engine, names = local
    s3 = engine.client("s3")
    s3.create_bucket(Bucket="not-granted-e2e")
    with pytest.raises(RunFailed) as failed:
        execute(engine, names, "not-granted", _job(s3, "not-granted-e2e"), tmp_path / "out")
    assert failed.value.error == "AccessDenied"
    cause = failed.value.cause
    assert "not s3://not-granted-e2e/datasets/" in cause and f"s3://{DATA_BUCKET_OF_USER}" in cause
    assert '"data_buckets": ["not-granted-e2e"]' in cause and "deploy again" in cause


def test_an_object_under_a_key_the_stack_was_not_given_names_the_key_the_role_and_data_kms_keys(
    local, iam_enforced, user_bucket, tmp_path
):
    engine, names = local
    with pytest.raises(RunFailed) as failed:
        execute(
            engine,
            names,
            "other-key",
            _job(user_bucket, DATA_BUCKET_OF_USER, OTHER_KEY, "other-key/"),
            tmp_path / "out",
        )
    assert failed.value.error == "AccessDenied"
    cause = failed.value.cause
    print(cause)
    assert f"s3://{DATA_BUCKET_OF_USER}/other-key/datasets/" in cause and OTHER_KEY in cause
    assert "PlannerRole" in cause and f'"data_kms_keys": ["{OTHER_KEY}"]' in cause


def test_a_shard_the_workers_may_not_decrypt_fails_the_run_as_access_denied_not_as_a_corrupt_shard(
    local, iam_log, iam_enforced, user_bucket, tmp_path
):
    """The manifest under the granted key, the shards under another: the planner reads, the
    workers are refused. Data of its own (no handler process has these shards cached)."""
    from smlt.runtime.data.prepare import prepare_dataset
    from tests.e2e.test_pipeline import _houses

    engine, names = local
    folder = tmp_path / "houses-kms"
    prepare_dataset(_houses(tmp_path / "h.csv", 4242), str(folder), shards=2)
    uri = upload_dataset(folder, DATA_BUCKET_OF_USER, user_bucket)
    prefix = uri.removeprefix(f"s3://{DATA_BUCKET_OF_USER}/")
    for obj in user_bucket.list_objects_v2(Bucket=DATA_BUCKET_OF_USER, Prefix=prefix)["Contents"]:
        key = USER_KMS_KEY if obj["Key"].endswith("manifest.json") else OTHER_KEY
        user_bucket.copy_object(
            Bucket=DATA_BUCKET_OF_USER,
            Key=obj["Key"],
            CopySource={"Bucket": DATA_BUCKET_OF_USER, "Key": obj["Key"]},
            ServerSideEncryption="aws:kms",
            SSEKMSKeyId=key,
        )
    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    job = {"name": "kmsshards", "dataset": {"uri": uri}, "training": {"max_rounds": 1, "local_steps": 2}}
    with pytest.raises(RunFailed) as failed:
        execute(engine, names, "kms-shards", job, tmp_path / "out")
    assert failed.value.error == "AccessDenied"
    assert OTHER_KEY in failed.value.cause and "TrainStep" in failed.value.cause
    calls, _ = iam_record.read(iam_log, start)
    refused = [c for c in calls if any(r["resource"] == OTHER_KEY for r in c["requests"])]
    # no retry loop: a few refused reads (each worker's shards, once), not a quorum retry's rounds of them
    assert 1 <= len(refused) <= 6, len(refused)
