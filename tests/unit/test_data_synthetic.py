"""The synthetic image and token sets are learnable (a few epochs of a tiny torch model end far
above chance) and not trivially so (an image's mean colour says nothing of its class)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from smlt.runtime.data.synthetic import generate
from smlt.runtime.errors import InvalidDataset


def fit(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int) -> float:
    """Validation accuracy on the last fifth after `epochs` of Adam on the rest."""
    torch.manual_seed(0)
    cut = len(x) * 4 // 5
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    for _ in range(epochs):
        for idx in torch.randperm(cut).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return float((net(x[cut:]).argmax(1) == y[cut:]).float().mean())


def test_synthetic_images_are_learnable_but_not_from_the_mean_colour():
    g = generate("synthetic:images?rows=2500&size=16&channels=3&classes=10&seed=0")
    assert g.x.shape == (2500, 3, 16, 16) and g.x.dtype == np.uint8 and set(np.unique(g.y)) == set(range(10))
    colour = g.x.reshape(len(g.x), 3, -1).mean(-1)
    by_colour = LogisticRegression(max_iter=2000).fit(colour[:2000], g.y[:2000]).score(colour[2000:], g.y[2000:])
    assert by_colour < 0.25  # chance is 0.1
    x = torch.tensor(g.x, dtype=torch.float32)
    x = (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    assert fit(net, x, torch.tensor(g.y), epochs=4) > 0.55


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab: int, length: int, classes: int, width: int = 32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.randn(length, width) * 0.1)
        layer = torch.nn.TransformerEncoderLayer(width, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x) + self.position).mean(1))


def test_synthetic_tokens_are_learnable_and_their_class_is_the_key_tokens_and_their_order():
    g = generate("synthetic:tokens?rows=1500&length=16&vocab=50&classes=4&seed=0")
    assert g.x.shape == (1500, 16) and g.x.dtype == np.int64 and g.vocab_size == 50
    assert g.x.min() >= 1 and g.x.max() < 50
    # Classes 0 and 1 hold keys 1 and 2, in opposite orders; classes 2 and 3 keys 1 and 3.
    row = g.x[np.flatnonzero(g.y == 1)[0]]
    assert list(row[np.isin(row, [1, 2, 3])]) == [2, 1]
    torch.manual_seed(0)
    acc = fit(TinyTransformer(50, 16, 4), torch.tensor(g.x), torch.tensor(g.y), epochs=3)
    assert acc > 0.4  # chance is 0.25


def test_synthetic_sets_are_reproducible_from_their_seed():
    a, b = (generate("synthetic:images?rows=20&size=8&seed=3") for _ in range(2))
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, generate("synthetic:images?rows=20&size=8&seed=4").x)


@pytest.mark.parametrize(
    "source, msg",
    [
        ("synthetic:images?rows=10&colour=3", "unknown parameter 'colour'"),
        ("synthetic:images?rows=ten", "rows must be a whole number"),
        ("synthetic:images?channels=2", "channels must be 1 or 3"),
        ("synthetic:tokens?vocab=3&classes=4", "vocab >= 5"),
        ("synthetic:sounds", "kind 'sounds' not supported"),
    ],
)
def test_bad_synthetic_specs_are_named(source, msg):
    with pytest.raises(InvalidDataset, match=msg):
        generate(source)
