"""What the planner and the memory check need from a real model, measured on one small batch
once per process and model: training FLOPs per sample (forward and backward, PyTorch's FLOP
counter) and the activation memory a sample keeps for the backward pass (the tensors autograd
saves, parameters left out: they are counted on their own).

Measuring leaves the model as it was (buffers such as batch-norm statistics, no gradients) and
the global RNG untouched, so the training that follows is the same with or without it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from smlt.runtime.data.inputs import model_input
from smlt.runtime.data.manifest import Manifest

MEASURE_ROWS = 2  # batch norm in training mode needs more than one value per channel


@dataclass(frozen=True)
class Footprint:
    flops_per_sample: float  # one training sample, forward + backward
    activation_bytes_per_sample: float  # saved for the backward pass

    def activation_mb(self, batch: int) -> float:
        return self.activation_bytes_per_sample * batch / 2**20


_MEASURED: dict[Hashable, Footprint] = {}


def footprint(
    key: Hashable, model: nn.Module, manifest: Manifest, loss_fn: Callable[[Tensor, Tensor], Tensor]
) -> Footprint:
    """The model's footprint, measured the first time this process sees `key` (what identifies
    the model and its input: its spec and the dataset's sample shape)."""
    if key not in _MEASURED:
        x = torch.from_numpy(model_input(manifest, np.zeros((MEASURE_ROWS, *manifest.x.shape), manifest.x.dtype)))
        y = torch.from_numpy(np.zeros((MEASURE_ROWS, *manifest.y.shape), manifest.y.dtype))
        _MEASURED[key] = measure(model, x, y, loss_fn)
    return _MEASURED[key]


def remember(key: Hashable, fp: Footprint) -> None:
    """`fp` as the footprint of `key`, measured by the caller on MEASURE_ROWS rows (the client's
    check measures it on real samples, with its own checks of the output)."""
    _MEASURED[key] = fp


def measure(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    inspect: Callable[[Tensor], None] | None = None,
    after: Callable[[], None] | None = None,
) -> Footprint:
    """One training step's forward and backward on (x, y), without the optimizer step;
    `inspect(output)` between the forward pass and the loss (it may raise), `after()` once the
    backward pass has left the gradients (before they are cleared)."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    was_training = model.training
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # storage -> bytes: views of one storage count once

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    model.train()
    counter = FlopCounterMode(display=False)
    try:
        with torch.random.fork_rng(devices=[]), counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(x)
                if inspect is not None:
                    inspect(out)
                loss = loss_fn(out, y)
            loss.backward()
        if after is not None:
            after()
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        model.train(was_training)
    rows = len(x)
    return Footprint(counter.get_total_flops() / rows, sum(saved.values()) / rows)
