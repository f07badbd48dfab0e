"""The flat parameter vector of a safetensors object, and reading parts of it with ranged GETs.

An update (or a model) is one safetensors object. Its *flat vector* is the concatenation of its
floating tensors in name order. `FlatLayout` maps element ranges of that vector to byte ranges
of the object, computed from the safetensors header alone. safetensors writes tensors of one
dtype in name order, so for an update (all float32, or all fp16/bf16 when compressed) a
contiguous slice of the flat vector is ONE contiguous byte range: one ranged GET per slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from smlt.runtime.tensors.dtypes import FLOATING, INTEGER, NP_TO_ST, ST_TO_NP, to_float32
from smlt.runtime.tensors.format import header_length, parse_header

# Bytes read speculatively for a header; a second ranged GET fetches the rest if it is longer.
HEADER_PROBE = 64 * 1024


class RangeReader(Protocol):
    """What reading a layout or a slice needs of a store."""

    def get_range(self, key: str, start: int, end: int) -> bytes: ...


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
    others: tuple[str, ...] = ()  # non-floating tensors (not part of the flat vector)
    data_start: int = 0  # absolute offset of the object's data section
    integers: tuple[TensorSlot, ...] = ()  # the integer ones among `others`, with byte positions (offset 0)

    @property
    def numel(self) -> int:
        return self.tensors[-1].offset + self.tensors[-1].numel if self.tensors else 0

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


def _slot(name: str, t: dict, offset: int, data_start: int) -> TensorSlot:
    b, e = t["data_offsets"]
    numel = math.prod(t["shape"])
    if (e - b) != numel * ST_TO_NP[t["dtype"]].itemsize:
        raise ValueError(f"tensor {name!r}: data_offsets {b}..{e} do not match shape {t['shape']}")
    return TensorSlot(name, t["dtype"], tuple(t["shape"]), offset, numel, data_start + b)


def _layout_from_header(tensors: dict, data_start: int) -> FlatLayout:
    slots, others, integers = [], [], []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t["dtype"] not in FLOATING:
            others.append(name)
            if t["dtype"] in INTEGER:
                integers.append(_slot(name, t, 0, data_start))
            continue
        slots.append(_slot(name, t, offset, data_start))
        offset += slots[-1].numel
    return FlatLayout(tuple(slots), tuple(others), data_start, tuple(integers))


def layout_of_tensors(described: list[dict]) -> FlatLayout:
    """The layout of tensors described as {"name", "shape", "dtype"} in flat order (no byte positions)."""
    slots, offset = [], 0
    for t in described:
        numel = math.prod(t["shape"])
        slots.append(TensorSlot(t["name"], t["dtype"], tuple(t["shape"]), offset, numel, 0))
        offset += numel
    return FlatLayout(tuple(slots))


def layout_of_state(state: dict[str, np.ndarray]) -> FlatLayout:
    """The flat layout of an in-memory state dict (offsets only; no byte positions)."""
    dtypes = {name: NP_TO_ST.get(v.dtype) for name, v in state.items()}
    floating = [n for n in sorted(state) if dtypes[n] in FLOATING]
    layout = layout_of_tensors([{"name": n, "shape": state[n].shape, "dtype": dtypes[n]} for n in floating])
    return replace(layout, others=tuple(n for n in sorted(state) if dtypes[n] not in FLOATING))


def read_layout(store: RangeReader, key: str, probe: int = HEADER_PROBE) -> FlatLayout:
    """The flat layout of a stored safetensors object: one small ranged GET (two if the header is
    longer than `probe`)."""
    head = store.get_range(key, 0, probe)
    n = header_length(head[:8], key)
    if 8 + n > len(head):
        head += store.get_range(key, len(head), 8 + n)
    tensors, _, data_start = parse_header(head, key)
    return _layout_from_header(tensors, data_start)


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
    """k contiguous, near-equal slices of [0, numel) (fewer when there are fewer elements)."""
    k = max(1, min(k, max(1, numel)))
    return [(j * numel // k, (j + 1) * numel // k) for j in range(k)]


def read_flat_raw(
    store: RangeReader, key: str, layout: FlatLayout, start: int, end: int
) -> list[tuple[int, int, np.ndarray]]:
    """Flat elements [start, end) of a stored object, in its stored dtype, as (lo, hi, array)
    pieces: one ranged GET per contiguous byte range (one in all for a uniform-dtype update)."""
    return [
        (s.lo, s.hi, np.frombuffer(store.get_range(key, s.begin, s.end), dtype=ST_TO_NP[s.dtype]))
        for s in layout.segments(start, end)
    ]


def read_integers(store: RangeReader, key: str, layout: FlatLayout) -> dict[str, np.ndarray]:
    """The integer tensors of a stored object (small: batch norm's counters), one ranged GET each."""
    out = {}
    for t in layout.integers:
        dt = ST_TO_NP[t.dtype]
        raw = store.get_range(key, t.begin, t.begin + t.numel * t.itemsize) if t.numel else b""
        out[t.name] = np.frombuffer(raw, dtype=dt).reshape(t.shape)
    return out


def read_flat(store: RangeReader, key: str, layout: FlatLayout, start: int, end: int) -> np.ndarray:
    """Flat elements [start, end) of a stored object as float32."""
    out = np.empty(end - start, dtype=np.float32)
    for lo, hi, arr in read_flat_raw(store, key, layout, start, end):
        out[lo:hi] = to_float32(arr)
    return out
