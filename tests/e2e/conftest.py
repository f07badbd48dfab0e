"""End-to-end: the synthesized state machine on the local engine, one engine per session."""

import os

import pytest


@pytest.fixture(scope="session")
def local(tmp_path_factory):
    os.environ.setdefault("SMLT_HOME", str(tmp_path_factory.mktemp("smlt-home")))
    from smlt.runner import start_engine

    engine, names, injector = start_engine(None)
    yield engine, names
    engine.stop()


@pytest.fixture
def engine_as_aws(local, monkeypatch):
    """boto3 in this process pointed at the local engine as if it were AWS (endpoint, test
    credentials, region), with the cached clients made again on both sides of the test."""
    from smlt.runtime.records import dynamodb_client
    from smlt.runtime.store.s3 import s3_client

    engine, names = local
    for k, v in {
        "AWS_ENDPOINT_URL": engine.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    s3_client.cache_clear(), dynamodb_client.cache_clear()
    yield engine, names
    s3_client.cache_clear(), dynamodb_client.cache_clear()
