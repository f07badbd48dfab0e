"""Model builders: built-in names or a user's `package.module:build_model`.

The contract, for built-ins and users' builders alike: `build_model(input_shape, output_dim,
**params)` returns a `torch.nn.Module` taking a batch of shape `(rows, *input_shape)`, float32
(or int64 token ids), and giving `(rows, output_dim)`. For token datasets smlt passes the
manifest's `vocab_size` in params unless the job sets it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence

import torch
from torch import nn

from smlt.errors import InvalidJob
from smlt.job import ModelSpec


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


BUILTINS = {"mlp": mlp, "logreg": logreg}


def build_model(
    spec: ModelSpec, input_shape: Sequence[int], output_dim: int, seed: int, *, vocab_size: int | None = None
) -> nn.Module:
    """Build the model with a deterministic initialisation (same seed → same weights everywhere)."""
    if spec.name in BUILTINS:
        fn = BUILTINS[spec.name]
    else:
        mod_name, _, attr = spec.name.partition(":")
        try:
            fn = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise InvalidJob(f"model.name: cannot import {spec.name!r} ({e})") from None
    params = dict(spec.params)
    if vocab_size is not None:
        params.setdefault("vocab_size", vocab_size)
    torch.manual_seed(seed)
    try:
        model = fn(tuple(input_shape), output_dim, **params)
    except TypeError as e:
        raise InvalidJob(f"model.params: {e}") from None
    if not isinstance(model, nn.Module):
        raise InvalidJob(f"model.name: {spec.name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
