"""Object stores behind one interface: S3 (default) and Redis (optional reducer)."""

from smlt.store.base import NotFound, ObjectStore
from smlt.store.s3 import S3Store, s3_client

__all__ = ["NotFound", "ObjectStore", "S3Store", "s3_client"]
