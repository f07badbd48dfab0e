"""Store fixtures shared by tests/store and tests/aggregate: a REAL redis-server on a free
loopback port (session-wide; a fresh database per test), the same over TLS, and an S3 bucket in
moto."""

from __future__ import annotations

import uuid

import boto3
import pytest
from moto import mock_aws

from smlt.local.redis_server import LocalRedisServer, redis_server_binary
from smlt.runtime.store import RedisStore, S3Store

_NO_REDIS = "redis-server is not installed: run `scripts/redis.sh install` (make test does)"

# The TLS server is started on first use and stopped when the session ends (config cleanup), not
# by a session fixture: `store` needs it, and tests/aggregate imports `store` without the rest.
_TLS: dict = {}


def tls_redis_server(config: pytest.Config) -> LocalRedisServer:
    """The session's redis-server serving TLS only (`LocalRedisServer(tls=True)`); skips the test,
    with redis-server's own error, where this redis-server cannot serve TLS."""
    if "server" in _TLS:
        return _TLS["server"]
    if "skip" in _TLS:
        pytest.skip(_TLS["skip"])
    if redis_server_binary() is None:
        pytest.skip(_NO_REDIS)
    srv = LocalRedisServer(tls=True)
    try:
        srv.start()
    except RuntimeError as e:  # redis-server exited: built without TLS, unknown --tls-* flags, ...
        _TLS["skip"] = f"redis-server cannot serve TLS here: {e}"
        pytest.skip(_TLS["skip"])
    _TLS["server"] = srv

    def stop():
        _TLS.pop("server", None)
        srv.stop()

    config.add_cleanup(stop)
    return srv


def _fresh_redis_store(url: str) -> RedisStore:
    store = RedisStore(url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    store.client.flushdb()
    return store


@pytest.fixture(scope="session")
def redis_server():
    if redis_server_binary() is None:
        pytest.skip(_NO_REDIS)
    with LocalRedisServer() as srv:
        yield srv


@pytest.fixture
def redis_tls_server(request):
    return tls_redis_server(request.config)


@pytest.fixture(params=["redis", "redis_tls"])
def each_redis_server(request):
    """Each test using `each_redis_server` runs once on the plain server and once over TLS."""
    if request.param == "redis_tls":
        return tls_redis_server(request.config)
    return request.getfixturevalue("redis_server")


@pytest.fixture
def redis_store(redis_server):
    store = _fresh_redis_store(redis_server.url)
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


@pytest.fixture(params=["s3", "redis", "redis_tls"])
def store(request):
    """Each test using `store` runs on moto S3, on a real redis-server, and on a real redis-server
    over TLS (`rediss://`, as ElastiCache with in-transit encryption is reached)."""
    if request.param == "redis_tls":
        store = _fresh_redis_store(tls_redis_server(request.config).url)
        yield store
        store.client.close()
    else:
        yield request.getfixturevalue(f"{request.param}_store")
