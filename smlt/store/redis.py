"""Redis store: the ObjectStore interface over one Redis database (ElastiCache or a local server).

Keys are strings, values are bytes. `put(..., if_absent=True)` is `SET NX`, so the first writer
wins exactly as with S3's `If-None-Match: *`. `get_range` is `GETRANGE`, so a sharded aggregator
reads only its slice of each update. `list` walks `SCAN MATCH prefix*` (never `KEYS`), and returns
keys sorted, as S3 lists them.

Reads (`get`, `get_range`) go through a minimal RESP reader that receives bulk replies straight
into one preallocated buffer (`recv_into`): redis-py's pure-Python parser tops out near
150 MB/s on a 44 MB value, this path runs at loopback/network speed. It serves `redis://` and
`rediss://` (TLS, what ElastiCache with in-transit encryption requires: the same reader on an
`ssl.SSLSocket`); unix sockets use redis-py for everything.

TLS is configured by the URL alone (SMLT_EXCHANGE_URL is all a function gets), with redis-py's
query parameters, read by redis-py's own `parse_url` for both paths: certificates are verified
against the system CAs by default (ElastiCache's are publicly signed);
`rediss://host:port/0?ssl_ca_certs=/path/ca.pem` adds a private CA (tests, a self-hosted server);
`ssl_cert_reqs=none` turns verification off and must be asked for. A URL with a TLS option the
reader does not implement (OCSP, verify flags) leaves reads to redis-py too.

A throwaway `redis-server` for tests and benchmarks is `smlt.local.redis_server.LocalRedisServer`
(not part of the Lambda layer).
"""

from __future__ import annotations

import queue
import re
import socket
import ssl
from urllib.parse import urlparse

import redis

from smlt.store.base import NotFound

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
    ):
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a redis:// URL: {url!r}")
        self.url = url
        self.prefix = prefix
        self.client = client or redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=10.0,
            max_connections=max_connections,
            health_check_interval=30,
        )
        self._raw = _RawReader.for_url(url, socket_timeout) if client is None else None

    @classmethod
    def from_url(cls, url: str, prefix: str = "") -> RedisStore:
        return cls(url, prefix)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    def _k(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str) -> bytes:
        if self._raw is not None:
            data = self._raw.command([b"GET", self._k(key).encode()])[0]
        else:
            data = self.client.get(self._k(key))
        if data is None:
            raise NotFound(f"{self.url} {self._k(key)}")
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            if not self.exists(key):
                raise NotFound(f"{self.url} {self._k(key)}")
            return b""
        # GETRANGE is inclusive at both ends and answers "" for a missing key: ask EXISTS in the
        # same round trip so a missing key is an error and an empty object is not.
        k = self._k(key)
        if self._raw is not None:
            present, data = self._raw.command(
                [b"EXISTS", k.encode()], [b"GETRANGE", k.encode(), str(start).encode(), str(end - 1).encode()]
            )
            if not present:
                raise NotFound(f"{self.url} {k}")
            return data
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(self._k(key))
        pipe.getrange(self._k(key), start, end - 1)
        present, data = pipe.execute()
        if not present:
            raise NotFound(f"{self.url} {self._k(key)}")
        return data

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if if_absent:
            return bool(self.client.set(self._k(key), data, nx=True))
        self.client.set(self._k(key), data)
        return True

    def exists(self, key: str) -> bool:
        return bool(self.client.exists(self._k(key)))

    def list(self, prefix: str) -> list[str]:
        pattern = _escape_glob(self._k(prefix)) + "*"
        n = len(self.prefix)
        keys = {k.decode() if isinstance(k, bytes) else k for k in self.client.scan_iter(match=pattern, count=1000)}
        return sorted(k[n:] for k in keys)

    def delete(self, key: str) -> None:
        self.client.delete(self._k(key))

    def copy(self, src_key: str, dst_key: str) -> None:
        if not self.client.copy(self._k(src_key), self._k(dst_key), replace=True):
            raise NotFound(f"{self.url} {self._k(src_key)}")


