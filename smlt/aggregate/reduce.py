"""The reduce: new = global + server_lr * sum(w_i * delta_i) / sum(w_i), on numpy arrays."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load, save


def weighted_average(updates: list[dict[str, np.ndarray]], weights: list[float]) -> dict[str, np.ndarray]:
    """Average tensors key by key, weighted; accumulates in float32 in place (one pass, no copies)."""
    total = float(sum(weights))
    if not updates or total <= 0:
        raise ValueError("nothing to average")
    out: dict[str, np.ndarray] = {}
    for name in updates[0]:
        acc = np.zeros_like(updates[0][name], dtype=np.float32)
        for u, w in zip(updates, weights):
            acc += u[name].astype(np.float32, copy=False) * np.float32(w / total)
        out[name] = acc
    return out


def apply_update(global_state: dict[str, np.ndarray], delta: dict[str, np.ndarray], server_lr: float) -> dict[str, np.ndarray]:
    new = dict(global_state)
    for name, d in delta.items():
        new[name] = (global_state[name].astype(np.float32) + np.float32(server_lr) * d).astype(global_state[name].dtype)
    return new


def is_finite(state: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(v).all() for v in state.values() if np.issubdtype(v.dtype, np.floating))


def decode(blob: bytes) -> dict[str, np.ndarray]:
    return load(blob)


def encode(state: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    return save(state, metadata=metadata)


def param_count(state: dict[str, np.ndarray]) -> int:
    return int(sum(v.size for v in state.values()))
