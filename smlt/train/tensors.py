"""Model state <-> safetensors bytes. Never pickle: safetensors only."""

from __future__ import annotations

import torch
from safetensors.torch import load, save


def state_to_bytes(state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    return save({k: v.detach().contiguous().cpu() for k, v in state.items()}, metadata=metadata)


def bytes_to_state(blob: bytes) -> dict[str, torch.Tensor]:
    return load(blob)
