"""Handlers on moto: real S3 and DynamoDB emulation, the real digits data, no AWS."""

import json

import boto3
import pytest
from moto import mock_aws

from smlt.runtime.data.prepare import prepare_dataset

TIERS = {1769: "smlt-train-1769", 3008: "smlt-train-3008"}


@pytest.fixture
def aws(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("SMLT_CACHE_DIR", str(tmp_path / "cache"))
    with mock_aws():
        # Cached clients must be made inside the mock.
        from smlt.runtime import clients
        from smlt.runtime.data.shards import read_manifest
        from smlt.runtime.records import create_run_table

        clients.reset(), read_manifest.cache_clear()
        s3 = boto3.client("s3")
        for b in ("smlt-artifacts", "smlt-data"):
            s3.create_bucket(Bucket=b)
        create_run_table(boto3.client("dynamodb"), "smlt-runs")
        monkeypatch.setenv("SMLT_ARTIFACTS_BUCKET", "smlt-artifacts")
        monkeypatch.setenv("SMLT_DATA_BUCKET", "smlt-data")
        monkeypatch.setenv("SMLT_TABLE", "smlt-runs")
        monkeypatch.setenv("SMLT_TRAIN_FUNCTIONS", json.dumps({str(k): v for k, v in TIERS.items()}))
        monkeypatch.setenv("SMLT_MEMORY_MB", "1769")
        yield s3
        clients.reset(), read_manifest.cache_clear()


@pytest.fixture
def digits(aws):
    prepare_dataset("sklearn:digits", "s3://smlt-data/datasets/digits/", shards=8)
    return "s3://smlt-data/datasets/digits/"


def job(uri, **training):
    return {
        "name": "t",
        "dataset": {"uri": uri},
        "training": {"local_steps": 20, "max_rounds": 30, "target_value": 0.95, **training},
        "workers": {"initial": 4, "memory_mb": 1769},
    }


def run_keys(s3, run_id):
    resp = s3.list_objects_v2(Bucket="smlt-artifacts", Prefix=f"runs/{run_id}/")
    return sorted(o["Key"] for o in resp.get("Contents", []))


def reconciled(run_id: str) -> list:
    """What the reconciliation finds wrong with a run (smlt.reconcile: every update stored, applied
    once, in the model): [] for a clean run."""
    from smlt.reconcile import reconcile

    return reconcile(boto3.client("s3"), boto3.client("dynamodb"), "smlt-artifacts", "smlt-runs", run_id).findings
