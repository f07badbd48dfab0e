"""Sample arrays by what they hold, stored as the manifest says: tabular features `[F]` float32
standardised per feature; images `[C, H, W]` (uint8 kept raw and normalised on load, anything else
standardised per channel); token ids `[T]` int64 as they are. Statistics come from the train split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smlt.runtime.data.manifest import ArraySpec, Normalization
from smlt.runtime.errors import InvalidDataset

# Rows per step when computing statistics or standardising: bounded float temporaries for
# image sets of many GB.
CHUNK_ROWS = 4096


@dataclass
class StoredX:
    train: np.ndarray
    validation: np.ndarray
    spec: ArraySpec
    normalization: Normalization
    vocab_size: int | None = None


def sample_layout(x: np.ndarray, where: str) -> np.ndarray:
    """x with its sample axes in the stored layout: `(N,)` -> `(N, 1)` features, `(N, H, W)` ->
    `(N, 1, H, W)` images; `(N, F)`, `(N, T)` and `(N, C, H, W)` kept."""
    if x.ndim == 1:
        return x.reshape(len(x), 1)
    if x.ndim == 3:
        return x.reshape(len(x), 1, *x.shape[1:])
    if x.ndim in (2, 4):
        return x
    raise InvalidDataset(
        f"{where}: x has shape {x.shape}: expected (rows, features), (rows, tokens), (rows, H, W) or (rows, C, H, W)"
    )


def store(train: np.ndarray, validation: np.ndarray, where: str, vocab_size: int | None = None) -> StoredX:
    """The train and validation x (already in `sample_layout`) as the shards store them."""
    if train.ndim == 4:
        return _images(train, validation, where)
    if train.ndim == 2 and np.issubdtype(train.dtype, np.integer):
        return _tokens(train, validation, where, vocab_size)
    return _features(train, validation, where)


def _features(train: np.ndarray, validation: np.ndarray, where: str) -> StoredX:
    train, validation = _finite_float(train, where), _finite_float(validation, where)
    mean, std = train.mean(axis=0, dtype=np.float64), train.std(axis=0, dtype=np.float64)
    norm = _normalization("stored", "feature", mean, std)
    return StoredX(
        standardise(train, norm),
        standardise(validation, norm),
        ArraySpec(shape=[int(train.shape[1])], dtype="float32"),
        norm,
    )


def _images(train: np.ndarray, validation: np.ndarray, where: str) -> StoredX:
    shape = [int(d) for d in train.shape[1:]]
    if train.dtype == np.uint8:
        mean, std = channel_stats(train)
        norm = _normalization("on_load", "channel", mean, std)
        spec = ArraySpec(shape=shape, dtype="uint8")
        return StoredX(train, validation, spec, norm)
    train, validation = _finite_float(train, where), _finite_float(validation, where)
    mean, std = channel_stats(train)
    norm = _normalization("stored", "channel", mean, std)
    spec = ArraySpec(shape=shape, dtype="float32")
    return StoredX(standardise(train, norm), standardise(validation, norm), spec, norm)


def _tokens(train: np.ndarray, validation: np.ndarray, where: str, vocab_size: int | None) -> StoredX:
    low = min(int(train.min()), int(validation.min()))
    high = max(int(train.max()), int(validation.max()))
    if low < 0:
        raise InvalidDataset(
            f"{where}: integer x of shape (rows, tokens) holds token ids, which cannot be negative (found {low}); "
            "save tabular features as floats"
        )
    if vocab_size is not None and high >= vocab_size:
        raise InvalidDataset(f"{where}: token id {high} is not below the vocabulary size {vocab_size}")
    return StoredX(
        train.astype(np.int64, copy=False),
        validation.astype(np.int64, copy=False),
        ArraySpec(shape=[int(train.shape[1])], dtype="int64"),
        Normalization(applied="none"),
        vocab_size if vocab_size is not None else high + 1,
    )


def _finite_float(x: np.ndarray, where: str) -> np.ndarray:
    x = x.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise InvalidDataset(f"{where}: features contain NaN or Inf")
    return x


def _normalization(applied, axis, mean: np.ndarray, std: np.ndarray) -> Normalization:
    std = np.where(std < 1e-8, 1.0, std)  # a constant feature or channel stays as it is, centred
    return Normalization(applied=applied, axis=axis, mean=mean.tolist(), std=std.tolist())


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of (N, C, H, W) images in their own units, in chunks of rows."""
    total = np.zeros(x.shape[1])
    squares = np.zeros(x.shape[1])
    for start in range(0, len(x), CHUNK_ROWS):
        part = x[start : start + CHUNK_ROWS].astype(np.float64)
        total += part.sum(axis=(0, 2, 3))
        squares += (part**2).sum(axis=(0, 2, 3))
    count = len(x) * x.shape[2] * x.shape[3]
    mean = total / count
    return mean, np.sqrt(np.maximum(squares / count - mean**2, 0.0))


def standardise(x: np.ndarray, norm: Normalization) -> np.ndarray:
    """(x - mean) / std as float32, along the normalisation's axis, in chunks of rows."""
    mean = np.asarray(norm.mean, np.float32)
    std = np.asarray(norm.std, np.float32)
    if norm.axis == "channel":
        shape = (1, len(mean)) + (1,) * (x.ndim - 2)
        mean, std = mean.reshape(shape), std.reshape(shape)
    out = np.empty(x.shape, np.float32)
    for start in range(0, len(x), CHUNK_ROWS):
        out[start : start + CHUNK_ROWS] = (x[start : start + CHUNK_ROWS] - mean) / std
    return out
