"""Redis store: the ObjectStore interface over one Redis database (ElastiCache or a local server).

Keys are strings, values are bytes. `put(..., if_absent=True)` is `SET NX`, so the first writer
wins exactly as with S3's `If-None-Match: *`. `get_range` is `GETRANGE`, so a sharded aggregator
reads only its slice of each update. `list` walks `SCAN MATCH prefix*` (never `KEYS`), and returns
keys sorted, as S3 lists them.

Reads (`get`, `get_range`) go through a minimal RESP reader that receives bulk replies straight
into one preallocated buffer (`recv_into`): redis-py's pure-Python parser tops out near
150 MB/s on a 44 MB value, this path runs at loopback/network speed. It is used for plain TCP
URLs; `rediss://` (TLS) and unix sockets use redis-py for everything.

`LocalRedisServer` starts a throwaway `redis-server` on a free loopback port (no persistence);
tests, benchmarks and the local engine use it. `scripts/redis.sh install` puts the binary there.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import socket
import subprocess
import tempfile
import time
from urllib.parse import unquote, urlparse

import redis

from smlt.store.base import NotFound

_GLOB = re.compile(r"([*?\[\]\\])")


def _escape_glob(s: str) -> str:
    """A literal prefix for SCAN MATCH: escape the glob metacharacters."""
    return _GLOB.sub(r"\\\1", s)


class RedisStore:
    """An ObjectStore on Redis.

    `url` is `redis://[:password@]host:port/db` (or `rediss://` for TLS, as ElastiCache
    in-transit encryption needs); `prefix` is prepended to every key, like S3Store's.
    One connection pool per store; redis-py clients are thread-safe.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "", *,
                 client: redis.Redis | None = None, socket_timeout: float = 60.0,
                 max_connections: int = 64):
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a redis:// URL: {url!r}")
        self.url = url
        self.prefix = prefix
        self.client = client or redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=10.0,
            max_connections=max_connections, health_check_interval=30)
        self._raw = _RawReader(parsed, socket_timeout) if parsed.scheme == "redis" and client is None else None

    @classmethod
    def from_url(cls, url: str, prefix: str = "") -> "RedisStore":
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
            present, data = self._raw.command([b"EXISTS", k.encode()],
                                              [b"GETRANGE", k.encode(), str(start).encode(), str(end - 1).encode()])
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
    """A small pool of plain sockets speaking just enough RESP2 for GET / GETRANGE / EXISTS.

    Bulk replies are received with `recv_into` into a buffer of the announced size: no
    intermediate copies, no per-chunk Python work."""

    def __init__(self, parsed, timeout: float):
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 6379
        self.db = int(parsed.path.lstrip("/") or 0) if parsed.path not in ("", "/") else 0
        self.username = unquote(parsed.username) if parsed.username else None
        self.password = unquote(parsed.password) if parsed.password else None
        self.timeout = timeout
        self._pool: queue.LifoQueue = queue.LifoQueue()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=10.0)
        sock.settimeout(self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        setup = []
        if self.password is not None:
            setup.append([b"AUTH"] + ([self.username.encode()] if self.username else []) + [self.password.encode()])
        if self.db:
            setup.append([b"SELECT", str(self.db).encode()])
        if setup:
            self._roundtrip(sock, setup)
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


def redis_server_binary() -> str | None:
    """Path of redis-server (PATH, then the Debian location), or None."""
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server")
         if os.access(p, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedisServer:
    """A throwaway redis-server on 127.0.0.1 (no persistence, no protected mode): a context manager.

    >>> with LocalRedisServer() as srv:
    ...     store = RedisStore(srv.url)
    """

    def __init__(self, port: int | None = None, binary: str | None = None, maxmemory: str = "0"):
        self.binary = binary or redis_server_binary()
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed (run `scripts/redis.sh install`)")
        self.port = port or free_port()
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "LocalRedisServer":
        self._dir = tempfile.TemporaryDirectory(prefix="smlt-redis-")
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--dir", self._dir.name,
                "--maxmemory", self.maxmemory, "--proto-max-bulk-len", "1gb",
                "--client-output-buffer-limit", "normal 0 0 0", "--loglevel", "warning"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.ConnectionError:
                pass
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err.strip()[:500]}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout} s")
            time.sleep(0.02)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "LocalRedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
