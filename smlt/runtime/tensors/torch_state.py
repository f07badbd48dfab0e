"""Torch state dicts <-> safetensors bytes, for the worker. Never pickle: safetensors only.

The only module of smlt.runtime.tensors that imports torch: the aggregator (numpy only) never imports it.
"""

from __future__ import annotations

import torch
from safetensors.torch import load, save

from smlt.runtime.tensors.codec import FP16_MAX, check_codec


def state_to_bytes(state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The state as safetensors bytes. A tensor that shares memory with an earlier one (tied
    weights: one parameter under two names, a module used twice) is stored as a copy under each
    name, which safetensors' `save` would refuse: loading it back sets the one parameter twice to
    the same values, and every name's update is the same, so averaging keeps them equal."""
    out, seen = {}, set()
    for k, v in state.items():
        t = v.detach().contiguous().cpu()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[k] = t
    return save(out, metadata=metadata)


def bytes_to_state(blob: bytes) -> dict[str, torch.Tensor]:
    return load(blob)


def update_delta(new_state: dict[str, torch.Tensor], global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A worker's update: new - global for every floating tensor (weights and batch-norm running
    statistics, averaged like weights) and, as int64, for every integer buffer (batch norm's
    `num_batches_tracked`), which the aggregator adds as the rounded sample-weighted mean
    (`reduce.integer_mean`). Boolean tensors are not sent: model r+1 keeps model r's."""
    out = {}
    for k, v in new_state.items():
        g = global_state[k]
        if v.is_floating_point():
            out[k] = v - g
        elif v.dtype != torch.bool and not v.is_complex():
            out[k] = v.to(torch.int64) - g.to(torch.int64)  # int64: a uint8 buffer's delta may be negative
    return out


def compress_torch_state(delta: dict[str, torch.Tensor], codec: str) -> dict[str, torch.Tensor]:
    """The delta's floating tensors cast to float16 / bfloat16 (codec "none": the delta itself);
    integer tensors are sent as they are (a count is never rounded to a float).

    torch's casts round to nearest even, as `dtypes.bf16_bits` does, so the numpy and torch paths
    give the same bits. fp16 clips to +-65504 first (a cast would make Inf).
    """
    check_codec(codec)
    if codec == "none":
        return delta
    out = {}
    for k, v in delta.items():
        if not v.is_floating_point():
            out[k] = v
        elif codec == "fp16":
            out[k] = v.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
        else:
            out[k] = v.to(torch.bfloat16)
    return out
