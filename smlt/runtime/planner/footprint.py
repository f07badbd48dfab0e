"""A built-in model's size and training FLOPs per sample, from the job's model spec and the
dataset's sample shape, before anything is built (no torch: the planner Lambda has none).

Round 0's workers measure both (parameters with the update, FLOPs with PyTorch's counter,
`smlt.runtime.train.measure`), but the first plan comes before round 0: without them it saw a 11M-parameter
ResNet-18 as a 100k-parameter dense model (6 FLOPs per parameter), ~300x too cheap, and admitted
jobs no plan can finish. The counts here follow the counter the workers use, so for a built-in
the first plan knows what round 0 would measure: 2 FLOPs per multiply-add of every matrix product
and convolution forward, as many again for the weights' gradients and for the inputs' gradients
(none for the first layer, whose input needs none); normalisation, activations, pooling and
embedding lookups count nothing. `tests/unit/planner/test_footprint.py` checks every built-in
against the counter. A user's model (an entry point) or parameters this module does not know:
None, and the planner keeps its wide prior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smlt.runtime.job import ModelSpec


@dataclass(frozen=True)
class ModelCost:
    params: int
    flops_per_sample: float  # one training sample, forward and backward


class _Tally:
    """Parameters and training FLOPs of one sample, layer by layer."""

    def __init__(self) -> None:
        self.params = 0
        self.flops = 0.0
        self.first = True  # the next weighted layer is the first: its input needs no gradient

    def weighted(self, weights: int, macs: int, extra_params: int = 0) -> None:
        """A matrix product or convolution of `weights` weights and `macs` multiply-adds."""
        self.params += weights + extra_params
        self.flops += 2.0 * macs * (2 if self.first else 3)
        self.first = False

    def linear(self, n_in: int, n_out: int, rows: int = 1, bias: bool = True) -> None:
        self.weighted(n_in * n_out, rows * n_in * n_out, n_out if bias else 0)

    def conv(
        self, c_in: int, c_out: int, k: int, side: tuple[int, int], stride: int = 1, pad: int = 0
    ) -> tuple[int, int]:
        """A bias-free k x k convolution (then its batch norm, counted apart); the output side."""
        h, w = ((s + 2 * pad - k) // stride + 1 for s in side)
        self.weighted(c_in * c_out * k * k, c_out * h * w * c_in * k * k)
        return h, w


def _mlp(t: _Tally, shape: Sequence[int], outputs: int, hidden: Sequence[int] | int = (128, 64), dropout: float = 0.0):
    prev = math.prod(shape)
    for h in [hidden] if isinstance(hidden, int) else list(hidden):
        t.linear(prev, int(h))
        prev = int(h)
    t.linear(prev, outputs)


def _logreg(t: _Tally, shape: Sequence[int], outputs: int):
    t.linear(math.prod(shape), outputs)


def _lenet(
    t: _Tally,
    shape: Sequence[int],
    outputs: int,
    channels: Sequence[int] = (6, 16),
    hidden: Sequence[int] = (120, 84),
    dropout: float = 0.0,
):
    c, h, w = (int(d) for d in shape)
    if min(h, w) < 4:
        raise ValueError("lenet needs images of at least 4x4 pixels")
    # smlt.runtime.train.cnn.lenet's padding: 'same' on small images so two pools leave a feature map
    pad1 = 0 if min(h, w) >= 32 else 2
    pad2 = 0 if (min(h, w) - 4 + 2 * pad1) // 2 >= 10 else 2
    c1, c2 = (int(n) for n in channels)
    side = t.conv(c, c1, 5, (h, w), pad=pad1)
    t.params += c1  # the convolutions' biases
    side = t.conv(c1, c2, 5, (side[0] // 2, side[1] // 2), pad=pad2)
    t.params += c2
    prev = c2 * (side[0] // 2) * (side[1] // 2)
    for n in hidden:
        t.linear(prev, int(n))
        prev = int(n)
    t.linear(prev, outputs)


# torchvision's ResNets: (block, blocks per stage); a bottleneck block widens its output 4x.
_RESNETS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
}
SMALL_INPUT_PX = 64  # smlt.runtime.train.resnet's: images this small get the CIFAR stem (its module imports torch)


def _resnet(name: str):
    block, layers = _RESNETS[name]

    def count(
        t: _Tally, shape: Sequence[int], outputs: int, small_input: bool | None = None, zero_init_residual: bool = False
    ):
        c, h, w = (int(d) for d in shape)
        small = max(h, w) <= SMALL_INPUT_PX if small_input is None else small_input
        side = t.conv(c, 64, 3, (h, w), 1, 1) if small else t.conv(c, 64, 7, (h, w), 2, 3)
        t.params += 2 * 64
        if not small:
            side = ((side[0] - 1) // 2 + 1, (side[1] - 1) // 2 + 1)  # the 3x3 stride-2 max-pool (pad 1)
        inplanes = 64
        for stage, blocks in enumerate(layers):
            planes = 64 * 2**stage
            for b in range(blocks):
                stride = 2 if stage > 0 and b == 0 else 1
                inplanes, side = _block(t, block, inplanes, planes, stride, side)
        t.linear(inplanes, outputs)

    return count


def _block(t: _Tally, block: str, inplanes: int, planes: int, stride: int, side: tuple[int, int]):
    """One residual block (its batch norms' weights and biases included); (out channels, side)."""
    expansion = 4 if block == "bottleneck" else 1
    out = planes * expansion
    if block == "basic":
        mid = t.conv(inplanes, planes, 3, side, stride, 1)
        end = t.conv(planes, planes, 3, mid, 1, 1)
        t.params += 2 * (planes + planes)
    else:
        a = t.conv(inplanes, planes, 1, side)
        mid = t.conv(planes, planes, 3, a, stride, 1)
        end = t.conv(planes, out, 1, mid)
        t.params += 2 * (planes + planes + out)
    if stride != 1 or inplanes != out:
        t.conv(inplanes, out, 1, side, stride)
        t.params += 2 * out
    return out, end


def _transformer(
    t: _Tally,
    shape: Sequence[int],
    outputs: int,
    vocab_size: int | None = None,
    d_model: int = 64,
    heads: int = 4,
    layers: int = 2,
    ff: int = 128,
    dropout: float = 0.1,
):
    if vocab_size is None or len(shape) != 1:
        raise ValueError("transformer takes token sequences and a vocab_size")
    n, d = int(shape[0]), int(d_model)
    t.params += int(vocab_size) * d + n * d  # embedding and learned positions (no FLOPs)
    t.first = False  # the first layer's input (embedding + positions) needs its gradient
    for _ in range(layers):
        t.linear(d, 3 * d, n)  # the attention's input projection
        t.weighted(0, 2 * n * n * d)  # scores and their weighted sum, over all heads
        t.linear(d, d, n)
        t.linear(d, ff, n)
        t.linear(ff, d, n)
        t.params += 2 * 2 * d  # two layer norms
    t.params += 2 * d  # the final norm
    t.linear(d, outputs)


_COUNTS: dict[str, Any] = {
    "mlp": _mlp,
    "logreg": _logreg,
    "lenet": _lenet,
    **{name: _resnet(name) for name in _RESNETS},
    "transformer": _transformer,
}


def model_cost(
    spec: ModelSpec, input_shape: Sequence[int], outputs: int, vocab_size: int | None = None
) -> ModelCost | None:
    """The built-in model's parameters and training FLOPs per sample for samples of `input_shape`
    (`outputs` classes or targets); None for a user's model, parameters the builder would refuse or
    a shape it does not take (the worker names those errors in round 0)."""
    count = _COUNTS.get(spec.name)
    if count is None:
        return None
    params = dict(spec.params)
    if spec.name == "transformer" and vocab_size is not None:
        params.setdefault("vocab_size", vocab_size)
    t = _Tally()
    try:
        count(t, tuple(int(d) for d in input_shape), int(outputs), **params)
    except (TypeError, ValueError):
        return None
    return ModelCost(t.params, t.flops)
