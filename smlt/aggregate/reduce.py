"""The reduce: new = global + server_lr * sum(w_i * delta_i) / sum(w_i), on numpy arrays.

Speed: the weighted sum walks the arrays in cache-sized blocks, so the accumulator block stays in
cache while every update streams through once. That makes it about as fast as (usually faster
than) numpy adding the same arrays in place, which is the reference `bench/` compares it to.
Updates may be float32, float16 or bfloat16 (see `smlt.aggregate.compress`); they are widened
block by block, never as whole copies.

Safetensors handling lives here too: `parse_header` (the 8-byte length + JSON header),
`views` (zero-copy numpy views of a blob's tensors, BF16 included, which `safetensors.numpy`
cannot load) and `save_raw` (write tensors of any dtype, BF16 included, with an explicit order).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np
from safetensors.numpy import save

from smlt.aggregate.compress import BF16, to_float32

# Elements per block: 256 Ki float32 = 1 MiB of accumulator, which stays in L2 while the
# updates stream through.
BLOCK = 1 << 18

# safetensors dtype names <-> numpy dtypes (BF16 is a tagged uint16, see compress.BF16).
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
FLOATING = ("F64", "F32", "F16", "BF16")


class HeaderError(ValueError):
    """Bytes that are not a safetensors file (or not all of its header)."""


def header_length(prefix: bytes) -> int:
    """The JSON header's length from the first 8 bytes (little-endian u64)."""
    if len(prefix) < 8:
        raise HeaderError("shorter than the 8-byte safetensors length prefix")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > 100_000_000:
        raise HeaderError(f"implausible safetensors header length {n}")
    return n


