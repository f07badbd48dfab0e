"""Redis store: the ObjectStore interface over one Redis database (ElastiCache or a local server).

Keys are strings, values are bytes. `put(..., if_absent=True)` is `SET NX`, so the first writer
wins exactly as with S3's `If-None-Match: *`. `get_range` is `GETRANGE`, so a sharded aggregator
reads only its slice of each update. `list` walks `SCAN MATCH prefix*` (never `KEYS`), and returns
keys sorted, as S3 lists them.

`LocalRedisServer` starts a throwaway `redis-server` on a free loopback port (no persistence);
tests, benchmarks and the local engine use it. `scripts/redis.sh install` puts the binary there.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
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

    @classmethod
    def from_url(cls, url: str, prefix: str = "") -> "RedisStore":
        return cls(url, prefix)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    def _k(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str) -> bytes:
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
