"""sha256 digests of stored models and updates, recorded beside their items and checked on every
read (`check`), and an update's L2 norm (the aggregator's robust guard, `smlt.runtime.aggregate.guard`).

A model stored as one object has the sha256 of its bytes; a model stored as k slices has the
sha256 of its parts' sha256 digests in order (manifest, slices, rest), so k aggregators' slices are
hashed in parallel. Cost: sha256 of 100 MB (a ResNet-50) took 0.13 s on one core here
(bench/update_norms.py), next to the ~1 s its GET takes on Lambda at ~100 MB/s; each reader
hashes the bytes it reads anyway, once per process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from smlt.runtime.errors import DigestMismatch
from smlt.runtime.tensors.dtypes import BF16, to_float32
from smlt.runtime.tensors.format import views


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def parts_sha256(parts: Iterable[bytes]) -> str:
    """The digest of an object stored in parts (a sliced model): sha256 of the parts' digests."""
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()


def check(key: str, actual: str, expected: str | None, what: str = "object") -> None:
    """DigestMismatch naming the object and both digests unless they agree. `expected` None: the
    item was written before digests were recorded (nothing to check against)."""
    if expected is not None and actual != expected:
        raise DigestMismatch(
            f"{what} {key} has sha256 {actual}, but {expected} was recorded when it was written: the stored "
            "object is damaged or was replaced",
            key,
            expected,
            actual,
        )


def update_norm(blob: bytes) -> float:
    """The L2 norm of an update's floating tensors (integer counters left out), accumulated in
    float64. NaN or Inf when the update has them."""
    total = 0.0
    for v in views(blob)[0].values():
        if v.dtype == BF16 or np.issubdtype(v.dtype, np.floating):
            a = to_float32(v).reshape(-1).astype(np.float64)
            total += float(np.dot(a, a))
    return float(np.sqrt(total))
