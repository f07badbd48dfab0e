"""Store fixtures shared by tests/store and tests/aggregate: a REAL redis-server on a free
loopback port (session-wide; a fresh database per test) and an S3 bucket in moto."""

from __future__ import annotations

import uuid

import boto3
import pytest
from moto import mock_aws

from smlt.store import RedisStore, S3Store
from smlt.store.redis import LocalRedisServer, redis_server_binary


@pytest.fixture(scope="session")
def redis_server():
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed: run `scripts/redis.sh install` (make test does)")
    with LocalRedisServer() as srv:
        yield srv


@pytest.fixture
def redis_store(redis_server):
    store = RedisStore(redis_server.url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    store.client.flushdb()
    yield store
    store.client.close()


@pytest.fixture
def aws_env(monkeypatch):
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def s3_store(aws_env):
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="smlt-test")
        yield S3Store("smlt-test", prefix="p/", client=client)


@pytest.fixture(params=["s3", "redis"])
def store(request):
    """Each test using `store` runs once on moto S3 and once on a real redis-server."""
    return request.getfixturevalue(f"{request.param}_store")
