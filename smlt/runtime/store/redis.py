"""Redis store: the ObjectStore interface over one Redis database (ElastiCache or a local server).

Keys are strings, values are bytes. `put(..., if_absent=True)` is `SET NX`, so the first writer
wins exactly as with S3's `If-None-Match: *`. `get_range` is `GETRANGE`, so a sharded aggregator
reads only its slice of each update. `list` walks `SCAN MATCH prefix*` (never `KEYS`), and returns
keys sorted, as S3 lists them.

Everything goes through redis-py, which parses replies with `hiredis` (a pinned dependency):
on a 44 MB GET over loopback it is as fast as a hand-written `recv_into` reader was (within
1.3x, TLS and plain; bench/README.md, "Redis"), so there is no second read path to keep.

TLS (`rediss://`, what ElastiCache with in-transit encryption requires) is configured by the URL
alone (SMLT_EXCHANGE_URL is all a function gets), with redis-py's query parameters: certificates
are verified against the system CAs by default (ElastiCache's are publicly signed);
`rediss://host:port/0?ssl_ca_certs=/path/ca.pem` adds a private CA (tests, a self-hosted server);
`ssl_cert_reqs=none` turns verification off and must be asked for.

A lost connection is not the end of a run: ElastiCache's Multi-AZ failover promotes a replica in
tens of seconds, and a client still connected to the old primary sees connection errors or
`READONLY`. Every operation retries those with a bounded exponential backoff (0.1 s doubling to
4 s, reconnecting each time) for up to `outage_s` (60 s by default; not a refused password or
certificate, which no failover ends), then raises
`StoreUnavailable` naming the store and how long it waited. Each operation is safe to repeat:
a `SET` writes the same bytes again, a repeated `SET NX` finds the key it wrote.

A throwaway `redis-server` for tests and benchmarks is `smlt.local.redis_server.LocalRedisServer`
(not part of the Lambda layer).
"""

from __future__ import annotations

import functools
import re
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

import redis
from redis.exceptions import AuthenticationError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from smlt.runtime.errors import StoreUnavailable
from smlt.runtime.store.base import NotFound

# What a failover or a network blip looks like from the client: retried, never the first answer.
_LOST = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, ConnectionError, TimeoutError)
OUTAGE_S = 60.0  # how long an operation keeps retrying: longer than a Multi-AZ failover
_T = TypeVar("_T")


def _refused(e: BaseException) -> bool:
    """A connection the server or the client refuses for good (a password, a certificate that
    does not verify): no failover ends it, so it is not retried."""
    if isinstance(e, AuthenticationError):
        return True
    chain = [e, e.__cause__, e.__context__]
    return any(isinstance(x, ssl.SSLCertVerificationError) for x in chain) or "certificate verify failed" in str(e)


def _retried(op: Callable[..., _T]) -> Callable[..., _T]:
    """Run the store operation again after a lost connection (backoff 0.1 s doubling to 4 s) until
    it succeeds or `outage_s` has passed: then StoreUnavailable."""

    @functools.wraps(op)
    def wrapper(self: RedisStore, *args: Any, **kwargs: Any) -> _T:
        t0, delay = time.monotonic(), 0.1
        while True:
            try:
                return op(self, *args, **kwargs)
            except _LOST as e:
                if _refused(e):
                    raise
                waited = time.monotonic() - t0
                if waited + delay > self.outage_s:
                    raise StoreUnavailable(
                        f"the exchange store {self.url} did not answer for {waited:.0f} s "
                        f"({type(e).__name__}: {e}); check that it is up (ElastiCache: its events), then "
                        "resume the run (`smlt resume RUN_ID`)"
                    ) from None
                self.client.connection_pool.disconnect()  # reconnect: DNS follows a promoted replica
                time.sleep(delay)
                delay = min(4.0, delay * 2)

    return wrapper


_GLOB = re.compile(r"([*?\[\]\\])")


def _escape_glob(s: str) -> str:
    """A literal prefix for SCAN MATCH: escape the glob metacharacters."""
    return _GLOB.sub(r"\\\1", s)


class RedisStore:
    """An ObjectStore on Redis.

    `url` is `redis://[:password@]host:port/db` (or `rediss://` for TLS, as ElastiCache
    in-transit encryption needs, optionally `?ssl_ca_certs=/path/ca.pem`: see the module doc);
    `prefix` is prepended to every key, like S3Store's.
    One connection pool per store; redis-py clients are thread-safe.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        prefix: str = "",
        *,
        client: redis.Redis | None = None,
        socket_timeout: float = 60.0,
        max_connections: int = 64,
        outage_s: float = OUTAGE_S,
    ):
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a redis:// URL: {url!r}")
        self.url = url
        self.prefix = prefix
        self.outage_s = outage_s
        self.client = client or redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=10.0,
            max_connections=max_connections,
            health_check_interval=30,
        )

    @classmethod
    def from_url(cls, url: str, prefix: str = "") -> RedisStore:
        return cls(url, prefix)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    def _k(self, key: str) -> str:
        return self.prefix + key

    @_retried
    def get(self, key: str) -> bytes:
        data = self.client.get(self._k(key))
        if data is None:
            raise NotFound(f"{self.url} {self._k(key)}")
        assert isinstance(data, bytes), "a RedisStore client must not decode responses"
        return data

    @_retried
    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            if not self.exists(key):
                raise NotFound(f"{self.url} {self._k(key)}")
            return b""
        # GETRANGE is inclusive at both ends and answers "" for a missing key: ask EXISTS in the
        # same round trip so a missing key is an error and an empty object is not.
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(self._k(key))
        pipe.getrange(self._k(key), start, end - 1)
        present, data = pipe.execute()
        if not present:
            raise NotFound(f"{self.url} {self._k(key)}")
        return data

    @_retried
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if if_absent:
            return bool(self.client.set(self._k(key), data, nx=True))
        self.client.set(self._k(key), data)
        return True

    @_retried
    def exists(self, key: str) -> bool:
        return bool(self.client.exists(self._k(key)))

    @_retried
    def list(self, prefix: str) -> list[str]:
        pattern = _escape_glob(self._k(prefix)) + "*"
        n = len(self.prefix)
        keys = {k.decode() if isinstance(k, bytes) else k for k in self.client.scan_iter(match=pattern, count=1000)}
        return sorted(k[n:] for k in keys)

    @_retried
    def delete(self, key: str) -> None:
        self.client.delete(self._k(key))

    @_retried
    def copy(self, src_key: str, dst_key: str) -> None:
        if not self.client.copy(self._k(src_key), self._k(dst_key), replace=True):
            raise NotFound(f"{self.url} {self._k(src_key)}")
