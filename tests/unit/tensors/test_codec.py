"""fp16 / bf16 update compression: numpy bit tricks agree with torch, errors are bounded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load as torch_load
from safetensors.torch import save as torch_save

from smlt.runtime.aggregate.reduce import weighted_average
from smlt.runtime.tensors import dtypes as D
from smlt.runtime.tensors.codec import encode_array
from smlt.runtime.tensors.format import decode, encode, save_raw, views
from smlt.runtime.tensors.torch_state import compress_torch_state


def _roundtrip_error(x, codec):
    """Relative L2 error of one encode/decode round trip."""
    y = D.to_float32(encode_array(x, codec))
    return float(np.linalg.norm(x - y)) / (float(np.linalg.norm(x)) or 1.0)


def _x(n=50_000, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 1, n)).astype(np.float32)
    x[:6] = [0.0, -0.0, 1.0, -65504.0, 1e-30, 3e38]
    return x


def test_bf16_bits_match_torch_round_to_nearest_even():
    x = _x()
    ours = D.bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(D.bf16_to_float32(ours), torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_bf16_special_values():
    x = np.array([np.inf, -np.inf, np.nan, np.float32(3.4028235e38)], np.float32)
    y = D.to_float32(D.to_bf16(x))
    assert y[0] == np.inf and y[1] == -np.inf and np.isnan(y[2])
    assert np.isinf(y[3])  # float32 max rounds up past bf16's largest finite value, as in torch
    assert torch.tensor([3.4028235e38]).to(torch.bfloat16).float().isinf().item()


@pytest.mark.parametrize("codec,bound", [("none", 0.0), ("fp16", 1e-3), ("bf16", 8e-3)])
def test_roundtrip_relative_error(codec, bound):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(100_000) * 1e-3).astype(np.float32)  # typical delta magnitudes
    assert _roundtrip_error(x, codec) <= bound


def test_fp16_clips_instead_of_overflowing():
    x = np.array([1e6, -1e6, 1.5], np.float32)
    y = D.to_float32(encode_array(x, "fp16"))
    assert np.isfinite(y).all() and y[0] == 65504.0 and y[2] == 1.5
    t = compress_torch_state({"w": torch.tensor([1e6, -1e6])}, "fp16")["w"]
    assert t.dtype == torch.float16 and torch.isfinite(t).all()


def test_torch_written_compressed_updates_decode_in_numpy():
    rng = np.random.default_rng(2)
    delta = {
        "a": torch.from_numpy(rng.standard_normal((30, 7)).astype(np.float32)),
        "b": torch.from_numpy(rng.standard_normal(7).astype(np.float32)),
        "steps": torch.tensor(3),
    }
    for codec, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        blob = torch_save(compress_torch_state(delta, codec), metadata={"samples": "9"})
        arrays, meta = views(blob)
        assert meta == {"samples": "9"}
        assert arrays["steps"].dtype == np.int64
        for k in ("a", "b"):
            np.testing.assert_array_equal(D.to_float32(arrays[k]), delta[k].to(dt).float().numpy())
        d = decode(blob)
        assert d["a"].dtype in (np.float16, np.float32)
    assert compress_torch_state(delta, "none") is delta


def test_numpy_written_bf16_loads_in_torch():
    x = _x(1000).reshape(10, 100)
    blob = encode({"w": D.to_bf16(x), "b": np.ones(3, np.float32)}, {"k": "v"})
    t = torch_load(blob)
    assert t["w"].dtype == torch.bfloat16
    np.testing.assert_array_equal(t["w"].float().numpy(), D.to_float32(D.to_bf16(x)))
    raw = save_raw([("z", np.float16([1, 2]))])
    assert torch_load(raw)["z"].tolist() == [1.0, 2.0]


def test_reduce_of_compressed_updates_is_close_to_full_precision():
    rng = np.random.default_rng(3)
    ups = [{"w": (rng.standard_normal(20_000) * 1e-3).astype(np.float32)} for _ in range(6)]
    w = [1, 2, 3, 4, 5, 6]
    full = weighted_average(ups, w)["w"]
    for codec, tol in (("fp16", 1e-3), ("bf16", 8e-3)):
        comp = weighted_average([{k: encode_array(v, codec) for k, v in u.items()} for u in ups], w)["w"]
        assert np.linalg.norm(comp - full) / np.linalg.norm(full) < tol


def test_unknown_codec():
    with pytest.raises(ValueError, match="unknown compression"):
        encode_array(np.zeros(2, np.float32), "int8")
