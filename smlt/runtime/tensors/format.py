"""The safetensors format, numpy side: the header (8-byte little-endian length + JSON with
`data_offsets`), zero-copy views of a blob's tensors, and writing tensors of any dtype.

`safetensors.numpy` cannot load or save bfloat16, so `views` and `save_raw` handle the format
directly; `encode` uses the library whenever no tensor is BF16.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np
from safetensors.numpy import save

from smlt.runtime.errors import SmltError
from smlt.runtime.tensors.dtypes import BF16, NP_TO_ST, ST_TO_NP, to_float32


class HeaderError(SmltError, ValueError):
    """Bytes that are not a safetensors file (or not all of its header); the message names the
    object when the caller gave it."""

    def __init__(self, problem: str, where: str = "") -> None:
        super().__init__(
            f"{where}: not a safetensors file ({problem}); it was damaged or not written by smlt" if where else problem
        )


def header_length(prefix: bytes | memoryview, where: str = "") -> int:
    """The JSON header's length from the first 8 bytes (little-endian u64). `where` (an object
    key) is named in the error."""
    if len(prefix) < 8:
        raise HeaderError("shorter than the 8-byte safetensors length prefix", where)
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > 100_000_000:
        raise HeaderError(f"implausible safetensors header length {n}", where)
    return int(n)


def parse_header(prefix: bytes | memoryview, where: str = "") -> tuple[dict, dict[str, str], int]:
    """(tensors, metadata, data_start) from the first 8 + header_length bytes of a file.

    `tensors` maps name -> {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative
    to `data_start`, the absolute offset of the data section.
    """
    n = header_length(prefix, where)
    if len(prefix) < 8 + n:
        raise HeaderError(f"need {8 + n} bytes for the header, got {len(prefix)}", where)
    try:
        header = json.loads(bytes(prefix[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HeaderError(f"safetensors header is not JSON: {e}", where) from None
    if not isinstance(header, dict):
        raise HeaderError("safetensors header is not a JSON object", where)
    meta = header.pop("__metadata__", None) or {}
    for name, t in header.items():
        if not isinstance(t, dict) or t.get("dtype") not in ST_TO_NP or "data_offsets" not in t:
            raise HeaderError(f"tensor {name!r}: unsupported or malformed entry {t!r}", where)
    return header, meta, 8 + n


def views(blob: bytes | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Zero-copy, read-only numpy views of every tensor in a safetensors blob, and its metadata.

    BF16 tensors come back with dtype `dtypes.BF16`; `to_float32` widens any of them.
    """
    mv = memoryview(blob)
    tensors, meta, start = parse_header(mv[: 8 + header_length(mv)])
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        dt = ST_TO_NP[t["dtype"]]
        b, e = t["data_offsets"]
        arr = np.frombuffer(blob, dtype=dt, count=(e - b) // dt.itemsize, offset=start + b)
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


def decode(blob: bytes) -> dict[str, np.ndarray]:
    """A safetensors blob as numpy arrays (copies; BF16 widened to float32; F16 kept as float16)."""
    arrays, _ = views(blob)
    return {k: (to_float32(v) if v.dtype == BF16 else v.copy()) for k, v in arrays.items()}


def encode(state: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """A state dict as safetensors bytes (tensors in name order, as safetensors writes them)."""
    if any(v.dtype == BF16 for v in state.values()):
        return save_raw(sorted(state.items()), metadata)
    return save(state, metadata=metadata)
