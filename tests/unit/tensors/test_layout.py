"""The flat layout from a safetensors header: names, offsets, byte ranges, slices."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import save as np_save

from smlt.runtime.tensors.format import parse_header
from smlt.runtime.tensors.layout import flatten, read_flat_raw, read_layout, slice_bounds, unflatten


def _state(rng, scale=1.0):
    return {
        "0.weight": (rng.standard_normal((64, 33)) * scale).astype(np.float32),
        "0.bias": (rng.standard_normal(64) * scale).astype(np.float32),
        "2.weight": (rng.standard_normal((10, 64)) * scale).astype(np.float32),
        "2.bias": (rng.standard_normal(10) * scale).astype(np.float32),
    }


def test_layout_from_header_matches_state():
    rng = np.random.default_rng(0)
    st = _state(rng)
    blob = np_save(st, metadata={"samples": "12345", "worker": "7"})
    lay = read_layout(_Mem(blob), "k")
    assert [t.name for t in lay.tensors] == sorted(st)
    assert lay.numel == sum(v.size for v in st.values())
    assert parse_header(blob)[1] == {"samples": "12345", "worker": "7"}
    # a uniform-dtype object: any flat slice is ONE contiguous byte range
    for s, e in [(0, 10), (5, 2000), (100, lay.numel), (0, lay.numel)]:
        assert len(lay.segments(s, e)) == 1
    flat = flatten(st)
    seg = lay.segments(1000, 2500)[0]
    np.testing.assert_array_equal(np.frombuffer(blob[seg.begin : seg.end], np.float32), flat[1000:2500])
    back = unflatten(flat, lay)
    for k in st:
        np.testing.assert_array_equal(back[k], st[k])


def test_layout_skips_integer_buffers_and_handles_mixed_dtypes():
    st = {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "steps": np.array([3], np.int64),
        "h": np.arange(4, dtype=np.float16),
    }
    blob = np_save(st)
    lay = read_layout(_Mem(blob), "k")
    assert [t.name for t in lay.tensors] == ["h", "w"] and lay.others == ("steps",)
    out = []
    for lo, hi, arr in read_flat_raw(_Mem(blob), "k", lay, 2, 8):
        out.append((lo, hi, arr.astype(np.float32)))
    got = np.concatenate([a for _, _, a in sorted(out, key=lambda x: x[0])])
    np.testing.assert_array_equal(got, np.array([2, 3, 0, 1, 2, 3], np.float32))


class _Mem:
    def __init__(self, blob):
        self.blob = blob

    def get_range(self, key, start, end):
        return self.blob[start:end]


def test_slice_bounds_cover_exactly():
    for numel, k in [(10, 3), (7, 7), (5, 9), (1_000_003, 6)]:
        b = slice_bounds(numel, k)
        assert b[0][0] == 0 and b[-1][1] == numel
        assert all(x[1] == y[0] for x, y in zip(b, b[1:]))
