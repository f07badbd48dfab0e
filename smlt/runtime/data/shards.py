"""Reading a prepared dataset from S3, with shards cached in /tmp between warm invocations.

The cache is keyed by each shard's sha256 from the manifest, so a cached file can never be
stale, and every download and every read of a cached file is checked against it: a missing or
corrupt shard raises CorruptShard, a cached copy that no longer matches is read from S3 again.
The cache keeps under a size cap (`Settings.shard_cache_mb`), evicting the least recently used
shards that the current invocation does not read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load

from smlt.runtime.data.manifest import Manifest, ShardInfo, parse_manifest
from smlt.runtime.errors import AccessDenied, CorruptShard, DataError, InvalidDataset
from smlt.runtime.keys import parse_s3_uri
from smlt.runtime.store import NotFound, S3Store

_SUFFIX = ".safetensors"
log = logging.getLogger(__name__)


def _cache_dir() -> Path:
    return Path(os.environ.get("SMLT_CACHE_DIR", "/tmp/smlt-cache"))


class ShardCache:
    """Verified shards in a folder, by sha256, holding at most `cap_bytes` (least recently used
    evicted first). Several processes may share the folder (the local engine's handlers): a file
    another one evicted is read again from S3, and writes are atomic renames.

    Recency is the file's mtime, set explicitly on every hit and write (the kernel's own
    timestamps are too coarse to order shards read milliseconds apart)."""

    def __init__(self, root: Path | None = None, cap_bytes: int = 384 << 20):
        self.root = root or _cache_dir()
        self.cap_bytes = cap_bytes
        self._in_use: set[str] = set()
        self._lock = threading.Lock()  # the prefetch thread writes while the worker reads
        self._clock = 0

    def path(self, sha256: str) -> Path:
        return self.root / f"{sha256}{_SUFFIX}"

    def has(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    @contextlib.contextmanager
    def in_use(self, sha256s: Collection[str]) -> Iterator[None]:
        """While inside, never evict these shards (those the current invocation reads)."""
        added = set(sha256s) - self._in_use
        self._in_use |= added
        try:
            yield
        finally:
            self._in_use -= added

    def get(self, sha256: str) -> dict[str, np.ndarray] | None:
        """The cached shard's arrays (marked as just used), or None when it is not cached. The
        file is checked against its sha256 on every read (the folder is shared by every local
        run on the machine and outlives them): a copy that does not match is evicted, with a
        warning, and the caller reads the shard from S3 again."""
        path = self.path(sha256)
        try:
            with self._lock:
                self._touch(path)
            blob = path.read_bytes()
            if hashlib.sha256(blob).hexdigest() != sha256:
                log.warning("shard cache: %s does not match its sha256: evicted, read from S3 again", path)
                path.unlink(missing_ok=True)
                return None
            return load(blob)
        except FileNotFoundError:
            return None
        except (SafetensorError, OSError):
            path.unlink(missing_ok=True)  # unreadable (a disk error): read it from S3 again
            return None

    def put(self, sha256: str, blob: bytes) -> bool:
        """Keep a verified shard if it fits under the cap after evicting shards not in use."""
        with self._lock:
            if not self._make_room(len(blob)):
                return False
            path = self.path(sha256)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(blob)
            tmp.replace(path)  # atomic: concurrent workers never see half a file
            self._touch(path)
            return True

    def make_room(self, size: int) -> bool:
        """Whether `size` more bytes fit, after evicting what may be evicted."""
        with self._lock:
            return self._make_room(size)

    def _make_room(self, size: int) -> bool:
        """Evict least recently used shards (not in use) until `size` more bytes fit under the cap."""
        if size > self.cap_bytes:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        files = []
        for entry in os.scandir(self.root):
            with contextlib.suppress(FileNotFoundError):  # another process evicted it meanwhile
                files.append((entry.stat().st_mtime_ns, entry.name, entry.stat().st_size))
        total = sum(f[2] for f in files)
        for _, name, nbytes in sorted(files):
            if total + size <= self.cap_bytes:
                break
            if name.removesuffix(_SUFFIX) in self._in_use:
                continue
            (self.root / name).unlink(missing_ok=True)
            total -= nbytes
        return total + size <= self.cap_bytes

    def _touch(self, path: Path) -> None:
        self._clock = max(time.time_ns(), self._clock + 1)  # the caller holds the lock
        os.utime(path, ns=(self._clock, self._clock))


def dataset_store(uri: str) -> S3Store:
    try:
        bucket, prefix = parse_s3_uri(uri)
    except ValueError as e:
        raise InvalidDataset(f"dataset.uri: {e}") from None
    return S3Store(bucket, prefix.rstrip("/") + "/" if prefix else "")


def _get(store: S3Store, key: str) -> bytes:
    """The object's bytes; AccessDenied when the stack may not read it (NotFound passes through)."""
    from botocore.exceptions import ClientError

    try:
        return store.get(key)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("AccessDenied", "AllAccessDisabled", "403", "NoSuchBucket"):
            raise AccessDenied(f"dataset.uri: cannot read s3://{store.bucket}/{store.prefix}{key} ({code})") from None
        raise


