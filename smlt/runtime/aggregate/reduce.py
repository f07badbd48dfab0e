"""The reduce: new = global + server_lr * sum(w_i * delta_i) / sum(w_i), on numpy arrays.

Speed: the weighted sum walks the arrays in cache-sized blocks, so the accumulator block stays in
cache while every update streams through once. That makes it about as fast as (usually faster
than) numpy adding the same arrays in place, which is the reference `bench/` compares it to.
Updates may be float32, float16 or bfloat16 (see `smlt.runtime.tensors.codec`); they are widened block
by block, never as whole copies.

Integer tensors (batch norm's `num_batches_tracked`) travel as int64 deltas and are added as
their sample-weighted mean rounded to the nearest integer (`integer_mean`), without server_lr: a
count is not a step to scale. So model r+1's counters are what averaging the workers' counters
gives, and floating buffers (running mean and variance) are averaged like weights.

Through a store, updates are read with ranged GETs of their data sections (`reduce_slice`,
`reduce_updates`), never decoded whole.

Sharded aggregation (local SGD): `smlt.runtime.fanout.plan_slices` chooses k aggregators.
Aggregator j of k (`aggregate_slice`) reads each accepted worker's header (one small ranged GET),
then the bytes of slice j of each update (one ranged GET), averages them weighted by samples (same
arithmetic and order as the single aggregator, so the result is bit-for-bit the same), adds them
to slice j of model r, and writes slice j of model r+1 plus a small manifest (`model_store`).
Traffic per aggregator is n * P / k bytes in and P / k out, so with k proportional to n it stays
constant as workers grow. `commit_accepted` fixes which updates all k average.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from smlt.runtime import keys
from smlt.runtime.model_store import (
    ModelSource,
    SlicedModel,
    model_source,
    next_manifest,
    read_model_range,
    read_rest,
    write_manifest,
    write_rest,
    write_slice,
)
from smlt.runtime.store.base import ObjectStore
from smlt.runtime.store.parallel import FETCH_THREADS, ordered_map
from smlt.runtime.tensors.dtypes import BF16, to_float32
from smlt.runtime.tensors.layout import (
    HEADER_PROBE,
    FlatLayout,
    RangeReader,
    read_flat_raw,
    read_integers,
    read_layout,
    unflatten,
)

# Elements per block: 256 Ki float32 = 1 MiB of accumulator, which stays in L2 while the
# updates stream through.
BLOCK = 1 << 18

# The single aggregator reads every byte of every update, so its header probe can be large: an
# update under 1 MB arrives whole with its header, in one GET instead of two.
WHOLE_PROBE = 1 << 20


# --------------------------------------------------------------------------- arithmetic


def weighted_sum_into(
    acc: np.ndarray, arrays: Sequence[np.ndarray], coeffs: Sequence[float], block: int = BLOCK
) -> np.ndarray:
    """acc[:] += sum_i coeffs[i] * arrays[i], elementwise; acc is float32 and 1-D (or flat-viewable).

    Arrays may be float32, float16 or BF16 (they are widened a block at a time). Blocked so that
    the accumulator block stays in cache: each update is read once, the accumulator is read and
    written once in all, which is less memory traffic than n whole-array `acc += a` passes.
    """
    flat = acc.reshape(-1)
    n = flat.size
    srcs = [a.reshape(-1) for a in arrays]
    for a in srcs:
        if a.size != n:
            raise ValueError(f"size mismatch: accumulator {n}, update {a.size}")
    cs = [np.float32(c) for c in coeffs]
    tmp = np.empty(min(block, n), dtype=np.float32)
    wide = np.empty(min(block, n) if any(a.dtype == BF16 for a in srcs) else 0, dtype=np.uint32)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        dst = flat[lo:hi]
        t = tmp[: hi - lo]
        for a, c in zip(srcs, cs):
            part = a[lo:hi]
            if part.dtype == BF16:  # widen in place: the bits shifted to float32's top half
                w = wide[: hi - lo]
                np.left_shift(part.view(np.uint16), 16, out=w, dtype=np.uint32)
                part = w.view(np.float32)
            if c == 1.0:
                np.add(dst, part, out=dst)
            else:
                np.multiply(part, c, out=t)
                np.add(dst, t, out=dst)
    return acc


def weighted_mean_into(
    acc: np.ndarray, arrays: Sequence[np.ndarray], weights: Sequence[float], block: int = BLOCK
) -> np.ndarray:
    """acc[:] = sum(w_i * a_i) / sum(w_i). With equal weights: plain sums, one scale at the end."""
    total = float(sum(weights))
    if not arrays or total <= 0:
        raise ValueError("nothing to average")
    acc.fill(0.0)
    if all(w == weights[0] for w in weights):
        weighted_sum_into(acc, arrays, [1.0] * len(arrays), block)
        np.multiply(acc, np.float32(1.0 / len(arrays)), out=acc)
    else:
        weighted_sum_into(acc, arrays, [w / total for w in weights], block)
    return acc


def integer_mean(arrays: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """sum(w_i * a_i) / sum(w_i) of integer arrays, rounded half to even, as int64 (float64
    arithmetic: exact for counts below 2**53)."""
    total = float(sum(weights))
    if not arrays or total <= 0:
        raise ValueError("nothing to average")
    acc = np.zeros(np.shape(arrays[0]), dtype=np.float64)
    for a, w in zip(arrays, weights):
        acc += np.float64(w) * a
    return np.asarray(np.rint(acc / total), dtype=np.int64)  # (0-d arithmetic gives numpy scalars)


def add_integer(g: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """An integer tensor plus an int64 delta, in the tensor's dtype (clipped to its range)."""
    info = np.iinfo(g.dtype)
    total = np.clip(g.astype(np.int64) + delta, max(info.min, -(2**63)), min(info.max, 2**63 - 1))
    return np.asarray(total, dtype=g.dtype)


