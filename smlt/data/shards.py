"""Reading a prepared dataset from S3, with shards cached in /tmp between warm invocations.

The cache is keyed by each shard's sha256 from the manifest, so a cached file can never be
stale, and every download is checked against it: a corrupt shard raises InvalidDataset.
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
from smlt.errors import AccessDenied, InvalidDataset
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


def _read(store: S3Store, key: str, what: str) -> bytes:
    from botocore.exceptions import ClientError

    try:
        return store.get(key)
    except NotFound:
        raise InvalidDataset(f"dataset.uri: no {what} at s3://{store.bucket}/{store.prefix}{key}") from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("AccessDenied", "AllAccessDisabled", "403", "NoSuchBucket"):
            raise AccessDenied(f"dataset.uri: cannot read s3://{store.bucket}/{store.prefix}{key} ({code})") from None
        raise


@functools.lru_cache(maxsize=16)
def load_manifest(uri: str) -> Manifest:
    store = dataset_store(uri)
    raw = _read(store, "manifest.json", "manifest.json")
    return parse_manifest(raw, f"dataset.uri: s3://{store.bucket}/{store.prefix}manifest.json")


def is_cached(shard: ShardInfo) -> bool:
    return (_cache_dir() / f"{shard.sha256}.safetensors").exists()


def load_shard(uri: str, shard: ShardInfo) -> tuple[np.ndarray, np.ndarray]:
    cache = _cache_dir() / f"{shard.sha256}.safetensors"
    blob = cache.read_bytes() if cache.exists() else None
    if blob is None:
        blob = _read(dataset_store(uri), shard.key, f"shard {shard.key}")
        if hashlib.sha256(blob).hexdigest() != shard.sha256:
            raise InvalidDataset(f"shard {shard.key} is corrupt: its sha256 does not match the manifest")
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        tmp.replace(cache)  # atomic: concurrent workers never see half a file
    try:
        arrays = load(blob)
        return arrays["x"], arrays["y"]
    except (SafetensorError, KeyError) as e:
        raise InvalidDataset(f"shard {shard.key} is unreadable: {e}") from None


def load_shards(uri: str, shards: list[ShardInfo]) -> tuple[np.ndarray, np.ndarray]:
    parts = [load_shard(uri, s) for s in shards]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
