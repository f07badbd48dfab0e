"""The blocked reduce: same answers as the textbook formula, for every dtype and block size."""

from __future__ import annotations

import numpy as np
import pytest

from smlt.runtime.aggregate.reduce import (
    all_finite,
    apply_update,
    is_finite,
    weighted_average,
    weighted_mean_into,
    weighted_sum_into,
)
from smlt.runtime.tensors.dtypes import to_bf16, to_float32


@pytest.mark.parametrize("block", [1, 7, 1024, 1 << 18])
def test_weighted_sum_blocks(block):
    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal(10_001).astype(np.float32) for _ in range(5)]
    acc = np.ones(10_001, np.float32)
    weighted_sum_into(acc, arrs, [0.5, 1.0, 2.0, -1.0, 0.0], block=block)
    expect = 1 + sum(c * a.astype(np.float64) for c, a in zip([0.5, 1.0, 2.0, -1.0, 0.0], arrs))
    np.testing.assert_allclose(acc, expect, rtol=1e-5, atol=1e-5)


def test_weighted_mean_equal_and_unequal():
    rng = np.random.default_rng(1)
    arrs = [rng.standard_normal((100, 37)).astype(np.float32) for _ in range(4)]
    acc = np.empty((100, 37), np.float32)
    weighted_mean_into(acc, arrs, [3, 3, 3, 3])
    np.testing.assert_allclose(acc, np.mean(arrs, axis=0), rtol=1e-5, atol=1e-6)
    weighted_mean_into(acc, arrs, [1, 0, 0, 3])
    np.testing.assert_allclose(acc, (arrs[0] + 3 * arrs[3]) / 4, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        weighted_mean_into(acc, arrs, [0, 0, 0, 0])


def test_mixed_dtypes_widen_blockwise():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(3000).astype(np.float32)
    ups = [{"w": x}, {"w": x.astype(np.float16)}, {"w": to_bf16(x)}]
    out = weighted_average(ups, [1, 1, 1])["w"]
    expect = (x + x.astype(np.float16).astype(np.float32) + to_float32(to_bf16(x))) / 3
    np.testing.assert_allclose(out, expect, rtol=1e-6, atol=1e-7)


def test_size_mismatch_is_an_error():
    with pytest.raises(ValueError, match="size mismatch"):
        weighted_sum_into(np.zeros(3, np.float32), [np.zeros(4, np.float32)], [1.0])


def test_apply_update_keeps_dtypes_and_untouched_tensors():
    g = {"w": np.ones(4, np.float32), "h": np.ones(2, np.float16), "n": np.array([7], np.int64)}
    new = apply_update(g, {"w": np.full(4, 0.5, np.float32), "h": to_bf16(np.full(2, 0.25, np.float32))}, 1.0)
    assert new["w"].dtype == np.float32 and new["h"].dtype == np.float16
    assert new["n"] is g["n"]
    np.testing.assert_array_equal(new["h"], np.float16([1.25, 1.25]))
    assert g["w"][0] == 1.0  # the input is not modified


def test_all_finite():
    assert all_finite(np.zeros(0, np.float32)) and all_finite(np.arange(3))
    for bad in (np.nan, np.inf, -np.inf):
        a = np.zeros(100, np.float32)
        a[57] = bad
        assert not all_finite(a)
        assert not is_finite({"a": a})
