"""What the worker measures of its model for the planner and the memory check (smlt.runtime.train.measure)."""

import pytest
import torch
from torch import nn

from smlt.runtime.data.manifest import Manifest
from smlt.runtime.errors import ModelTooLarge
from smlt.runtime.steps.train import _check_fits
from smlt.runtime.train import measure as m

CE = nn.CrossEntropyLoss(reduction="sum")


def mlp(hidden=32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def batch(rows):
    return torch.randn(rows, 16), torch.zeros(rows, dtype=torch.long)


def test_flops_per_sample_are_counted_forward_and_backward():
    fp = m.measure(mlp(), *batch(2), CE)
    # forward 2*(16*32 + 32*4); backward: both grads of layer 2, the weight's only of layer 1
    # (the input needs no gradient).
    assert fp.flops_per_sample == 2 * (16 * 32 + 32 * 4) + 4 * 32 * 4 + 2 * 16 * 32


def test_activations_are_the_saved_tensors_per_sample_without_the_parameters():
    fp = m.measure(mlp(), *batch(2), CE)
    # the input, the ReLU's output (saved once though both ReLU and Linear keep it), the loss's
    # log-probabilities and target: ~(16 + 32 + 4) floats; the 2,692 parameters are not in it.
    assert 4 * (16 + 32) <= fp.activation_bytes_per_sample <= 4 * (16 + 32 + 4) + 16
    # per sample whatever the batch (a few bytes a batch, such as the loss, aside)
    assert m.measure(mlp(), *batch(8), CE).activation_bytes_per_sample == pytest.approx(
        fp.activation_bytes_per_sample, abs=2
    )
    wide = m.measure(mlp(hidden=320), *batch(2), CE).activation_bytes_per_sample
    assert wide - fp.activation_bytes_per_sample == 4 * (320 - 32)
    assert fp.activation_mb(2**20) == fp.activation_bytes_per_sample


def cnn():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten(), nn.Linear(144, 3))


def test_measuring_leaves_the_model_and_the_random_state_as_they_were():
    model = cnn().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = torch.rand(3)  # what the training would draw next, unmeasured
    model = cnn().eval()
    fp = m.measure(model, torch.ones(2, 1, 8, 8), torch.zeros(2, dtype=torch.long), CE)
    assert fp.flops_per_sample > 0
    assert torch.equal(torch.rand(3), expected)  # dropout drew no random numbers the training would see
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # BN statistics too
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_measured_once_per_process_and_model(monkeypatch):
    calls = []
    real = m.measure
    monkeypatch.setattr(m, "measure", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(m, "_MEASURED", {})
    manifest = Manifest.model_validate(
        {
            "name": "d",
            "source": "s",
            "task": "classification",
            "x": {"shape": [1, 4, 4], "dtype": "uint8"},
            "y": {"shape": [], "dtype": "int64"},
            "outputs": 4,
            "train": {"rows": 0, "shards": []},
            "validation": {"rows": 0, "shards": []},
            "normalization": {"applied": "on_load", "axis": "channel", "mean": [100.0], "std": [50.0]},
        }
    )
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4))
    first = m.footprint("k", model, manifest, CE)
    assert m.footprint("k", model, manifest, CE) is first and len(calls) == 1
    m.footprint("other", model, manifest, CE)
    assert len(calls) == 2


def test_the_memory_check_counts_the_activations_of_the_batch():
    model = mlp()  # 2,692 parameters: nothing next to 1769 MB
    _check_fits(model, 1769, 0)
    _check_fits(model, 1769, 0, activation_mb=1000, batch=4096)
    with pytest.raises(ModelTooLarge, match=r"about 1,5\d\d MB \(1,100 MB of it activations for a batch of 4096\)"):
        _check_fits(model, 1500, 0, activation_mb=1100, batch=4096)
    with pytest.raises(ModelTooLarge, match=r"a smaller training.batch_size"):
        _check_fits(model, 1500, 0, activation_mb=1100, batch=4096)