def parse_header(prefix: bytes) -> tuple[dict, dict[str, str], int]:
    """(tensors, metadata, data_start) from the first 8 + header_length bytes of a file.

    `tensors` maps name -> {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative
    to `data_start`, the absolute offset of the data section.
    """
    n = header_length(prefix)
    if len(prefix) < 8 + n:
        raise HeaderError(f"need {8 + n} bytes for the header, got {len(prefix)}")
    try:
        header = json.loads(bytes(prefix[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HeaderError(f"safetensors header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise HeaderError("safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    for name, t in header.items():
        if not isinstance(t, dict) or t.get("dtype") not in ST_TO_NP or "data_offsets" not in t:
            raise HeaderError(f"tensor {name!r}: unsupported or malformed entry {t!r}")
    return header, meta, 8 + n


def views(blob: bytes | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Zero-copy, read-only numpy views of every tensor in a safetensors blob, and its metadata.

    BF16 tensors come back with dtype `compress.BF16`; `to_float32` widens any of them.
    """
    tensors, meta, start = parse_header(memoryview(blob)[: 8 + header_length(bytes(memoryview(blob)[:8]))])
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        dt = ST_TO_NP[t["dtype"]]
        b, e = t["data_offsets"]
        count = (e - b) // dt.itemsize
        arr = np.frombuffer(blob, dtype=dt, count=count, offset=start + b)
        out[name] = arr.reshape(t["shape"])
    return out, meta


def save_raw(tensors: Sequence[tuple[str, np.ndarray]], metadata: dict[str, str] | None = None) -> bytes:
    """Serialise tensors to safetensors in the given order (any dtype in ST_TO_NP, BF16 included).

    safetensors readers accept any order of data offsets as long as the data is contiguous; the
    header is padded with spaces to a multiple of 8 as the format recommends.
    """
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    arrays = []
    for name, arr in tensors:
        dt = NP_TO_ST.get(arr.dtype)
        if dt is None:
            raise TypeError(f"tensor {name!r}: dtype {arr.dtype} has no safetensors equivalent")
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array 1-d)
            arr = arr.copy(order="C")
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    out = bytearray(8 + len(raw) + offset)
    out[:8] = struct.pack("<Q", len(raw))
    out[8 : 8 + len(raw)] = raw
    pos = 8 + len(raw)
    for arr in arrays:
        out[pos : pos + arr.nbytes] = arr.reshape(-1).view(np.uint8).data
        pos += arr.nbytes
    return bytes(out)


def weighted_sum_into(
    acc: np.ndarray, arrays: Sequence[np.ndarray], coeffs: Sequence[float], block: int = BLOCK
) -> np.ndarray:
    """acc[:] += sum_i coeffs[i] * arrays[i], elementwise; acc is float32 and 1-D (or flat-viewable).

    Arrays may be float32, float16 or BF16 (they are widened a block at a time). Blocked so that
    the accumulator block stays in cache: each update is read once, the accumulator is read and
    written once in all, which is less memory traffic than n whole-array `acc += a` passes.
    """
    flat = acc.reshape(-1)
    n = flat.size
    srcs = [a.reshape(-1) for a in arrays]
    for a in srcs:
        if a.size != n:
            raise ValueError(f"size mismatch: accumulator {n}, update {a.size}")
    cs = [np.float32(c) for c in coeffs]
    tmp = np.empty(min(block, n), dtype=np.float32)
    wide = np.empty(min(block, n), dtype=np.uint32) if any(a.dtype == BF16 for a in srcs) else None
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        dst = flat[lo:hi]
        t = tmp[: hi - lo]
        for a, c in zip(srcs, cs):
            part = a[lo:hi]
            if part.dtype == BF16:
                w = wide[: hi - lo]
                np.left_shift(part.view(np.uint16), 16, out=w, dtype=np.uint32)
                part = w.view(np.float32)
            if c == 1.0:
                np.add(dst, part, out=dst)
            else:
                np.multiply(part, c, out=t)
                np.add(dst, t, out=dst)
    return acc


def weighted_mean_into(
    acc: np.ndarray, arrays: Sequence[np.ndarray], weights: Sequence[float], block: int = BLOCK
) -> np.ndarray:
    """acc[:] = sum(w_i * a_i) / sum(w_i). With equal weights: plain sums, one scale at the end."""
    total = float(sum(weights))
    if not arrays or total <= 0:
        raise ValueError("nothing to average")
    acc.fill(0.0)
    if all(w == weights[0] for w in weights):
        weighted_sum_into(acc, arrays, [1.0] * len(arrays), block)
        np.multiply(acc, np.float32(1.0 / len(arrays)), out=acc)
    else:
        weighted_sum_into(acc, arrays, [w / total for w in weights], block)
    return acc


def weighted_average(updates: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    """Average tensors key by key, weighted, into fresh float32 arrays (blocked, no per-update copies)."""
    total = float(sum(weights))
    if not updates or total <= 0:
        raise ValueError("nothing to average")
    out: dict[str, np.ndarray] = {}
    for name in updates[0]:
        acc = np.empty(updates[0][name].shape, dtype=np.float32)
        weighted_mean_into(acc, [u[name] for u in updates], weights)
        out[name] = acc
    return out


def apply_update(
    global_state: dict[str, np.ndarray], delta: dict[str, np.ndarray], server_lr: float
) -> dict[str, np.ndarray]:
    new = dict(global_state)
    lr = np.float32(server_lr)
    for name, d in delta.items():
        g = global_state[name]
        acc = g.astype(np.float32, copy=True)
        d32 = to_float32(d)
        if lr == 1.0:
            np.add(acc, d32, out=acc)
        else:
            acc += lr * d32
        new[name] = acc if g.dtype == np.float32 else acc.astype(g.dtype)
    return new


def all_finite(a: np.ndarray) -> bool:
    """True when no element is NaN or Inf (min/max propagate NaN; no temporary array)."""
    if a.size == 0 or not np.issubdtype(a.dtype, np.floating):
        return True
    return bool(np.isfinite(a.min()) and np.isfinite(a.max()))


def is_finite(state: dict[str, np.ndarray]) -> bool:
    return all(all_finite(v) for v in state.values())


def decode(blob: bytes) -> dict[str, np.ndarray]:
    """A safetensors blob as numpy arrays (copies; BF16 widened to float32; F16 kept as float16)."""
    arrays, _ = views(blob)
    return {k: (to_float32(v) if v.dtype == BF16 else v.copy()) for k, v in arrays.items()}


def encode(state: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    if any(v.dtype == BF16 for v in state.values()):
        return save_raw(sorted(state.items()), metadata)
    return save(state, metadata=metadata)


def param_count(state: dict[str, np.ndarray]) -> int:
    return int(sum(v.size for v in state.values()))
