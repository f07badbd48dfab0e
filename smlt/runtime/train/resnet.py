"""`resnet18`, `resnet34`, `resnet50`: torchvision's definitions, untrained, for any channel count.

Images of 64 px and less get the small-input stem of the CIFAR ResNets (He et al. 2016, sec. 4.2):
a 3x3 stride-1 first convolution and no max-pool, so a 32x32 image is not 8x8 before the first
block. `small_input` overrides the choice.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from smlt.runtime.train.shapes import image_shape
from smlt.runtime.train.vision import models

SMALL_INPUT_PX = 64


def _resnet(
    name: str, input_shape: Sequence[int], output_dim: int, small_input: bool | None, zero_init_residual: bool
) -> nn.Module:
    c, h, w = image_shape(name, input_shape)
    net = getattr(models, name)(weights=None, num_classes=output_dim, zero_init_residual=zero_init_residual)
    small = max(h, w) <= SMALL_INPUT_PX if small_input is None else small_input
    if small or c != 3:
        k, stride, pad = (3, 1, 1) if small else (7, 2, 3)
        net.conv1 = nn.Conv2d(c, 64, k, stride=stride, padding=pad, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision inits it
    if small:
        net.maxpool = nn.Identity()
    return net


def resnet18(
    input_shape: Sequence[int], output_dim: int, small_input: bool | None = None, zero_init_residual: bool = False
) -> nn.Module:
    return _resnet("resnet18", input_shape, output_dim, small_input, zero_init_residual)


def resnet34(
    input_shape: Sequence[int], output_dim: int, small_input: bool | None = None, zero_init_residual: bool = False
) -> nn.Module:
    return _resnet("resnet34", input_shape, output_dim, small_input, zero_init_residual)


def resnet50(
    input_shape: Sequence[int], output_dim: int, small_input: bool | None = None, zero_init_residual: bool = False
) -> nn.Module:
    return _resnet("resnet50", input_shape, output_dim, small_input, zero_init_residual)
