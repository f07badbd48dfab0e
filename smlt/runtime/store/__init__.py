"""Object stores behind one interface: S3 (default) and Redis (optional reducer)."""

from smlt.runtime.store.base import NotFound, ObjectStore
from smlt.runtime.store.redis import RedisStore
from smlt.runtime.store.s3 import S3Store, s3_client


def open_store(url: str) -> ObjectStore:
    """A store from a URL: `s3://bucket/prefix/` → S3Store, `redis://host:port/db` → RedisStore."""
    if url.startswith("s3://"):
        from smlt.runtime.keys import parse_s3_uri

        bucket, prefix = parse_s3_uri(url)
        return S3Store(bucket, prefix.rstrip("/") + "/" if prefix else "")
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    raise ValueError(f"unknown store URL {url!r}: use s3://bucket/prefix or redis://host:port/db")


__all__ = ["NotFound", "ObjectStore", "RedisStore", "S3Store", "open_store", "s3_client"]
