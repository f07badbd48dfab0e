"""What a worker sends for integer buffers and how the reduce adds them (numpy and torch sides)."""

import numpy as np
import torch
from torch import nn

from smlt.runtime.aggregate.reduce import add_integer, apply_update, integer_mean, weighted_average
from smlt.runtime.tensors.format import decode
from smlt.runtime.tensors.layout import layout_of_state
from smlt.runtime.tensors.torch_state import compress_torch_state, state_to_bytes, update_delta


def test_update_delta_carries_integer_buffers_as_int64():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    net.train()
    for _ in range(3):
        net(torch.randn(8, 3))
    delta = update_delta(net.state_dict(), before)
    assert delta["1.num_batches_tracked"].dtype == torch.int64 and int(delta["1.num_batches_tracked"]) == 3
    assert not torch.equal(delta["1.running_mean"], torch.zeros(4))
    assert set(delta) == set(before)


def test_update_delta_signed_for_small_integers_and_without_bools():
    g = {"u": torch.tensor([5, 200], dtype=torch.uint8), "mask": torch.tensor([True, False]), "w": torch.ones(2)}
    new = {"u": torch.tensor([3, 250], dtype=torch.uint8), "mask": torch.tensor([False, False]), "w": torch.zeros(2)}
    delta = update_delta(new, g)
    assert delta["u"].tolist() == [-2, 50] and delta["u"].dtype == torch.int64
    assert "mask" not in delta


def test_compression_never_casts_integers():
    delta = {"w": torch.randn(3), "n": torch.tensor(7)}
    for codec in ("fp16", "bf16"):
        out = compress_torch_state(delta, codec)
        assert out["n"].dtype == torch.int64 and int(out["n"]) == 7
        lay = layout_of_state(decode(state_to_bytes(out)))
        assert lay.others == ("n",)


def test_integer_mean_is_the_weighted_mean_rounded():
    assert int(integer_mean([np.array(4), np.array(7)], [1, 1])) == 6  # 5.5 -> 6 (half to even)
    assert int(integer_mean([np.array(4), np.array(7)], [3, 1])) == 5  # 4.75
    assert integer_mean([np.array([0, 10]), np.array([1, 30])], [1.0, 1.0]).tolist() == [0, 20]  # 0.5 -> 0
    assert integer_mean([np.array(3)], [2]).dtype == np.int64


def test_apply_update_adds_integers_without_server_lr_in_their_dtype():
    g = {"w": np.ones(2, np.float32), "n": np.array(10, np.int64), "u": np.array([250, 3], np.uint8)}
    avg = weighted_average([{"w": np.ones(2, np.float32), "n": np.array(4), "u": np.array([10, -5])}] * 2, [1.0, 1.0])
    new = apply_update(g, avg, server_lr=0.5)
    assert new["w"].tolist() == [1.5, 1.5]
    assert int(new["n"]) == 14 and new["n"].dtype == np.int64
    assert new["u"].tolist() == [255, 0] and new["u"].dtype == np.uint8  # clipped to uint8's range
    assert add_integer(np.array(1, np.int32), np.array(2)).dtype == np.int32
