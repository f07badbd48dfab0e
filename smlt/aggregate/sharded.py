"""Sharded aggregation and per-step reduce-scatter through an ObjectStore (numpy only, no torch).

The flat parameter vector
-------------------------
An update (or a model) is one safetensors object. Its *flat vector* is the concatenation of its
floating tensors in name order. `FlatLayout` maps element ranges of that vector to byte ranges
of the object, computed from the safetensors header alone (8-byte little-endian length + JSON
with `data_offsets`). safetensors writes tensors of one dtype in name order, so for an update
(all float32, or all fp16/bf16 when compressed) a contiguous slice of the flat vector is ONE
contiguous byte range: one ranged GET per worker per slice.

Sharded aggregation (local SGD)
-------------------------------
`plan_slices(param_bytes, n_workers)` chooses k aggregators. Aggregator j of k
(`aggregate_slice`) reads each accepted worker's header (one small ranged GET), then bytes of
slice j of each update (one ranged GET), averages them weighted by samples (same arithmetic and
order as the single aggregator, so the result is bit-for-bit the same), adds them to slice j of
model r, and writes slice j of model r+1 plus a small manifest. Next round's workers read the k
slices in parallel (`read_model` / `read_model_blob`). Traffic per aggregator is n * P / k bytes
in and P / k out, so with k proportional to n it stays constant as workers grow.

Keys (beside `keys.model_key`, which a sharded round does not write):
    rounds/{r}/accepted.json                          the accepted (worker, samples), first writer wins
    rounds/{r}/model.slices.json                      manifest: tensors, dtypes, slice bounds
    rounds/{r}/model.slices/{j:05d}-of-{k:05d}.safetensors   slice j of the flat float32 vector
    rounds/{r}/model.slices/rest.safetensors          non-floating tensors, if the model has any

Per-step synchronous mode
-------------------------
`ReduceScatter` averages one gradient per worker per step through the store, as SMLT does: each
of n workers writes its gradient (one object), reduces its 1/n slice of all gradients (ranged
GETs), writes the averaged slice, then reads all averaged slices. Every wait is a bounded polling
barrier (`wait_get`) that raises `BarrierTimeout` naming the missing key.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smlt import keys
from smlt.aggregate.compress import BF16, ITEMSIZE, ST_DTYPE, encode_array, to_float32
from smlt.aggregate.reduce import (
    FLOATING,
    ST_TO_NP,
    all_finite,
    header_length,
    parse_header,
    save_raw,
    views,
    weighted_sum_into,
)
from smlt.store.base import NotFound, ObjectStore

# Bytes read speculatively for a header; a second ranged GET fetches the rest if it is longer.
HEADER_PROBE = 64 * 1024
# Concurrent GETs per reducer (I/O bound: threads are enough).
FETCH_THREADS = 16


# --------------------------------------------------------------------------- flat layout


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str  # safetensors dtype (F32, F16, BF16, ...)
    shape: tuple[int, ...]
    offset: int  # first element in the flat vector
    numel: int
    begin: int  # absolute byte offset of the tensor's data in the object

    @property
    def itemsize(self) -> int:
        return ST_TO_NP[self.dtype].itemsize


@dataclass(frozen=True)
class Segment:
    """A contiguous byte range of one object holding flat elements [lo, hi) of a request."""

    begin: int
    end: int
    dtype: str
    lo: int  # position in the requested slice
    hi: int


@dataclass(frozen=True)
class FlatLayout:
    tensors: tuple[TensorSlot, ...]  # floating tensors, in flat (name) order
    metadata: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    others: tuple[str, ...] = ()  # non-floating tensors (not part of the flat vector)
    data_start: int = 0
    nbytes: int = 0  # size of the whole object

    @property
    def numel(self) -> int:
        return self.tensors[-1].offset + self.tensors[-1].numel if self.tensors else 0

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def spec(self) -> list[tuple[str, tuple[int, ...]]]:
        """What must match between updates and the model: names and shapes, in flat order."""
        return [(t.name, t.shape) for t in self.tensors]

    def segments(self, start: int, end: int) -> list[Segment]:
        """Byte ranges of this object that hold flat elements [start, end), coalesced."""
        if not 0 <= start <= end <= self.numel:
            raise ValueError(f"slice [{start}, {end}) outside the flat vector of {self.numel} elements")
        out: list[Segment] = []
        for t in self.tensors:
            lo, hi = max(start, t.offset), min(end, t.offset + t.numel)
            if lo >= hi:
                continue
            b = t.begin + (lo - t.offset) * t.itemsize
            e = t.begin + (hi - t.offset) * t.itemsize
            if out and out[-1].end == b and out[-1].dtype == t.dtype:
                last = out[-1]
                out[-1] = Segment(last.begin, e, t.dtype, last.lo, hi - start)
            else:
                out.append(Segment(b, e, t.dtype, lo - start, hi - start))
        return out

    def byte_ranges(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(s.begin, s.end) for s in self.segments(start, end)]

    def describe(self) -> list[dict]:
        return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in self.tensors]


def layout_from_header(tensors: dict, metadata: dict[str, str], data_start: int) -> FlatLayout:
    slots, others = [], []
    offset, end = 0, 0
    for name in sorted(tensors):
        t = tensors[name]
        b, e = t["data_offsets"]
        end = max(end, e)
        if t["dtype"] not in FLOATING:
            others.append(name)
            continue
        numel = math.prod(t["shape"]) if t["shape"] else 1
        if (e - b) != numel * ST_TO_NP[t["dtype"]].itemsize:
            raise ValueError(f"tensor {name!r}: data_offsets {b}..{e} do not match shape {t['shape']}")
        slots.append(TensorSlot(name, t["dtype"], tuple(t["shape"]), offset, numel, data_start + b))
        offset += numel
    return FlatLayout(tuple(slots), dict(metadata), tuple(others), data_start, data_start + end)


def layout_of(blob: bytes) -> FlatLayout:
    """The flat layout of a safetensors blob held in memory."""
    return layout_from_header(*parse_header(blob[: 8 + header_length(blob[:8])]))


def layout_of_state(state: dict[str, np.ndarray]) -> FlatLayout:
    """The flat layout of an in-memory state dict (offsets only; no byte positions)."""
    slots, offset = [], 0
    others = []
    for name in sorted(state):
        v = state[name]
        if v.dtype != BF16 and not np.issubdtype(v.dtype, np.floating):
            others.append(name)
            continue
        dt = "BF16" if v.dtype == BF16 else {2: "F16", 4: "F32", 8: "F64"}[v.dtype.itemsize]
        slots.append(TensorSlot(name, dt, tuple(v.shape), offset, int(v.size), 0))
        offset += int(v.size)
    return FlatLayout(tuple(slots), {}, tuple(others))


def read_layout(store: ObjectStore, key: str, probe: int = HEADER_PROBE) -> FlatLayout:
    """The flat layout of a stored safetensors object: one small ranged GET (two if the header is
    longer than `probe`)."""
    head = store.get_range(key, 0, probe)
    n = header_length(head[:8])
    if 8 + n > len(head):
        head += store.get_range(key, len(head), 8 + n)
    return layout_from_header(*parse_header(head))


def flatten(state: dict[str, np.ndarray], layout: FlatLayout | None = None) -> np.ndarray:
    """The flat float32 vector of a state dict's floating tensors (name order)."""
    layout = layout or layout_of_state(state)
    out = np.empty(layout.numel, dtype=np.float32)
    for t in layout.tensors:
        out[t.offset : t.offset + t.numel] = to_float32(state[t.name]).reshape(-1)
    return out


