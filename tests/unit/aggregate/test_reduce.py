import numpy as np

from smlt.runtime.aggregate.reduce import apply_update, is_finite, weighted_average
from smlt.runtime.tensors.format import decode, encode


def test_weighted_average_matches_definition():
    rng = np.random.default_rng(0)
    ups = [
        {"w": rng.normal(size=(5, 3)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)} for _ in range(4)
    ]
    weights = [10, 20, 30, 40]
    avg = weighted_average(ups, weights)
    for k in ("w", "b"):
        expect = sum(u[k] * w for u, w in zip(ups, weights)) / sum(weights)
        np.testing.assert_allclose(avg[k], expect, rtol=1e-5, atol=1e-6)


def test_apply_update_and_roundtrip():
    g = {"w": np.ones((2, 2), np.float32)}
    new = apply_update(g, {"w": np.full((2, 2), 0.5, np.float32)}, server_lr=2.0)
    np.testing.assert_array_equal(new["w"], np.full((2, 2), 2.0, np.float32))
    assert decode(encode(new))["w"].tolist() == new["w"].tolist()


def test_is_finite_rejects_nan():
    assert is_finite({"w": np.zeros(3, np.float32)})
    assert not is_finite({"w": np.array([0, np.nan], np.float32)})
