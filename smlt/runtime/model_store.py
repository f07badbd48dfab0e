"""Where model r lives and how to read or write it: ONE object (`keys.model_key`, written by the
single aggregator and by round 0) or k slices of its flat float32 vector plus a manifest (written
by k sharded aggregators, see `reduce.aggregate_slice`).

Keys of a sliced model (smlt/runtime/keys.py):
    rounds/{r}/model.slices.json                              manifest: tensors, dtypes, slice bounds
    rounds/{r}/model.slices/{j:05d}-of-{k:05d}.safetensors    slice j of the flat float32 vector
    rounds/{r}/model.slices/rest.safetensors                  non-floating tensors, if the model has any

Next round's workers read the k slices in parallel (`read_model` / `read_model_blob`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from smlt.runtime import keys
from smlt.runtime.store.base import NotFound, ObjectStore
from smlt.runtime.store.parallel import FETCH_THREADS, ordered_map
from smlt.runtime.tensors.digest import check, parts_sha256, sha256_hex
from smlt.runtime.tensors.dtypes import ST_TO_NP
from smlt.runtime.tensors.format import decode, parse_header, save_raw, views
from smlt.runtime.tensors.layout import (
    FlatLayout,
    layout_of_tensors,
    read_flat,
    read_layout,
    slice_bounds,
)

MANIFEST_FORMAT = "smlt-flat-slices/1"


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
        return layout_of_tensors(list(self.tensors))

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


# Model r as it is stored: the layout of model.safetensors, or the manifest of its slices.
ModelSource = FlatLayout | SlicedModel


def sliced_manifest(run_id: str, rnd: int, layout: FlatLayout, k: int, has_rest: bool) -> SlicedModel:
    """The manifest of model rnd stored as (at most) k slices of a model with this layout."""
    bounds = slice_bounds(layout.numel, k)
    return SlicedModel(
        tuple({"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in layout.tensors),
        tuple(bounds),
        tuple(keys.slice_key(run_id, rnd, j, len(bounds)) for j in range(len(bounds))),
        keys.rest_key(run_id, rnd) if has_rest else None,
    )


def next_manifest(run_id: str, rnd: int, source: ModelSource, k: int) -> SlicedModel:
    """The manifest of model rnd+1 as k slices, with the tensors of model rnd (`source`)."""
    if isinstance(source, SlicedModel):
        return sliced_manifest(run_id, rnd + 1, source.layout(), k, source.rest is not None)
    return sliced_manifest(run_id, rnd + 1, source, k, bool(source.others))


def model_source(store: ObjectStore, run_id: str, rnd: int) -> tuple[str, ModelSource]:
    """Where model rnd lives: ("single", FlatLayout) for model.safetensors, else ("sliced", SlicedModel)."""
    try:
        return "single", read_layout(store, keys.model_key(run_id, rnd))
    except NotFound:
        pass
    try:
        return "sliced", SlicedModel.from_json(store.get(keys.slices_manifest_key(run_id, rnd)))
    except NotFound:
        raise NotFound(
            f"no model for round {rnd} of run {run_id} (neither "
            f"{keys.model_key(run_id, rnd)} nor {keys.slices_manifest_key(run_id, rnd)})"
        ) from None


def read_model_range(
    store: ObjectStore, run_id: str, rnd: int, start: int, end: int, source: ModelSource | None = None
) -> np.ndarray:
    """Flat elements [start, end) of model rnd as float32, whichever way it is stored."""
    src = source or model_source(store, run_id, rnd)[1]
    if isinstance(src, FlatLayout):
        return read_flat(store, keys.model_key(run_id, rnd), src, start, end)
    if not 0 <= start <= end <= src.numel:
        raise ValueError(f"range [{start}, {end}) outside model {rnd}'s {src.numel} elements")
    out = np.empty(end - start, dtype=np.float32)
    for (s, e), key in zip(src.bounds, src.keys):
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            out[lo - start : hi - start] = read_flat(store, key, read_layout(store, key), lo - s, hi - s)
    return out


def _slice_blob(values: np.ndarray, start: int, end: int, j: int, k: int) -> bytes:
    return save_raw(
        [("flat", np.ascontiguousarray(values, dtype=np.float32))],
        {"start": str(start), "end": str(end), "slice": str(j), "of": str(k)},
    )


def write_slice(store: ObjectStore, manifest: SlicedModel, j: int, values: np.ndarray) -> None:
    """Slice j of a sliced model (first writer wins)."""
    start, end = manifest.bounds[j]
    store.put(manifest.keys[j], _slice_blob(values, start, end, j, len(manifest.keys)), if_absent=True)


def write_manifest(store: ObjectStore, run_id: str, rnd: int, manifest: SlicedModel) -> None:
    store.put(keys.slices_manifest_key(run_id, rnd), manifest.to_json(), if_absent=True)


def read_rest(store: ObjectStore, run_id: str, rnd: int, source: ModelSource) -> dict[str, np.ndarray]:
    """Model rnd's non-floating tensors (not part of the flat vector); writable copies."""
    if isinstance(source, SlicedModel):
        return {k: v.copy() for k, v in views(store.get(source.rest))[0].items()} if source.rest else {}
    blob_key = keys.model_key(run_id, rnd)
    tensors, _, data_start = parse_header(store.get_range(blob_key, 0, source.data_start))
    out = {}
    for name in source.others:
        t = tensors[name]
        b, e = t["data_offsets"]
        raw = store.get_range(blob_key, data_start + b, data_start + e) if e > b else b""
        out[name] = np.frombuffer(raw, dtype=ST_TO_NP[t["dtype"]]).reshape(t["shape"]).copy()
    return out


