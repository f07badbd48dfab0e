"""Reading a prepared dataset from S3, with shards cached in /tmp between warm invocations.

The cache is keyed by each shard's sha256 from the manifest, so a cached file can never be
stale, and every download is checked against it: a missing or corrupt shard raises CorruptShard.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load

from smlt.data.manifest import Manifest, ShardInfo, parse_manifest
from smlt.errors import AccessDenied, CorruptShard, InvalidDataset
from smlt.keys import parse_s3_uri
from smlt.store import NotFound, S3Store


def _cache_dir() -> Path:
    return Path(os.environ.get("SMLT_CACHE_DIR", "/tmp/smlt-cache"))


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
def load_manifest(uri: str) -> Manifest:
    store = dataset_store(uri)
    raw = _read(store, "manifest.json", "manifest.json")
    return parse_manifest(raw, f"dataset.uri: s3://{store.bucket}/{store.prefix}manifest.json")


def is_cached(shard: ShardInfo) -> bool:
    return (_cache_dir() / f"{shard.sha256}.safetensors").exists()


def load_shard(uri: str, shard: ShardInfo) -> tuple[np.ndarray, np.ndarray]:
    """A shard's (x, y), or CorruptShard when its object is missing, does not match the manifest's
    sha256 or cannot be parsed. A transient read error (throttling, a dropped connection) is
    raised as it is: it says nothing about the shard."""
    cache = _cache_dir() / f"{shard.sha256}.safetensors"
    blob = cache.read_bytes() if cache.exists() else None
    if blob is None:
        blob = _download(uri, shard)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        tmp.replace(cache)  # atomic: concurrent workers never see half a file
    try:
        arrays = load(blob)
        return arrays["x"], arrays["y"]
    except (SafetensorError, KeyError) as e:
        raise _corrupt(uri, shard, "unreadable", f"is unreadable ({e})") from None


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


def load_shards(uri: str, shards: list[ShardInfo]) -> tuple[np.ndarray, np.ndarray]:
    parts = [load_shard(uri, s) for s in shards]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
