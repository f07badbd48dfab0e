"""Which reported updates a round averages: each is read whole once, its sha256 checked against
its worker's record (`WorkerItem.update_sha256`) and its norm against the round's (the robust
guard). A refused update is recorded with its reason (`RoundItem.rejected`), never averaged.

The guard: an update whose L2 norm is more than `NORM_FACTOR` times the median of the round's
update norms is refused. Honest updates of one round are close (same model, steps and learning
rate): bench/update_norms.py measured the largest norm of a round at most 1.40x / 1.61x the median
on digits' MLP (4 / 8 workers, 12 rounds) and 1.44x / 2.72x on LeNet, so 10x leaves a margin of
3.7x; a worker cut short at its compute limit has a smaller update (down to 0.03x), never a larger
one, and a 1000x update is far outside. The median (not the mean) is robust: one huge update does
not move it. The median needs at least 3 updates to say which one is off (with 2 it cannot), and
holds while fewer than half of them are off.

The bytes read stay in memory (up to `KEEP_BYTES` in all) for the reduce, so an update is fetched
once: the single aggregator reads every byte of every update anyway.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smlt.runtime.errors import DigestMismatch
from smlt.runtime.items import Rejected, WorkerItem
from smlt.runtime.store.base import NotFound, ObjectStore
from smlt.runtime.store.parallel import FETCH_THREADS, ordered_map
from smlt.runtime.tensors.digest import check, sha256_hex, update_norm

NORM_FACTOR = 10.0
MIN_UPDATES = 3  # the guard needs a majority to tell the odd one out
KEEP_BYTES = 1 << 30  # updates kept in memory for the reduce; beyond, it reads them again (ranged)


@dataclass
class _Kept:
    """A store view serving the updates already read from memory (a RangeReader)."""

    store: ObjectStore
    blobs: dict[str, bytes] = field(default_factory=dict)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        blob = self.blobs.get(key)
        return blob[start:end] if blob is not None else self.store.get_range(key, start, end)


@dataclass(frozen=True)
class Screened:
    accepted: list[WorkerItem]
    rejected: list[Rejected]
    norms: dict[int, float]  # of the updates whose digest matched
    reader: _Kept  # the accepted updates' bytes, for `reduce_updates`


def _read(store: ObjectStore, key: str, record: WorkerItem) -> tuple[bytes | None, float, str]:
    """(bytes, norm, why refused): the update read whole, its digest checked."""
    try:
        blob = store.get(key)
    except NotFound:
        return None, math.nan, f"update {key} is missing though its worker recorded it"
    try:
        check(key, sha256_hex(blob), record.update_sha256, f"worker {record.worker}'s update")
        return blob, update_norm(blob), ""
    except DigestMismatch as e:
        return None, math.nan, str(e)
    except ValueError as e:  # HeaderError: not a safetensors file (its digest matched: written so)
        return None, math.nan, f"update {key} is unreadable ({e})"


def outliers(norms: dict[int, float], factor: float = NORM_FACTOR) -> dict[int, str]:
    """The workers whose update norm is more than `factor` x the median of the finite norms, with
    the reason (none when fewer than MIN_UPDATES norms are finite: no majority to compare with).
    A NaN or Inf update is left to the divergence check."""
    finite = {w: n for w, n in norms.items() if math.isfinite(n)}
    if len(finite) < MIN_UPDATES:
        return {}
    median = statistics.median(finite.values())
    return {
        w: f"update norm {n:.4g} is more than {factor:g}x the round's median update norm {median:.4g}"
        for w, n in sorted(finite.items())
        if n > factor * median
    }


def screen_updates(
    store: ObjectStore,
    records: Sequence[WorkerItem],
    key_of: Callable[[int], str],
    *,
    threads: int = FETCH_THREADS,
    factor: float = NORM_FACTOR,
) -> Screened:
    """The records whose update is intact and within the guard, the others refused with a reason."""
    reader = _Kept(store)
    rejected: dict[int, str] = {}
    norms: dict[int, float] = {}
    kept = 0
    reads = ordered_map(lambda r: (r, *_read(store, key_of(r.worker), r)), list(records), threads)
    for record, blob, norm, why in reads:
        if blob is None:
            rejected[record.worker] = why
            continue
        norms[record.worker] = norm
        if kept + len(blob) <= KEEP_BYTES:
            reader.blobs[key_of(record.worker)] = blob
            kept += len(blob)
    rejected.update(outliers(norms, factor))
    for w in rejected:
        reader.blobs.pop(key_of(w), None)
    return Screened(
        accepted=[r for r in records if r.worker not in rejected],
        rejected=[Rejected(worker=w, reason=why) for w, why in sorted(rejected.items())],
        norms=norms,
        reader=reader,
    )


def check_share(
    store: ObjectStore, records: Sequence[WorkerItem], key_of: Callable[[int], str], j: int, k: int
) -> dict[str, dict[str, Any]]:
    """Sharded rounds: slice aggregator j of k reads every k-th of the accepted updates whole (as
    many bytes again as its slice reads) and reports their norms and refusals, which `finish`
    combines (`combine_checks`): {"norms": {worker: norm}, "rejected": {worker: reason}}."""
    share = [r for i, r in enumerate(sorted(records, key=lambda r: r.worker)) if i % k == j]
    out: dict[str, dict[str, Any]] = {"norms": {}, "rejected": {}}
    for record, blob, norm, why in ordered_map(lambda r: (r, *_read(store, key_of(r.worker), r)), share, FETCH_THREADS):
        if blob is None:
            out["rejected"][str(record.worker)] = why
        else:
            out["norms"][str(record.worker)] = norm if math.isfinite(norm) else None
    return out


def combine_checks(checks: Sequence[dict[str, dict[str, Any]]], factor: float = NORM_FACTOR) -> dict[int, str]:
    """The refusals of a sharded round: each share's, and the guard over all the norms."""
    rejected = {int(w): why for c in checks for w, why in c["rejected"].items()}
    norms = {int(w): (n if n is not None else math.nan) for c in checks for w, n in c["norms"].items()}
    rejected.update(outliers(norms, factor))
    return rejected