def _read(store: S3Store, key: str, what: str) -> bytes:
    try:
        return _get(store, key)
    except NotFound:
        raise InvalidDataset(f"dataset.uri: no {what} at s3://{store.bucket}/{store.prefix}{key}") from None


@functools.lru_cache(maxsize=16)
def read_manifest(uri: str) -> tuple[Manifest, str]:
    """The dataset's manifest and the sha256 of its manifest.json's bytes (what a run pins in META)."""
    store = dataset_store(uri)
    raw = _read(store, "manifest.json", "manifest.json")
    manifest = parse_manifest(raw, f"dataset.uri: s3://{store.bucket}/{store.prefix}manifest.json")
    return manifest, hashlib.sha256(raw).hexdigest()


def load_manifest(uri: str) -> Manifest:
    """The dataset's manifest (read once per process and uri: `read_manifest`)."""
    return read_manifest(uri)[0]


def manifest_sha256(uri: str) -> str:
    """sha256 of the manifest.json `load_manifest(uri)` read (read now if it is not cached)."""
    return read_manifest(uri)[1]


def check_pinned(pinned: str | None, now: str | None, uri: str) -> None:
    """DataError when the dataset's manifest (sha256 `now`) is not the one the run started on
    (META's `manifest_sha256`, `pinned`): the dataset was prepared again at its uri during the run."""
    if pinned is None or now is None or now == pinned:
        return
    raise DataError(
        f"dataset.uri: {uri.rstrip('/')}/manifest.json changed during the run (sha256 {pinned[:12]} when the "
        f"run started, {now[:12]} now): the dataset was prepared again in the same place, so the run would "
        "train on two datasets and describe its model with the second; prepare a new dataset into a new "
        "folder and start a new run on it"
    )


def load_shard(uri: str, shard: ShardInfo, cache: ShardCache | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A shard's (x, y), from the cache or else from S3 (and then cached), or CorruptShard when
    its object is missing, does not match the manifest's sha256 or cannot be parsed. A transient
    read error (throttling, a dropped connection) is raised as it is: it says nothing about the
    shard."""
    cache = cache or ShardCache()
    arrays = cache.get(shard.sha256)
    if arrays is None:
        blob = _download(uri, shard)
        try:
            arrays = load(blob)
        except SafetensorError as e:
            raise _corrupt(uri, shard, "unreadable", f"is unreadable ({e})") from None
        cache.put(shard.sha256, blob)
    try:
        return arrays["x"], arrays["y"]
    except KeyError as e:
        raise _corrupt(uri, shard, "unreadable", f"is unreadable (no array {e})") from None


def warm(uri: str, shard: ShardInfo, cache: ShardCache) -> None:
    """Download a shard into the cache (verified, not parsed) unless it is there already."""
    if not cache.has(shard.sha256) and cache.make_room(shard.bytes):
        cache.put(shard.sha256, _download(uri, shard))


def _download(uri: str, shard: ShardInfo) -> bytes:
    """The shard's bytes from S3, checked against the manifest's sha256."""
    store = dataset_store(uri)
    try:
        blob = _get(store, shard.key)
    except NotFound:
        raise _corrupt(uri, shard, "missing", "is missing (no such object)") from None
    if hashlib.sha256(blob).hexdigest() != shard.sha256:
        raise _corrupt(uri, shard, "digest", "is corrupt: its sha256 does not match the manifest")
    return blob


def _corrupt(uri: str, shard: ShardInfo, reason: str, what: str) -> CorruptShard:
    where = uri.rstrip("/") + "/" + shard.key
    return CorruptShard(f"shard {shard.key} {what} ({where})", key=shard.key, reason=reason)
