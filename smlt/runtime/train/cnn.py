"""`lenet`: LeNet-5's shape (two 5x5 convolutions with 2x2 max-pools, then three linear layers),
adapted to the input: 1x8x8 digits, 1x28x28 and 3x32x32 images alike."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from smlt.runtime.errors import InvalidJob
from smlt.runtime.train.shapes import image_shape


def _after(n: int, pad1: int, pad2: int) -> int:
    """One spatial side after conv5(pad1), pool2, conv5(pad2), pool2."""
    return ((n - 4 + 2 * pad1) // 2 - 4 + 2 * pad2) // 2


def lenet(
    input_shape: Sequence[int],
    output_dim: int,
    channels: Sequence[int] = (6, 16),
    hidden: Sequence[int] = (120, 84),
    dropout: float = 0.0,
) -> nn.Module:
    c, h, w = image_shape("lenet", input_shape)
    if min(h, w) < 4:
        raise InvalidJob(f"model.name: lenet needs images of at least 4x4 pixels, got {h}x{w}")
    if len(channels) != 2:
        raise InvalidJob(f"model.params.channels: lenet has two convolutions, got {list(channels)}")
    # LeNet-5 saw 32x32 inputs. Smaller images get 'same' padding (28x28 MNIST on the first
    # convolution, as LeNet-5's own padding to 32 did), so two pools still leave a feature map.
    pad1 = 0 if min(h, w) >= 32 else 2
    pad2 = 0 if (min(h, w) - 4 + 2 * pad1) // 2 >= 10 else 2
    c1, c2 = (int(n) for n in channels)
    layers: list[nn.Module] = [
        nn.Conv2d(c, c1, 5, padding=pad1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=pad2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    ]
    prev = c2 * _after(h, pad1, pad2) * _after(w, pad1, pad2)
    for n in hidden:
        layers += [nn.Linear(prev, int(n)), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        prev = int(n)
    layers.append(nn.Linear(prev, output_dim))
    return nn.Sequential(*layers)
