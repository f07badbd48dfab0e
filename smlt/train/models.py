"""Model builders: built-in names or a user's `package.module:build_model`."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch
from torch import nn

from smlt.errors import InvalidJob
from smlt.job import ModelSpec


def mlp(input_dim: int, output_dim: int, hidden: Sequence[int] | int = (128, 64), dropout: float = 0.0) -> nn.Module:
    sizes = [hidden] if isinstance(hidden, int) else list(hidden)
    layers: list[nn.Module] = []
    prev = input_dim
    for h in sizes:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        prev = h
    layers.append(nn.Linear(prev, output_dim))
    return nn.Sequential(*layers)


def logreg(input_dim: int, output_dim: int) -> nn.Module:
    return nn.Linear(input_dim, output_dim)


BUILTINS = {"mlp": mlp, "logreg": logreg}


def build_model(spec: ModelSpec, input_dim: int, output_dim: int, seed: int) -> nn.Module:
    """Build the model with a deterministic initialisation (same seed → same weights everywhere)."""
    if spec.name in BUILTINS:
        fn = BUILTINS[spec.name]
    else:
        mod_name, _, attr = spec.name.partition(":")
        try:
            fn = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise InvalidJob(f"model.name: cannot import {spec.name!r} ({e})") from None
    torch.manual_seed(seed)
    try:
        model = fn(input_dim, output_dim, **spec.params)
    except TypeError as e:
        raise InvalidJob(f"model.params: {e}") from None
    if not isinstance(model, nn.Module):
        raise InvalidJob(f"model.name: {spec.name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
