"""Update compression: fp16 / bf16 deltas (half the bytes of float32), numpy side.

fp16 keeps 10 mantissa bits but only a range of +-65504 (values beyond are clipped, not made
Inf) and flushes magnitudes below ~6e-8 to zero; bf16 keeps float32's range with 7 mantissa bits.
The accuracy cost of each, measured on digits with local SGD, is in bench/README.md.

Workers (torch) compress with `torch_state.compress_torch_state`; safetensors records the dtype
(F16 / BF16) in the header, so a reader needs no flag. The per-step exchange encodes its
gradient slices here (`encode_array`).
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from smlt.runtime.tensors.dtypes import to_bf16

Codec = Literal["none", "fp16", "bf16"]
CODECS: tuple[str, ...] = get_args(Codec)

FP16_MAX = float(np.finfo(np.float16).max)
# The safetensors dtype a codec writes floating tensors as.
ST_DTYPE = {"none": "F32", "fp16": "F16", "bf16": "BF16"}


def check_codec(codec: str) -> None:
    if codec not in CODECS:
        raise ValueError(f"unknown compression {codec!r}: use one of {', '.join(CODECS)}")


def encode_array(x: np.ndarray, codec: str) -> np.ndarray:
    """A float array in the codec's dtype (float32, float16 clipped to +-65504, or BF16)."""
    check_codec(codec)
    if codec == "none":
        return np.asarray(x, dtype=np.float32)
    if codec == "fp16":
        return np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16)
    return to_bf16(x)
