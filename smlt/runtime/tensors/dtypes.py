"""Tensor dtypes: safetensors names <-> numpy dtypes, and bfloat16 without torch.

numpy has no bfloat16, so it is handled as its bit pattern: the top 16 bits of a float32.
Encoding rounds to nearest, ties to even (what torch's `.to(torch.bfloat16)` does); decoding
shifts the bits back. A bf16 array is a uint16 array tagged with the dtype `BF16` (a one-field
structured dtype), so nothing mistakes it for integers and arithmetic on it by mistake fails.
"""

from __future__ import annotations

import numpy as np

BF16 = np.dtype([("bf16", "<u2")])

ST_TO_NP: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": BF16,
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
NP_TO_ST: dict[np.dtype, str] = {v: k for k, v in ST_TO_NP.items()}
# The dtypes that make up a flat parameter vector (and that the reduce averages).
FLOATING = ("F64", "F32", "F16", "BF16")
# Integer tensors (batch norm's num_batches_tracked): updates carry int64 deltas the reduce adds
# as their rounded weighted mean. BOOL is neither: it stays as the model has it.
INTEGER = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8")


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
