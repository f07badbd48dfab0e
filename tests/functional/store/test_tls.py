"""RedisStore over TLS (`rediss://`), as the deployed exchange (ElastiCache, TLS required) is
reached, against a real redis-server serving TLS only with a throwaway CA. The store contract
itself runs on TLS through the `store` fixture (test_stores.py); this file checks what is TLS's
own: the fast reader really runs on TLS, 44 MB values, and certificate verification."""

from __future__ import annotations

import ssl
import uuid
from urllib.parse import urlparse

import pytest
import redis

from smlt.store import NotFound, RedisStore
from smlt.store.redis import _RawReader


def _plain_tls_url(srv) -> str:
    """The TLS server's URL without the ?ssl_ca_certs= that names its CA."""
    return urlparse(srv.url)._replace(query="").geturl()


def test_tls_url_carries_the_ca_and_the_raw_reader_reads_over_tls(redis_tls_server):
    url = redis_tls_server.url
    assert url.startswith("rediss://127.0.0.1:") and f"ssl_ca_certs={redis_tls_server.ca_file}" in url
    store = RedisStore(url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    assert store._raw is not None
    ctx = store._raw.ssl_context
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    store.put("k", b"v" * 1000)
    assert store.get("k") == b"v" * 1000
    sock = store._raw._pool.get_nowait()
    try:
        assert isinstance(sock, ssl.SSLSocket) and sock.version().startswith("TLS")
    finally:
        store._raw._pool.put(sock)


def test_plain_url_reads_over_plain_sockets(redis_server):
    store = RedisStore(redis_server.url)
    assert store._raw is not None and store._raw.ssl_context is None
    store.put("plain-k", b"v")
    assert store.get("plain-k") == b"v"
    sock = store._raw._pool.get_nowait()
    assert not isinstance(sock, ssl.SSLSocket)
    store._raw._pool.put(sock)
    store.delete("plain-k")


def test_44_mb_value_both_read_paths(each_redis_server):
    store = RedisStore(each_redis_server.url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    data = bytes(range(256)) * (44_000_000 // 256)
    store.put("big", data)
    got = store.get("big")  # the raw reader
    assert type(got) is bytes and got == data
    assert store.client.get(store._k("big")) == data  # redis-py's parser, same connection options
    eighth = len(data) // 8
    for i in (0, 3, 7):
        assert store.get_range("big", i * eighth, (i + 1) * eighth) == data[i * eighth : (i + 1) * eighth]
    assert store.get_range("big", len(data) - 10, len(data) + 1000) == data[-10:]
    del got
    store.delete("big")
    with pytest.raises(NotFound):
        store.get_range("big", 0, 8)


def test_verification_is_on_by_default(redis_tls_server):
    """Without the CA in the URL, the self-signed server is refused by both read paths."""
    store = RedisStore(_plain_tls_url(redis_tls_server), prefix="noca/")
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        store.put("k", b"v")
    with pytest.raises(ssl.SSLCertVerificationError):
        store.get("k")


def test_hostname_is_checked_and_localhost_is_in_the_certificate(redis_tls_server):
    url = urlparse(redis_tls_server.url)
    store = RedisStore(url._replace(netloc=f"localhost:{url.port}").geturl(), prefix="lh/")
    assert store._raw.ssl_context.check_hostname and store._raw.host == "localhost"
    store.put("k", b"v")
    assert store.get("k") == b"v" and store.get_range("k", 0, 1) == b"v"
    store.delete("k")


def test_verification_off_only_when_the_url_says_so(redis_tls_server):
    store = RedisStore(_plain_tls_url(redis_tls_server) + "?ssl_cert_reqs=none", prefix="nover/")
    assert store._raw.ssl_context.verify_mode == ssl.CERT_NONE
    store.put("k", b"v")
    assert store.get("k") == b"v"
    store.delete("k")


def test_tls_option_the_reader_lacks_leaves_reads_to_redis_py(redis_tls_server):
    store = RedisStore(redis_tls_server.url + "&ssl_validate_ocsp=false", prefix="ocsp/")
    assert store._raw is None
    store.put("k", b"v")
    assert store.get("k") == b"v" and store.get_range("k", 0, 1) == b"v"
    store.delete("k")


def test_tls_options_on_a_plain_url_leave_reads_to_redis_py():
    assert _RawReader.for_url("redis://127.0.0.1:6379/0?ssl_ca_certs=/x.pem", 5.0) is None
    assert _RawReader.for_url("unix:///tmp/redis.sock", 5.0) is None
    r = _RawReader.for_url("redis://u:p%40ss@h:7000/2?socket_timeout=3", 5.0)
    assert (r.host, r.port, r.db, r.username, r.password, r.timeout, r.ssl_context) == (
        "h",
        7000,
        2,
        "u",
        "p@ss",
        3.0,
        None,
    )


def test_db_in_the_query_is_honoured_by_both_paths(each_redis_server):
    url = urlparse(each_redis_server.url)
    query = f"{url.query}&db=5" if url.query else "db=5"
    store = RedisStore(url._replace(path="", query=query).geturl(), prefix="qdb/")
    assert store._raw.db == 5
    store.put("k", b"in-5")
    assert store.get("k") == b"in-5"
    store.delete("k")


def test_reads_reconnect_after_the_server_drops_the_connection(each_redis_server):
    store = RedisStore(each_redis_server.url, prefix=f"t-{uuid.uuid4().hex[:8]}/")
    store.put("k", b"x" * 100_000)
    assert store.get("k") == b"x" * 100_000  # a pooled raw connection now exists
    admin = redis.Redis.from_url(each_redis_server.url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    admin.close()
    assert store.get("k") == b"x" * 100_000
    assert store.get_range("k", 10, 20) == b"x" * 10
    store.delete("k")
