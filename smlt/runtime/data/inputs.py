"""Stored samples → the model's input: the one place the manifest's `normalization` is applied."""

from __future__ import annotations

import numpy as np

from smlt.runtime.data.manifest import Manifest


def model_input(manifest: Manifest, x: np.ndarray) -> np.ndarray:
    """Rows of stored x (any leading row count) as the model takes them: float32 for features and
    images, int64 token ids unchanged."""
    norm = manifest.normalization
    if norm.applied == "none":
        return x
    if norm.applied == "stored":
        return x if x.dtype == np.float32 else x.astype(np.float32)
    mean = np.asarray(norm.mean, np.float32)
    std = np.asarray(norm.std, np.float32)
    if norm.axis == "channel":  # images are (rows, C, H, W): one statistic per channel
        shape = (1, len(mean)) + (1,) * (x.ndim - 2)
        mean, std = mean.reshape(shape), std.reshape(shape)
    return (x.astype(np.float32) - mean) / std
