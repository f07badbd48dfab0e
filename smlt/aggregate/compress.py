"""Update compression: fp16 / bf16 deltas (half the bytes of float32), numpy only.

The aggregator has no torch, so bfloat16 is handled as its bit pattern: the top 16 bits of a
float32. Encoding rounds to nearest, ties to even (what torch's `.to(torch.bfloat16)` does);
decoding shifts the bits back. A bf16 array is a uint16 array tagged with the dtype `BF16` (a
one-field structured dtype), so nothing mistakes it for integers.

fp16 keeps 10 mantissa bits but only a range of +-65504 (values beyond are clipped, not made
Inf) and flushes magnitudes below ~6e-8 to zero; bf16 keeps float32's range with 7 mantissa bits.
The accuracy cost of each, measured on digits with local SGD, is in bench/README.md.

Workers (torch) write compressed updates with `compress_torch_state`; safetensors records the
dtype (F16 / BF16) in the header, so the reader needs no flag.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Codec = Literal["none", "fp16", "bf16"]
CODECS: tuple[str, ...] = ("none", "fp16", "bf16")

# A bfloat16 array: raw uint16 bits under a tag, so arithmetic on it by mistake fails loudly.
BF16 = np.dtype([("bf16", "<u2")])
FP16_MAX = float(np.finfo(np.float16).max)

ST_DTYPE = {"none": "F32", "fp16": "F16", "bf16": "BF16"}
ITEMSIZE = {"none": 4, "fp16": 2, "bf16": 2}


def _check(codec: str) -> None:
    if codec not in CODECS:
        raise ValueError(f"unknown compression {codec!r}: use one of {', '.join(CODECS)}")


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # rounding could carry a NaN's payload into Inf; force a quiet NaN
        out[nan] = (u[nan] >> np.uint32(16)).astype(np.uint16) | np.uint16(0x0040)
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16 or BF16) -> float32."""
    u16 = bits.view(np.uint16) if bits.dtype == BF16 else bits
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float array -> BF16-tagged array of the same shape."""
    return bf16_bits(x).view(BF16).reshape(np.shape(x))


def to_float32(a: np.ndarray) -> np.ndarray:
    """Any float array (F64, F32, F16, BF16) as float32; float32 input is returned as is."""
    if a.dtype == BF16:
        return bf16_to_float32(a).reshape(a.shape)
    if a.dtype == np.float32:
        return a
    return a.astype(np.float32)


def encode_array(x: np.ndarray, codec: str) -> np.ndarray:
    _check(codec)
    if codec == "none":
        return np.asarray(x, dtype=np.float32)
    if codec == "fp16":
        return np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16)
    return to_bf16(x)


def compress_state(state: dict[str, np.ndarray], codec: str) -> dict[str, np.ndarray]:
    """Floating tensors encoded with the codec; other tensors as they are."""
    _check(codec)
    return {k: (encode_array(v, codec) if np.issubdtype(v.dtype, np.floating) else v) for k, v in state.items()}


def decompress_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        k: (to_float32(v) if v.dtype == BF16 or np.issubdtype(v.dtype, np.floating) else v) for k, v in state.items()
    }


def compress_torch_state(delta: dict, codec: str) -> dict:
    """For the worker (torch): the delta's floating tensors cast to float16 / bfloat16.

    torch's casts round to nearest even, as `bf16_bits` does, so the numpy and torch paths give
    the same bits. fp16 clips to +-65504 first (a cast would make Inf).
    """
    _check(codec)
    if codec == "none":
        return delta
    import torch  # the worker has torch; the aggregator never calls this

    out = {}
    for k, v in delta.items():
        if not v.is_floating_point():
            out[k] = v
        elif codec == "fp16":
            out[k] = v.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
        else:
            out[k] = v.to(torch.bfloat16)
    return out


def compression_error(x: np.ndarray, codec: str) -> float:
    """Relative L2 error of one encode/decode round trip (for tests and the bench)."""
    x = np.asarray(x, dtype=np.float32)
    y = to_float32(encode_array(x, codec))
    denom = float(np.linalg.norm(x)) or 1.0
    return float(np.linalg.norm(x - y)) / denom