def weighted_average(updates: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    """Average tensors key by key, weighted, into fresh float32 arrays (blocked, no per-update copies);
    integer tensors as `integer_mean`. The in-memory reference the streamed reduces below match bit
    for bit."""
    total = float(sum(weights))
    if not updates or total <= 0:
        raise ValueError("nothing to average")
    out: dict[str, np.ndarray] = {}
    for name in updates[0]:
        if np.issubdtype(updates[0][name].dtype, np.integer):
            out[name] = integer_mean([u[name] for u in updates], weights)
            continue
        acc = np.empty(updates[0][name].shape, dtype=np.float32)
        weighted_mean_into(acc, [u[name] for u in updates], weights)
        out[name] = acc
    return out


def apply_update(
    global_state: dict[str, np.ndarray], delta: dict[str, np.ndarray], server_lr: float
) -> dict[str, np.ndarray]:
    """global + server_lr * delta for the delta's tensors, in each global tensor's dtype (an
    integer delta is added as it is)."""
    new = dict(global_state)
    lr = np.float32(server_lr)
    for name, d in delta.items():
        g = global_state[name]
        if np.issubdtype(d.dtype, np.integer):
            new[name] = add_integer(g, d)
            continue
        acc = g.astype(np.float32, copy=True)
        d32 = to_float32(d)
        if lr == 1.0:
            np.add(acc, d32, out=acc)
        else:
            acc += lr * d32
        new[name] = acc if g.dtype == np.float32 else acc.astype(g.dtype)
    return new


def all_finite(a: np.ndarray) -> bool:
    """True when no element is NaN or Inf (min/max propagate NaN; no temporary array)."""
    if a.size == 0 or not np.issubdtype(a.dtype, np.floating):
        return True
    return bool(np.isfinite(a.min()) and np.isfinite(a.max()))


def is_finite(state: dict[str, np.ndarray]) -> bool:
    return all(all_finite(v) for v in state.values())


def param_count(state: dict[str, np.ndarray]) -> int:
    return int(sum(v.size for v in state.values()))


# --------------------------------------------------------------------------- through a store


def _read_layouts(store: RangeReader, update_keys: Sequence[str], threads: int, probe: int) -> list[FlatLayout]:
    return list(ordered_map(lambda k: read_layout(store, k, probe), list(update_keys), threads))


def reduce_integers(
    store: RangeReader,
    update_keys: Sequence[str],
    weights: Sequence[float],
    layouts: Sequence[FlatLayout],
    threads: int = FETCH_THREADS,
) -> dict[str, np.ndarray]:
    """`integer_mean` of the updates' integer tensors (int64), read with one small ranged GET each."""
    spec = [(t.name, t.shape) for t in layouts[0].integers]
    if not spec:
        return {}
    for key, lay in zip(update_keys, layouts):
        if [(t.name, t.shape) for t in lay.integers] != spec:
            raise ValueError(f"update {key} does not have the integer tensors of {update_keys[0]}")
    parts = list(
        ordered_map(lambda job: read_integers(store, job[0], job[1]), list(zip(update_keys, layouts)), threads)
    )
    return {name: integer_mean([p[name] for p in parts], weights) for name, _ in spec}


def reduce_slice(
    store: RangeReader,
    update_keys: Sequence[str],
    weights: Sequence[float],
    start: int,
    end: int,
    *,
    layouts: Sequence[FlatLayout] | None = None,
    threads: int = FETCH_THREADS,
) -> np.ndarray:
    """sum(w_i * update_i[start:end]) / sum(w_i) as float32, reading only those bytes of each update.

    Headers are read with one small ranged GET per update unless `layouts` are given. Updates
    are accumulated in the given order with the single aggregator's arithmetic, so the slice is
    bit-for-bit what `weighted_average` computes for the same elements.
    """
    update_keys = list(update_keys)
    if not update_keys or len(update_keys) != len(weights) or float(sum(weights)) <= 0:
        raise ValueError("nothing to average (need as many positive weights as updates)")
    if layouts is None:
        layouts = _read_layouts(store, update_keys, threads, probe=HEADER_PROBE)
    ref = layouts[0].spec()
    for key, lay in zip(update_keys, layouts):
        if lay.spec() != ref:
            raise ValueError(f"update {key} does not have the tensors and shapes of {update_keys[0]}")
    equal = all(w == weights[0] for w in weights)
    total = float(sum(weights))
    coeffs = [1.0] * len(weights) if equal else [w / total for w in weights]
    acc = np.zeros(end - start, dtype=np.float32)
    jobs = list(zip(update_keys, layouts))
    pieces = ordered_map(lambda job: read_flat_raw(store, job[0], job[1], start, end), jobs, threads)
    for parts, c in zip(pieces, coeffs):
        for lo, hi, arr in parts:
            weighted_sum_into(acc[lo:hi], [arr], [c])
    if equal:
        np.multiply(acc, np.float32(1.0 / len(weights)), out=acc)
    return acc


class _HeadsKept:
    """A store view that keeps the first bytes read of each object and serves later ranged GETs
    inside them without another request."""

    def __init__(self, store: RangeReader):
        self.store = store
        self.heads: dict[str, bytes] = {}

    def get_range(self, key: str, start: int, end: int) -> bytes:
        head = self.heads.get(key)
        if head is not None and end <= len(head):
            return head[start:end]
        data = self.store.get_range(key, start, end)
        if start == 0:
            self.heads[key] = data
        return data


def reduce_updates(
    store: RangeReader, update_keys: Sequence[str], weights: Sequence[float], threads: int = FETCH_THREADS
) -> dict[str, np.ndarray]:
    """The single aggregator's weighted average, streamed: the same result as
    `weighted_average([decode(store.get(k)) ...], weights)`, bit for bit, but the updates are
    fetched in parallel (ranged GETs of their data sections) and summed as they arrive, with no
    decoded copies. Returns float32 arrays keyed like the updates' floating tensors, and int64
    arrays for their integer tensors."""
    heads = _HeadsKept(store)
    layouts = _read_layouts(heads, update_keys, threads, probe=WHOLE_PROBE)
    flat = reduce_slice(heads, update_keys, weights, 0, layouts[0].numel, layouts=layouts, threads=threads)
    return {**unflatten(flat, layouts[0]), **reduce_integers(heads, update_keys, weights, layouts, threads)}


# --------------------------------------------------------------------------- sharded aggregation


def commit_accepted(store: ObjectStore, run_id: str, rnd: int, accepted: list[dict]) -> list[dict]:
    """Fix the set of accepted updates for round rnd: the first caller's list wins, every caller
    (each of the k aggregators, retries included) gets that list back, so all slices average the
    same updates even if a late worker's record appears between two aggregators' reads."""
    body = json.dumps(
        [{"worker": int(a["worker"]), "samples": float(a["samples"])} for a in accepted], sort_keys=True
    ).encode()
    store.put(keys.accepted_key(run_id, rnd), body, if_absent=True)
    return json.loads(store.get(keys.accepted_key(run_id, rnd)))


def _add_mean_of_updates(
    store: ObjectStore,
    new: np.ndarray,
    source: ModelSource,
    update_keys: list[str],
    weights: list[float],
    layouts: list[FlatLayout],
    *,
    start: int,
    end: int,
    server_lr: float,
    threads: int,
) -> int:
    """new += server_lr * weighted mean of the updates' flat [start, end); returns their itemsize."""
    if not update_keys:
        return 4
    model_layout = source.layout() if isinstance(source, SlicedModel) else source
    if layouts[0].spec() != model_layout.spec():
        raise ValueError(f"update {update_keys[0]} does not match the model's tensors")
    avg = reduce_slice(store, update_keys, weights, start, end, layouts=layouts, threads=threads)
    if server_lr == 1.0:
        np.add(new, avg, out=new)
    else:
        new += np.float32(server_lr) * avg
    return layouts[0].tensors[0].itemsize if layouts[0].tensors else 4


def aggregate_slice(
    store: ObjectStore,
    run_id: str,
    rnd: int,
    j: int,
    k: int,
    accepted: list[dict],
    server_lr: float = 1.0,
    threads: int = FETCH_THREADS,
) -> dict[str, Any]:
    """Aggregator j of k for round rnd: slice j of model rnd+1 = slice j of model rnd
    + server_lr * weighted mean of slice j of the accepted updates. Idempotent (first writer wins).

    `accepted` is [{"worker", "samples"}], normally from `commit_accepted`. Raises
    FloatingPointError (writing nothing) if the slice has NaN or Inf.
    """
    t0 = time.perf_counter()
    update_keys = [keys.update_key(run_id, rnd, int(a["worker"])) for a in accepted]
    weights = [float(a["samples"]) for a in accepted]
    _, source = model_source(store, run_id, rnd)
    manifest = next_manifest(run_id, rnd, source, k)
    k = len(manifest.bounds)
    if not 0 <= j < k:
        raise ValueError(f"slice {j} of {k}")
    start, end = manifest.bounds[j]
    info: dict[str, Any] = {"slice": j, "of": k, "start": start, "end": end, "skipped": True, "bytes_read": 0}
    # A retried aggregator finds its slice there already; one that died between its slice and
    # the rest (aggregator 0) or the manifest writes what is missing, not the slice again.
    has_rest = j == 0 and manifest.rest is not None
    if store.exists(manifest.keys[j]):
        rest_missing = manifest.rest is not None and has_rest and not store.exists(manifest.rest)
        if rest_missing:
            layouts = _read_layouts(store, update_keys, threads, probe=HEADER_PROBE) if update_keys else []
            _write_rest(store, run_id, rnd, source, manifest, update_keys, weights, layouts, threads)
        if rest_missing or not store.exists(keys.slices_manifest_key(run_id, rnd + 1)):
            write_manifest(store, run_id, rnd + 1, manifest)
        return {**info, "seconds": time.perf_counter() - t0}

    new = read_model_range(store, run_id, rnd, start, end, source)
    layouts = _read_layouts(store, update_keys, threads, probe=HEADER_PROBE) if update_keys else []
    itemsize = _add_mean_of_updates(
        store, new, source, update_keys, weights, layouts, start=start, end=end, server_lr=server_lr, threads=threads
    )
    if not all_finite(new):
        raise FloatingPointError(f"round {rnd}: slice {j}/{k} of the averaged model has NaN or Inf")
    write_slice(store, manifest, j, new)
    if has_rest:  # written after the slice: a slice not there yet has no rest either
        _write_rest(store, run_id, rnd, source, manifest, update_keys, weights, layouts, threads)
    write_manifest(store, run_id, rnd + 1, manifest)
    bytes_read = (end - start) * (itemsize * len(update_keys) + 4)
    return {**info, "skipped": False, "bytes_read": bytes_read, "seconds": time.perf_counter() - t0}


def _write_rest(
    store: ObjectStore,
    run_id: str,
    rnd: int,
    source: ModelSource,
    manifest: SlicedModel,
    update_keys: list[str],
    weights: list[float],
    layouts: list[FlatLayout],
    threads: int,
) -> None:
    """Model rnd+1's non-floating tensors (aggregator 0's part besides its slice): model rnd's,
    plus the weighted mean of the updates' integer tensors."""
    assert manifest.rest is not None
    rest = read_rest(store, run_id, rnd, source)
    if update_keys:
        for name, d in reduce_integers(store, update_keys, weights, layouts, threads).items():
            rest[name] = add_integer(rest[name], d)
    write_rest(store, manifest.rest, rest)