def write_rest(store: ObjectStore, rest_out: str, rest: dict[str, np.ndarray]) -> None:
    """Model rnd+1's non-floating tensors (first writer wins)."""
    store.put(rest_out, save_raw(sorted(rest.items())), if_absent=True)


def sliced_model_complete(store: ObjectStore, run_id: str, rnd: int) -> bool:
    """True when model rnd's manifest and every slice it names exist (the finish step's check)."""
    try:
        m = SlicedModel.from_json(store.get(keys.slices_manifest_key(run_id, rnd)))
    except NotFound:
        return False
    names = m.keys + ((m.rest,) if m.rest else ())
    return all(store.exists(k) for k in names)


class Getter(Protocol):
    """What hashing a stored model needs of a store (a saved local state's folder too)."""

    def get(self, key: str) -> bytes: ...


def _sliced_parts(store: Getter, run_id: str, rnd: int, threads: int) -> tuple[SlicedModel, list[bytes]] | None:
    """A sliced model's stored parts, in digest order: the manifest, its slices (fetched in
    parallel), the rest object if any. None when model rnd has no manifest."""
    try:
        raw = store.get(keys.slices_manifest_key(run_id, rnd))
    except NotFound:
        return None
    src = SlicedModel.from_json(raw)
    names = list(src.keys) + ([src.rest] if src.rest else [])
    return src, [raw, *ordered_map(store.get, names, threads)]


def _assemble(src: SlicedModel, slices: list[bytes], rest: bytes | None) -> dict[str, np.ndarray]:
    """A sliced model's tensors from its slices' bytes, in the dtypes the manifest names (BF16
    widened to float32)."""
    flat = np.empty(src.numel, dtype=np.float32)
    for (s, e), key, blob in zip(src.bounds, src.keys, slices):
        arrays, meta = views(blob)
        if (int(meta["start"]), int(meta["end"])) != (s, e):
            raise ValueError(f"slice {key} holds [{meta['start']}, {meta['end']}), the manifest says [{s}, {e})")
        flat[s:e] = arrays["flat"]
    state = {}
    for t, d in zip(src.layout().tensors, src.tensors):
        v = flat[t.offset : t.offset + t.numel].reshape(t.shape)
        state[t.name] = v if d["dtype"] in ("F32", "BF16") else v.astype(ST_TO_NP[d["dtype"]])
    if rest is not None:
        state.update(views(rest)[0])
    return state


@dataclass(frozen=True)
class StoredModel:
    """Model r as read: its safetensors bytes (assembled when sliced), its digest as stored
    (`smlt.runtime.tensors.digest`: of the one object, or of the slices' parts) and the key errors name."""

    key: str
    blob: bytes
    sha256: str


def fetch_model(store: ObjectStore, run_id: str, rnd: int, threads: int = FETCH_THREADS) -> StoredModel:
    """Model rnd and its digest: model.safetensors as stored, else assembled from its slices."""
    key = keys.model_key(run_id, rnd)
    try:
        blob = store.get(key)
        return StoredModel(key, blob, sha256_hex(blob))
    except NotFound:
        pass
    sliced = _sliced_parts(store, run_id, rnd, threads)
    if sliced is None:
        raise NotFound(
            f"no model for round {rnd} of run {run_id} (neither {key} nor {keys.slices_manifest_key(run_id, rnd)})"
        )
    src, parts = sliced
    slices, rest = parts[1 : 1 + len(src.keys)], (parts[-1] if src.rest else None)
    blob = save_raw(sorted(_assemble(src, slices, rest).items()))
    return StoredModel(keys.slices_manifest_key(run_id, rnd), blob, parts_sha256(parts))


def model_sha256(store: Getter, run_id: str, rnd: int, threads: int = FETCH_THREADS) -> str:
    """The digest of model rnd as stored (a sliced model is hashed, not assembled)."""
    try:
        return sha256_hex(store.get(keys.model_key(run_id, rnd)))
    except NotFound:
        pass
    sliced = _sliced_parts(store, run_id, rnd, threads)
    if sliced is None:
        raise NotFound(f"no model for round {rnd} of run {run_id}")
    return parts_sha256(sliced[1])


def verified_model(
    store: ObjectStore, run_id: str, rnd: int, expected: str | None, threads: int = FETCH_THREADS
) -> StoredModel:
    """Model rnd, DigestMismatch (naming the object and both digests) unless its digest is the
    one recorded when it was written (`expected`; None for items older than digests)."""
    model = fetch_model(store, run_id, rnd, threads)
    check(model.key, model.sha256, expected, f"model {rnd}")
    return model


def read_model(store: ObjectStore, run_id: str, rnd: int, threads: int = FETCH_THREADS) -> dict[str, np.ndarray]:
    """Model rnd as numpy arrays, from model.safetensors or from its slices fetched in parallel.
    A sliced model's tensors come back in the dtypes the manifest names (BF16 widened to float32)."""
    return decode(fetch_model(store, run_id, rnd, threads).blob)


def read_model_blob(store: ObjectStore, run_id: str, rnd: int, threads: int = FETCH_THREADS) -> bytes:
    """Model rnd as safetensors bytes (what the worker's `bytes_to_state` and final/ need).
    A single-object model is returned as stored; a sliced one is assembled (float32)."""
    return fetch_model(store, run_id, rnd, threads).blob
