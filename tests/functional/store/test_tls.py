"""RedisStore over TLS (`rediss://`), as the deployed exchange (ElastiCache, TLS required) is
reached, against a real redis-server serving TLS only with a throwaway CA. The store contract
itself runs on TLS through the `store` fixture (test_stores.py); this file checks what is TLS's
own: reads really run on TLS through hiredis, 44 MB values, and certificate verification."""

from __future__ import annotations

import ssl
import uuid
from urllib.parse import urlparse

import pytest
import redis
from redis._parsers import _HiredisParser

from smlt.runtime.store import NotFound, RedisStore


def _plain_tls_url(srv) -> str:
    """The TLS server's URL without the ?ssl_ca_certs= that names its CA."""
    return urlparse(srv.url)._replace(query="").geturl()


def _pooled(store: RedisStore):
    """The connection the store's last command used (redis-py's pool hands it out first)."""
    conn = store.client.connection_pool.get_connection()
    store.client.connection_pool.release(conn)
    return conn


def test_tls_url_carries_the_ca_and_reads_run_over_tls_through_hiredis(redis_tls_server):
    url = redis_tls_server.url
    assert url.startswith("rediss://127.0.0.1:") and f"ssl_ca_certs={redis_tls_server.ca_file}" in url
    store = RedisStore(url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    store.put("k", b"v" * 1000)
    assert store.get("k") == b"v" * 1000
    conn = _pooled(store)
    assert isinstance(conn, redis.connection.SSLConnection)
    assert conn.cert_reqs == ssl.CERT_REQUIRED and conn.check_hostname and conn.ca_certs == redis_tls_server.ca_file
    assert isinstance(conn._sock, ssl.SSLSocket) and conn._sock.version().startswith("TLS")
    assert isinstance(conn._parser, _HiredisParser)


def test_plain_url_reads_over_plain_sockets(redis_server):
    store = RedisStore(redis_server.url)
    store.put("plain-k", b"v")
    assert store.get("plain-k") == b"v"
    conn = _pooled(store)
    assert not isinstance(conn._sock, ssl.SSLSocket) and isinstance(conn._parser, _HiredisParser)
    store.delete("plain-k")


def test_44_mb_value(each_redis_server):
    store = RedisStore(each_redis_server.url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    data = bytes(range(256)) * (44_000_000 // 256)
    store.put("big", data)
    got = store.get("big")
    assert type(got) is bytes and got == data
    eighth = len(data) // 8
    for i in (0, 3, 7):
        assert store.get_range("big", i * eighth, (i + 1) * eighth) == data[i * eighth : (i + 1) * eighth]
    assert store.get_range("big", len(data) - 10, len(data) + 1000) == data[-10:]
    del got
    store.delete("big")
    with pytest.raises(NotFound):
        store.get_range("big", 0, 8)


def test_verification_is_on_by_default(redis_tls_server):
    """Without the CA in the URL, the self-signed server is refused, for writes and reads."""
    store = RedisStore(_plain_tls_url(redis_tls_server), prefix="noca/")
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        store.put("k", b"v")
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        store.get("k")


def test_hostname_is_checked_and_localhost_is_in_the_certificate(redis_tls_server):
    url = urlparse(redis_tls_server.url)
    store = RedisStore(url._replace(netloc=f"localhost:{url.port}").geturl(), prefix="lh/")
    store.put("k", b"v")
    conn = _pooled(store)
    assert conn.check_hostname and conn.host == "localhost"
    assert store.get("k") == b"v" and store.get_range("k", 0, 1) == b"v"
    store.delete("k")


def test_verification_off_only_when_the_url_says_so(redis_tls_server):
    store = RedisStore(_plain_tls_url(redis_tls_server) + "?ssl_cert_reqs=none", prefix="nover/")
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert _pooled(store).cert_reqs == ssl.CERT_NONE
    store.delete("k")


def test_other_tls_options_of_redis_py_work(redis_tls_server):
    store = RedisStore(redis_tls_server.url + "&ssl_validate_ocsp=false", prefix="ocsp/")
    store.put("k", b"v")
    assert store.get("k") == b"v" and store.get_range("k", 0, 1) == b"v"
    store.delete("k")


def test_url_parts_reach_the_connection():
    pool = RedisStore("redis://u:p%40ss@h:7000/2?socket_timeout=3").client.connection_pool
    kw = pool.connection_kwargs
    assert pool.connection_class is redis.connection.Connection  # redis://: no TLS
    assert (kw["host"], kw["port"], kw["db"], kw["username"], kw["password"], kw["socket_timeout"]) == (
        "h",
        7000,
        2,
        "u",
        "p@ss",
        3.0,
    )


def test_db_in_the_query_is_honoured(each_redis_server):
    url = urlparse(each_redis_server.url)
    query = f"{url.query}&db=5" if url.query else "db=5"
    store = RedisStore(url._replace(path="", query=query).geturl(), prefix="qdb/")
    assert store.client.connection_pool.connection_kwargs["db"] == 5
    store.put("k", b"in-5")
    assert store.get("k") == b"in-5"
    db0 = redis.Redis.from_url(each_redis_server.url)
    assert db0.get(store._k("k")) is None  # not in db 0
    db0.close()
    store.delete("k")


def test_reads_reconnect_after_the_server_drops_the_connection(each_redis_server):
    store = RedisStore(each_redis_server.url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    store.put("k", b"x" * 100_000)
    assert store.get("k") == b"x" * 100_000  # a pooled connection now exists
    admin = redis.Redis.from_url(each_redis_server.url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    admin.close()
    assert store.get("k") == b"x" * 100_000
    assert store.get_range("k", 10, 20) == b"x" * 10
    store.delete("k")