def unflatten(flat: np.ndarray, layout: FlatLayout) -> dict[str, np.ndarray]:
    """Views of a flat vector as named tensors (no copies)."""
    return {t.name: flat[t.offset : t.offset + t.numel].reshape(t.shape) for t in layout.tensors}


def slice_bounds(numel: int, k: int) -> list[tuple[int, int]]:
    """k contiguous, near-equal slices of [0, numel)."""
    k = max(1, min(k, max(1, numel)))
    return [(j * numel // k, (j + 1) * numel // k) for j in range(k)]


def _decode_segment(raw: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(raw, dtype=ST_TO_NP[dtype])


def read_flat_raw(
    store: ObjectStore, key: str, layout: FlatLayout, start: int, end: int
) -> list[tuple[int, int, np.ndarray]]:
    """Flat elements [start, end) of a stored object, in its stored dtype, as (lo, hi, array)
    pieces: one ranged GET per contiguous byte range (one in all for a uniform-dtype update)."""
    return [
        (s.lo, s.hi, _decode_segment(store.get_range(key, s.begin, s.end), s.dtype))
        for s in layout.segments(start, end)
    ]


def read_flat(store: ObjectStore, key: str, layout: FlatLayout, start: int, end: int) -> np.ndarray:
    out = np.empty(end - start, dtype=np.float32)
    for lo, hi, arr in read_flat_raw(store, key, layout, start, end):
        out[lo:hi] = to_float32(arr)
    return out


def _ordered_map(fn: Callable, items: Sequence, threads: int):
    """fn over items with at most `threads` in flight, yielding results in order (bounded memory)."""
    if threads <= 1 or len(items) <= 1:
        for it in items:
            yield fn(it)
        return
    with ThreadPoolExecutor(max_workers=threads) as ex:
        pending: deque = deque()
        it = iter(items)
        for x in it:
            pending.append(ex.submit(fn, x))
            if len(pending) >= threads:
                break
        while pending:
            yield pending.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(ex.submit(fn, nxt))


# --------------------------------------------------------------------------- the reduce


def read_layouts(store: ObjectStore, update_keys: Sequence[str], threads: int = FETCH_THREADS) -> list[FlatLayout]:
    return list(_ordered_map(lambda k: read_layout(store, k), list(update_keys), threads))


def reduce_slice(
    store: ObjectStore,
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
    bit-for-bit what `reduce.weighted_average` computes for the same elements.
    """
    update_keys = list(update_keys)
    if not update_keys or len(update_keys) != len(weights) or float(sum(weights)) <= 0:
        raise ValueError("nothing to average (need as many positive weights as updates)")
    if layouts is None:
        layouts = read_layouts(store, update_keys, threads)
    ref = layouts[0].spec()
    for key, lay in zip(update_keys, layouts):
        if lay.spec() != ref:
            raise ValueError(f"update {key} does not have the tensors and shapes of {update_keys[0]}")
    equal = all(w == weights[0] for w in weights)
    total = float(sum(weights))
    coeffs = [1.0] * len(weights) if equal else [w / total for w in weights]
    acc = np.zeros(end - start, dtype=np.float32)
    jobs = list(zip(update_keys, layouts, coeffs))
    for pieces, (_, _, c) in zip(
        _ordered_map(lambda j: read_flat_raw(store, j[0], j[1], start, end), jobs, threads), jobs
    ):
        for lo, hi, arr in pieces:
            weighted_sum_into(acc[lo:hi], [arr], [c])
    if equal:
        np.multiply(acc, np.float32(1.0 / len(weights)), out=acc)
    return acc


def reduce_updates(
    store: ObjectStore, update_keys: Sequence[str], weights: Sequence[float], threads: int = FETCH_THREADS
) -> dict[str, np.ndarray]:
    """The single aggregator's weighted average, streamed: the same result as
    `weighted_average([decode(store.get(k)) ...], weights)`, bit for bit, but the updates are
    fetched in parallel (ranged GETs of their data sections) and summed as they arrive, with no
    decoded copies. Returns float32 arrays keyed like the updates' floating tensors."""
    heads = _HeadsKept(store)
    layouts = list(_ordered_map(lambda k: read_layout(heads, k, probe=WHOLE_PROBE), list(update_keys), threads))
    flat = reduce_slice(heads, update_keys, weights, 0, layouts[0].numel, layouts=layouts, threads=threads)
    return unflatten(flat, layouts[0])


# The single aggregator reads every byte of every update, so its header probe can be large: an
# update under 1 MB arrives whole with its header, in one GET instead of two.
WHOLE_PROBE = 1 << 20


class _HeadsKept:
    """A store view that keeps the first bytes read of each object and serves later ranged GETs
    inside them without another request."""

    def __init__(self, store: ObjectStore):
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


def plan_slices(
    param_bytes: int,
    n_workers: int,
    *,
    read_bytes_per_aggregator: int = 256 << 20,
    min_slice_bytes: int = 4 << 20,
    max_aggregators: int = 64,
) -> int:
    """How many aggregators to use for n_workers updates of param_bytes each.

    Each aggregator reads n_workers * param_bytes / k bytes. k is the smallest count that keeps
    that under `read_bytes_per_aggregator` (about 3-4 s at the ~70-100 MB/s one Lambda gets from
    S3, and far below a 3 GB aggregator's memory), so the aggregation time stays flat as workers
    grow; slices stay at least `min_slice_bytes` (below that, request latency dominates) and
    k at most `max_aggregators`. 1 means the single aggregator.
    """
    if param_bytes <= 0 or n_workers <= 0:
        return 1
    k = math.ceil(n_workers * param_bytes / read_bytes_per_aggregator)
    k = min(k, max(1, param_bytes // min_slice_bytes), max_aggregators)
    return max(1, int(k))


# --------------------------------------------------------------------------- sharded model storage

MANIFEST_FORMAT = "smlt-flat-slices/1"


# The keys live in smlt/keys.py (one place); these names are kept for callers of this module.
accepted_key = keys.accepted_key
slices_manifest_key = keys.slices_manifest_key
slice_key = keys.slice_key
rest_key = keys.rest_key
sync_prefix = keys.sync_prefix


def commit_accepted(store: ObjectStore, run_id: str, rnd: int, accepted: list[dict]) -> list[dict]:
    """Fix the set of accepted updates for round rnd: the first caller's list wins, every caller
    (each of the k aggregators, retries included) gets that list back, so all slices average the
    same updates even if a late worker's record appears between two aggregators' reads."""
    body = json.dumps(
        [{"worker": int(a["worker"]), "samples": float(a["samples"])} for a in accepted], sort_keys=True
    ).encode()
    store.put(accepted_key(run_id, rnd), body, if_absent=True)
    return json.loads(store.get(accepted_key(run_id, rnd)))


@dataclass(frozen=True)
class SlicedModel:
    """Manifest of a model stored as k slices of its flat vector."""

    tensors: tuple[dict, ...]  # {"name", "shape", "dtype"} in flat order
    bounds: tuple[tuple[int, int], ...]
    keys: tuple[str, ...]
    rest: str | None = None

    @property
    def numel(self) -> int:
        return self.bounds[-1][1] if self.bounds else 0

    def layout(self) -> FlatLayout:
        slots, off = [], 0
        for t in self.tensors:
            numel = math.prod(t["shape"]) if t["shape"] else 1
            slots.append(TensorSlot(t["name"], t["dtype"], tuple(t["shape"]), off, numel, 0))
            off += numel
        return FlatLayout(tuple(slots))

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "tensors": list(self.tensors),
                "slices": [{"start": s, "end": e, "key": k} for (s, e), k in zip(self.bounds, self.keys)],
                "rest": self.rest,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SlicedModel:
        d = json.loads(raw)
        if d.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a sliced-model manifest (format {d.get('format')!r})")
        return cls(
            tuple(d["tensors"]),
            tuple((s["start"], s["end"]) for s in d["slices"]),
            tuple(s["key"] for s in d["slices"]),
            d.get("rest"),
        )


def sliced_manifest(run_id: str, rnd: int, layout: FlatLayout, k: int, has_rest: bool) -> SlicedModel:
    bounds = slice_bounds(layout.numel, k)
    k = len(bounds)
    return SlicedModel(
        tuple(layout.describe()),
        tuple(bounds),
        tuple(slice_key(run_id, rnd, j, k) for j in range(k)),
        rest_key(run_id, rnd) if has_rest else None,
    )


def _slice_blob(values: np.ndarray, start: int, end: int, j: int, k: int) -> bytes:
    return save_raw(
        [("flat", np.ascontiguousarray(values, dtype=np.float32))],
        {"start": str(start), "end": str(end), "slice": str(j), "of": str(k)},
    )


def model_source(store: ObjectStore, run_id: str, rnd: int) -> tuple[str, Any]:
    """Where model rnd lives: ("single", FlatLayout) for model.safetensors, else ("sliced", SlicedModel)."""
    try:
        return "single", read_layout(store, keys.model_key(run_id, rnd))
    except NotFound:
        pass
    try:
        return "sliced", SlicedModel.from_json(store.get(slices_manifest_key(run_id, rnd)))
    except NotFound:
        raise NotFound(
            f"no model for round {rnd} of run {run_id} (neither "
            f"{keys.model_key(run_id, rnd)} nor {slices_manifest_key(run_id, rnd)})"
        ) from None


def read_model_range(
    store: ObjectStore, run_id: str, rnd: int, start: int, end: int, source: tuple[str, Any] | None = None
) -> np.ndarray:
    """Flat elements [start, end) of model rnd as float32, whichever way it is stored."""
    kind, src = source or model_source(store, run_id, rnd)
    if kind == "single":
        return read_flat(store, keys.model_key(run_id, rnd), src, start, end)
    if not 0 <= start <= end <= src.numel:
        raise ValueError(f"range [{start}, {end}) outside model {rnd}'s {src.numel} elements")
    out = np.empty(end - start, dtype=np.float32)
    for (s, e), key in zip(src.bounds, src.keys):
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            hdr = read_layout(store, key)
            out[lo - start : hi - start] = read_flat(store, key, hdr, lo - s, hi - s)
    return out


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
    source = model_source(store, run_id, rnd)
    kind, src = source
    if kind == "single":
        mlayout = src
        m_spec = mlayout.spec()
        has_rest = bool(mlayout.others)
    else:
        mlayout = src.layout()
        m_spec = mlayout.spec()
        has_rest = src.rest is not None
    manifest = sliced_manifest(run_id, rnd + 1, mlayout, k, has_rest)
    k = len(manifest.bounds)
    if not 0 <= j < k:
        raise ValueError(f"slice {j} of {k}")
    start, end = manifest.bounds[j]
    if store.exists(manifest.keys[j]):  # a retried aggregator: the slice is there already
        return {
            "slice": j,
            "of": k,
            "start": start,
            "end": end,
            "skipped": True,
            "seconds": time.perf_counter() - t0,
            "bytes_read": 0,
        }

    new = read_model_range(store, run_id, rnd, start, end, source)
    if update_keys:
        layouts = read_layouts(store, update_keys, threads)
        if layouts[0].spec() != m_spec:
            raise ValueError(f"update {update_keys[0]} does not match model {rnd}'s tensors")
        avg = reduce_slice(store, update_keys, weights, start, end, layouts=layouts, threads=threads)
        if server_lr == 1.0:
            np.add(new, avg, out=new)
        else:
            new += np.float32(server_lr) * avg
        itemsize = layouts[0].tensors[0].itemsize if layouts[0].tensors else 4
    else:
        itemsize = 4
    if not all_finite(new):
        raise FloatingPointError(f"round {rnd}: slice {j}/{k} of the averaged model has NaN or Inf")
    store.put(manifest.keys[j], _slice_blob(new, start, end, j, k), if_absent=True)
    if j == 0 and has_rest:
        _write_rest(store, run_id, rnd, source, manifest.rest)
    store.put(slices_manifest_key(run_id, rnd + 1), manifest.to_json(), if_absent=True)
    return {
        "slice": j,
        "of": k,
        "start": start,
        "end": end,
        "skipped": False,
        "seconds": time.perf_counter() - t0,
        "bytes_read": (end - start) * (itemsize * len(update_keys) + 4),
    }


def _write_rest(store: ObjectStore, run_id: str, rnd: int, source, rest_out: str) -> None:
    kind, src = source
    if kind == "single":
        blob_key = keys.model_key(run_id, rnd)
        tensors, meta, data_start = parse_header(store.get_range(blob_key, 0, src.data_start))
        arrays = []
        for name in src.others:
            t = tensors[name]
            b, e = t["data_offsets"]
            raw = store.get_range(blob_key, data_start + b, data_start + e)
            arrays.append((name, np.frombuffer(raw, dtype=ST_TO_NP[t["dtype"]]).reshape(t["shape"])))
        store.put(rest_out, save_raw(arrays), if_absent=True)
    else:
        store.put(rest_out, store.get(src.rest), if_absent=True)


def write_sliced_model(
    store: ObjectStore, run_id: str, rnd: int, state: dict[str, np.ndarray], k: int, threads: int = FETCH_THREADS
) -> SlicedModel:
    """Store an in-memory model as k slices + manifest (e.g. a sharded round 0, tests, bench)."""
    layout = layout_of_state(state)
    flat = flatten(state, layout)
    manifest = sliced_manifest(run_id, rnd, layout, k, bool(layout.others))
    kk = len(manifest.bounds)

    def put(jb):
        j, (s, e) = jb
        store.put(manifest.keys[j], _slice_blob(flat[s:e], s, e, j, kk), if_absent=True)

    list(_ordered_map(put, list(enumerate(manifest.bounds)), threads))
    if layout.others:
        store.put(manifest.rest, save_raw([(n, state[n]) for n in layout.others]), if_absent=True)
    store.put(slices_manifest_key(run_id, rnd), manifest.to_json(), if_absent=True)
    return manifest


def sliced_model_complete(store: ObjectStore, run_id: str, rnd: int) -> bool:
    """True when model rnd's manifest and every slice it names exist (the finish step's check)."""
    try:
        m = SlicedModel.from_json(store.get(slices_manifest_key(run_id, rnd)))
    except NotFound:
        return False
    names = m.keys + ((m.rest,) if m.rest else ())
    return all(store.exists(k) for k in names)


def read_model(store: ObjectStore, run_id: str, rnd: int, threads: int = FETCH_THREADS) -> dict[str, np.ndarray]:
    """Model rnd as numpy arrays, from model.safetensors or from its slices fetched in parallel."""
    kind, src = model_source(store, run_id, rnd)
    if kind == "single":
        arrays, _ = views(store.get(keys.model_key(run_id, rnd)))
        return {n: (to_float32(v) if v.dtype == BF16 else v.copy()) for n, v in arrays.items()}
    flat = np.empty(src.numel, dtype=np.float32)

    def fetch(i):
        (s, e), key = src.bounds[i], src.keys[i]
        arrays, meta = views(store.get(key))
        if (int(meta["start"]), int(meta["end"])) != (s, e):
            raise ValueError(f"slice {key} holds [{meta['start']}, {meta['end']}), the manifest says [{s}, {e})")
        flat[s:e] = arrays["flat"]

    list(_ordered_map(fetch, list(range(len(src.keys))), threads))
    layout = src.layout()
    state = {}
    for t, d in zip(layout.tensors, src.tensors):
        v = flat[t.offset : t.offset + t.numel].reshape(t.shape)
        state[t.name] = (
            v if d["dtype"] == "F32" else (to_float32(v) if d["dtype"] == "BF16" else v.astype(ST_TO_NP[d["dtype"]]))
        )
    if src.rest:
        rest, _ = views(store.get(src.rest))
        state.update(rest)
    return state


def read_model_blob(store: ObjectStore, run_id: str, rnd: int, threads: int = FETCH_THREADS) -> bytes:
    """Model rnd as safetensors bytes (what the worker's `bytes_to_state` and final/ need).
    A single-object model is returned as stored; a sliced one is assembled (float32)."""
    try:
        return store.get(keys.model_key(run_id, rnd))
    except NotFound:
        pass
    state = read_model(store, run_id, rnd, threads)
    return save_raw(sorted(state.items()))


# --------------------------------------------------------------------------- per-step sync mode


class BarrierTimeout(TimeoutError):
    """A per-step barrier waited longer than its timeout for another worker's object."""


@dataclass(frozen=True)
class Poll:
    """Polling schedule of a barrier: first wait, growth factor, longest wait, total timeout (s)."""

    first: float = 0.002
    factor: float = 1.5
    longest: float = 0.1
    timeout: float = 120.0


def wait_get(
    store: ObjectStore,
    key: str,
    poll: Poll = Poll(),
    byte_range: tuple[int, int] | None = None,
    deadline: float | None = None,
) -> bytes:
    """GET (or ranged GET) key, polling with backoff until it exists; BarrierTimeout past the deadline."""
    deadline = deadline if deadline is not None else time.monotonic() + poll.timeout
    delay = poll.first
    while True:
        try:
            if byte_range is None:
                return store.get(key)
            return store.get_range(key, *byte_range)
        except NotFound:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise BarrierTimeout(f"timed out waiting for {key}")
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * poll.factor, poll.longest)


class ReduceScatter:
    """Per-step gradient averaging among n workers through a store (reduce-scatter + all-gather).

    Worker i, at step s, with its flat gradient g (float32, numel elements) and weight w:
      1. writes ONE object {prefix}{s}/grad/{i}: for each slice j, a float32 weight w followed by
         g[slice j] (in the codec's dtype). Its header is the same for every worker, so a reader
         knows every byte offset without reading it.
      2. reduces slice i: one ranged GET of slice i (with its weight) from each worker's object,
         weighted mean, written as {prefix}{s}/avg/{i}.
      3. reads all n averaged slices (n GETs) into the averaged gradient, which it returns.
    Traffic per worker per step: about P (1 + 1/n) bytes out and 2 P bytes in, whatever n is.
    Keys are per (step, worker), written first-writer-wins; each wait polls with `poll`.
    After finishing step s a worker deletes its own step s-1 objects (nobody can need them then:
    every worker has written its step s gradient, so has read all of step s-1).
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        n_workers: int,
        worker: int,
        numel: int,
        *,
        codec: str = "none",
        poll: Poll = Poll(),
        cleanup: bool = True,
        threads: int = FETCH_THREADS,
    ):
        if not 0 <= worker < n_workers:
            raise ValueError(f"worker {worker} of {n_workers}")
        self.store, self.prefix, self.n, self.worker = store, prefix, n_workers, worker
        self.numel, self.codec, self.poll, self.cleanup = numel, codec, poll, cleanup
        self.threads = max(1, min(threads, n_workers))
        self.bounds = slice_bounds(numel, n_workers)
        while len(self.bounds) < n_workers:  # fewer elements than workers: empty slices
            self.bounds.append((numel, numel))
        # Byte positions of (weight, slice) j inside a gradient object, from a dummy of the layout.
        self._item = ITEMSIZE[codec]
        dummy = []
        for j, (s, e) in enumerate(self.bounds):
            dummy += [
                (f"s{j:05d}a", np.zeros(1, np.float32)),
                (f"s{j:05d}b", self._encode(np.zeros(e - s, np.float32))),
            ]
        hdr = save_raw(dummy)
        self._data_start = 8 + header_length(hdr[:8])
        self._grad_size = len(hdr)
        self._ranges = []
        pos = self._data_start
        for s, e in self.bounds:
            n = 4 + (e - s) * self._item
            self._ranges.append((pos, pos + n))
            pos += n
        self.step_times: list[dict[str, float]] = []

    def _encode(self, x: np.ndarray) -> np.ndarray:
        return encode_array(x, self.codec)

    def _decode(self, raw: bytes) -> np.ndarray:
        return to_float32(np.frombuffer(raw, dtype=ST_TO_NP[ST_DTYPE[self.codec]]))

    def grad_key(self, step: int, worker: int) -> str:
        return f"{self.prefix}{step:06d}/grad/{worker:05d}.safetensors"

    def avg_key(self, step: int, j: int) -> str:
        return f"{self.prefix}{step:06d}/avg/{j:05d}.safetensors"

    def grad_blob(self, grad: np.ndarray, weight: float) -> bytes:
        tensors = []
        for j, (s, e) in enumerate(self.bounds):
            tensors += [(f"s{j:05d}a", np.array([weight], np.float32)), (f"s{j:05d}b", self._encode(grad[s:e]))]
        blob = save_raw(tensors)
        assert len(blob) == self._grad_size
        return blob

    def allreduce(self, step: int, grad: np.ndarray, weight: float = 1.0) -> np.ndarray:
        """The weighted mean over all workers of their step-`step` gradients (flat float32)."""
        grad = np.asarray(grad, dtype=np.float32).reshape(-1)
        if grad.size != self.numel:
            raise ValueError(f"gradient has {grad.size} elements, expected {self.numel}")
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.poll.timeout
        self.store.put(self.grad_key(step, self.worker), self.grad_blob(grad, weight), if_absent=True)
        t1 = time.perf_counter()

        # 2. reduce my slice of everyone's gradient (in worker order: deterministic everywhere)
        s, e = self.bounds[self.worker]
        rng = self._ranges[self.worker]
        parts = _ordered_map(
            lambda i: wait_get(self.store, self.grad_key(step, i), self.poll, rng, deadline),
            list(range(self.n)),
            self.threads,
        )
        acc = np.zeros(e - s, np.float32)
        total = 0.0
        for raw in parts:
            w = float(np.frombuffer(raw[:4], np.float32)[0])
            if w:
                weighted_sum_into(acc, [self._decode(raw[4:])], [w])
            total += w
        if total <= 0:
            raise ValueError(f"step {step}: all weights are zero")
        np.multiply(acc, np.float32(1.0 / total), out=acc)
        self.store.put(self.avg_key(step, self.worker), save_raw([("avg", self._encode(acc))]), if_absent=True)
        t2 = time.perf_counter()

        # 3. all-gather the averaged slices
        out = np.empty(self.numel, np.float32)

        def fetch(j):
            arrays, _ = views(wait_get(self.store, self.avg_key(step, j), self.poll, None, deadline))
            return j, to_float32(arrays["avg"])

        for j, part in _ordered_map(fetch, list(range(self.n)), self.threads):
            a, b = self.bounds[j]
            out[a:b] = part
        t3 = time.perf_counter()
        if self.cleanup and step > 0:
            for key in (self.grad_key(step - 1, self.worker), self.avg_key(step - 1, self.worker)):
                self.store.delete(key)
        self.step_times.append({"write_s": t1 - t0, "reduce_s": t2 - t1, "gather_s": t3 - t2})
        return out


def delete_prefix(store: ObjectStore, prefix: str) -> int:
    """Delete every key under prefix (the sync objects of a finished round); returns how many."""
    names = store.list(prefix)
    for k in names:
        store.delete(k)
    return len(names)