class _RawReader:
    """A small pool of sockets (TLS ones for `rediss://`) speaking just enough RESP2 for
    GET / GETRANGE / EXISTS.

    Bulk replies are received with `recv_into` into a buffer of the announced size: no
    intermediate copies, no per-chunk Python work (an SSLSocket fills it a TLS record at a time)."""

    # The TLS options of redis-py's SSLConnection this reader applies the same way; a URL with any
    # other `ssl*` option is left to redis-py (`for_url` answers None).
    _SSL_OPTIONS = frozenset(
        {
            "ssl_ca_certs",
            "ssl_ca_path",
            "ssl_cert_reqs",
            "ssl_check_hostname",
            "ssl_certfile",
            "ssl_keyfile",
            "ssl_password",
            "ssl_min_version",
            "ssl_ciphers",
        }
    )

    def __init__(
        self,
        host: str,
        port: int,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.host = host
        self.port = port
        self.db = db
        self.username = username
        self.password = password
        self.timeout = timeout
        self.ssl_context = ssl_context
        self._pool: queue.LifoQueue = queue.LifoQueue()

    @classmethod
    def for_url(cls, url: str, timeout: float) -> _RawReader | None:
        """The reader for a `redis://` or `rediss://` URL, parsed by redis-py's own `parse_url` so
        both paths agree on host, db, credentials and TLS options; None where redis-py must read."""
        scheme = urlparse(url).scheme
        if scheme not in ("redis", "rediss"):
            return None
        kw = redis.connection.parse_url(url)
        ssl_keys = {k for k in kw if k.startswith("ssl")}
        if scheme == "redis" and ssl_keys:
            return None  # TLS options on a plain URL: whatever redis-py makes of them, it does alone
        if ssl_keys - cls._SSL_OPTIONS:
            return None
        return cls(
            kw.get("host") or "127.0.0.1",
            kw.get("port") or 6379,
            kw.get("db") or 0,
            kw.get("username"),
            kw.get("password"),
            kw.get("socket_timeout") or timeout,
            cls._ssl_context(kw) if scheme == "rediss" else None,
        )

    @staticmethod
    def _ssl_context(kw: dict) -> ssl.SSLContext:
        """The context redis-py's SSLConnection builds from the same options (redis 8.1)."""
        reqs = kw.get("ssl_cert_reqs", "required")
        if reqs is None:
            reqs = ssl.CERT_NONE
        elif isinstance(reqs, str):
            try:
                reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[reqs]
            except KeyError:
                raise redis.exceptions.RedisError(f"Invalid SSL Certificate Requirements Flag: {reqs}") from None
        ctx = ssl.create_default_context()
        ctx.check_hostname = bool(kw.get("ssl_check_hostname", True)) if reqs != ssl.CERT_NONE else False
        ctx.verify_mode = reqs
        if kw.get("ssl_certfile") or kw.get("ssl_keyfile"):
            ctx.load_cert_chain(
                certfile=kw.get("ssl_certfile"), keyfile=kw.get("ssl_keyfile"), password=kw.get("ssl_password")
            )
        if kw.get("ssl_ca_certs") is not None or kw.get("ssl_ca_path") is not None:
            ctx.load_verify_locations(cafile=kw.get("ssl_ca_certs"), capath=kw.get("ssl_ca_path"))
        if kw.get("ssl_min_version") is not None:
            ctx.minimum_version = ssl.TLSVersion(kw["ssl_min_version"])
        if kw.get("ssl_ciphers"):
            ctx.set_ciphers(kw["ssl_ciphers"])
        return ctx

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=10.0)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            if self.ssl_context is not None:
                # the handshake runs under the connect timeout; the wrapped socket keeps it until
                # the settimeout below
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.timeout)
            setup = []
            if self.password is not None:
                setup.append([b"AUTH"] + ([self.username.encode()] if self.username else []) + [self.password.encode()])
            if self.db:
                setup.append([b"SELECT", str(self.db).encode()])
            if setup:
                self._roundtrip(sock, setup)
        except BaseException:
            sock.close()
            raise
        return sock

    @staticmethod
    def _encode(args: list[bytes]) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def _roundtrip(self, sock: socket.socket, commands: list[list[bytes]]) -> list:
        sock.sendall(b"".join(self._encode(c) for c in commands))
        buf = bytearray()
        replies = []
        for _ in commands:
            reply, buf = self._read_reply(sock, buf)
            replies.append(reply)
        return replies

    @staticmethod
    def _read_reply(sock: socket.socket, buf: bytearray):
        while b"\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise redis.exceptions.ConnectionError("connection closed by the server")
            buf += chunk
        line, _, rest = bytes(buf).partition(b"\r\n")
        kind, body = line[:1], line[1:]
        if kind == b"-":
            raise redis.exceptions.ResponseError(body.decode(errors="replace"))
        if kind in (b"+",):
            return body, bytearray(rest)
        if kind == b":":
            return int(body), bytearray(rest)
        if kind != b"$":
            raise redis.exceptions.InvalidResponse(f"unexpected reply {line[:40]!r}")
        n = int(body)
        if n < 0:
            return None, bytearray(rest)
        out = bytearray(n + 2)
        have = min(len(rest), n + 2)
        out[:have] = rest[:have]
        leftover = bytearray(rest[have:])
        view = memoryview(out)
        while have < n + 2:
            got = sock.recv_into(view[have:])
            if got == 0:
                raise redis.exceptions.ConnectionError("connection closed by the server")
            have += got
        view.release()
        # bytes, as the interface promises (safetensors' loaders refuse a bytearray); the copy
        # costs a few ms on tens of MB, far less than the network read.
        return bytes(memoryview(out)[:n]), leftover

    def command(self, *commands: list[bytes]) -> list:
        for attempt in (0, 1):
            try:
                sock = self._pool.get_nowait()
            except queue.Empty:
                sock = self._connect()
            try:
                replies = self._roundtrip(sock, list(commands))
            except redis.exceptions.ResponseError:
                self._pool.put(sock)
                raise
            except (OSError, redis.exceptions.ConnectionError):
                sock.close()
                if attempt:
                    raise redis.exceptions.ConnectionError(f"redis {self.host}:{self.port}: read failed") from None
                continue
            self._pool.put(sock)
            return replies
        raise AssertionError("unreachable")
