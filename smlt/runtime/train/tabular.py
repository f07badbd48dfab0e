"""Models of flat features: `mlp` and `logreg` (any sample shape is flattened first)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn


def mlp(
    input_shape: Sequence[int], output_dim: int, hidden: Sequence[int] | int = (128, 64), dropout: float = 0.0
) -> nn.Module:
    sizes = [hidden] if isinstance(hidden, int) else list(hidden)
    layers: list[nn.Module] = [nn.Flatten()] if len(input_shape) > 1 else []
    prev = math.prod(input_shape)
    for h in sizes:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        prev = h
    layers.append(nn.Linear(prev, output_dim))
    return nn.Sequential(*layers)


def logreg(input_shape: Sequence[int], output_dim: int) -> nn.Module:
    linear = nn.Linear(math.prod(input_shape), output_dim)
    return nn.Sequential(nn.Flatten(), linear) if len(input_shape) > 1 else linear
