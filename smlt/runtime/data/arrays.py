"""Sample arrays by what they hold, stored as the manifest says: tabular features `[F]` float32
standardised per feature; images `[C, H, W]` (uint8 kept raw and normalised on load, anything else
standardised per channel); token ids `[T]` int64 as they are. Statistics come from the train split."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from smlt.runtime.data.manifest import ArraySpec, Normalization
from smlt.runtime.data.stats import Moments
from smlt.runtime.errors import InvalidDataset

# Bytes of float temporaries per step when computing statistics or standardising, whatever a
# row's size: 4,096 rows of 128x128 RGB images as float64 were 1.6 GB each (bench/README.md,
# "Preparation memory").
CHUNK_BYTES = 32 << 20
# The largest magnitude a stored float32 feature holds; a bigger number becomes Inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
FIX_ROWS = (
    "fix or drop those rows in the source (or rescale the column: a feature must stay within ±3.4e38) "
    "and prepare it again"
)


@dataclass
class StoredX:
    train: np.ndarray
    validation: np.ndarray
    spec: ArraySpec
    normalization: Normalization
    vocab_size: int | None = None


# Channel counts an image array has (gray, RGB, RGBA): how a channels-last array is told apart.
IMAGE_CHANNELS = (1, 3, 4)


def sample_layout(x: np.ndarray, where: str) -> np.ndarray:
    """x with its sample axes in the stored layout: `(N,)` -> `(N, 1)` features, `(N, H, W)` ->
    `(N, 1, H, W)` images, `(N, H, W, C)` (channels last, as numpy, TensorFlow and Pillow arrays
    have them: C of 1, 3 or 4 last and not second) -> `(N, C, H, W)`, said as a notice; `(N, F)`,
    `(N, T)` and `(N, C, H, W)` kept."""
    if x.ndim == 1:
        return x.reshape(len(x), 1)
    if x.ndim == 3:
        return x.reshape(len(x), 1, *x.shape[1:])
    if x.ndim == 4 and x.shape[3] in IMAGE_CHANNELS and x.shape[1] not in IMAGE_CHANNELS:
        from smlt.runtime.progress import notice

        n, h, w, c = x.shape
        notice.info(f"{where}: x of shape {x.shape} is read as (rows, H, W, C), channels last: samples {c}x{h}x{w}")
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
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
    moments = Moments(train.shape[1])
    moments.add(train)
    norm = normalization(moments.mean, moments.std)
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
    refuse_non_finite(x, where)
    return x


@dataclass
class NonFinite:
    """What of a split's rows is not a finite number, added block by block: how many rows of how
    many, and for each column (of (rows, features) x) its rows and the first one's number."""

    rows: int = 0
    bad: int = 0
    flat: bool = True  # (rows, features): by column
    columns: dict[str, tuple[int, int, int | None]] = field(default_factory=dict)  # name -> (feature, rows, first)

    def add(self, x: np.ndarray, names: Sequence[str] | None = None, rows: np.ndarray | None = None) -> NonFinite:
        self.rows += len(x)
        self.flat = x.ndim == 2
        if not np.issubdtype(x.dtype, np.floating) or x.size == 0:
            return self
        flat = x.reshape(len(x), -1)
        if np.isfinite(flat).all():  # the common case: one pass, no temporaries kept
            return self
        bad = ~np.isfinite(flat)
        self.bad += int(bad.any(axis=1).sum())
        by_column: dict[str, tuple[int, np.ndarray]] = {}
        for j in map(int, np.flatnonzero(bad.any(axis=0))):
            name = f"column {names[j]!r}" if names is not None and j < len(names) else f"feature {j}"
            k, hit = by_column.get(name, (j, np.zeros(len(x), bool)))
            by_column[name] = (k, hit | bad[:, j])
        for name, (j, hit) in by_column.items():
            k, count, first = self.columns.get(name, (j, 0, None))
            here = int(rows[hit].min()) if rows is not None else None
            first = here if first is None else first if here is None else min(first, here)
            self.columns[name] = (k, count + int(hit.sum()), first)
        return self

    def describe(self, unit: str = "row") -> str | None:
        if not self.bad:
            return None
        head = f"{_rows(self.bad)} of {self.rows} hold NaN or Inf features"
        if not self.flat:
            return head
        shown = [
            f"{name} ({_rows(count)}" + (f", first {unit} {first}" if first is not None else "") + ")"
            for name, (_, count, first) in sorted(self.columns.items(), key=lambda c: c[1][0])
        ]
        more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        return f"{head}: {', '.join(shown[:5])}{more}"


def non_finite(
    x: np.ndarray, names: Sequence[str] | None = None, rows: np.ndarray | None = None, unit: str = "row"
) -> str | None:
    """What of `x` is not a finite number, or None: how many rows, and in which columns (`names`:
    one per feature of a (rows, features) x, the column it came from; else `feature j`), with the
    first such row's number in `rows` (a `unit`: "row", a CSV's "line") when given. The one rule
    for what `smlt data prepare` refuses and what a worker refuses to train on."""
    return NonFinite().add(x, names, rows).describe(unit)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def refuse_non_finite(
    x: np.ndarray, where: str, names: Sequence[str] | None = None, rows: np.ndarray | None = None, unit: str = "row"
) -> None:
    """InvalidDataset naming the columns and rows of `x` that are not finite, and what to do."""
    problem = non_finite(x, names, rows, unit)
    if problem is not None:
        raise InvalidDataset(f"{where}: {problem}; {FIX_ROWS}")


def normalization(mean: np.ndarray, std: np.ndarray) -> Normalization:
    """Per-feature standardisation of tabular features, stored in the shards."""
    return _normalization("stored", "feature", mean, std)


def _normalization(applied, axis, mean: np.ndarray, std: np.ndarray) -> Normalization:
    std = np.where(std < 1e-8, 1.0, std)  # a constant feature or channel stays as it is, centred
    return Normalization(applied=applied, axis=axis, mean=mean.tolist(), std=std.tolist())


def target_std(std: np.ndarray, where: str, mean: np.ndarray, names: list[str] | None = None) -> np.ndarray:
    """The train split's std of each regression target, refused where a target never varies: a
    model would learn nothing from it, and a scale of 0 would make every loss and R² undefined."""
    flat = np.flatnonzero(np.asarray(std) < 1e-12)
    if flat.size:
        j = int(flat[0])
        what = f"target {names[j]!r}" if names else ("the regression target" if len(std) == 1 else f"target {j}")
        raise InvalidDataset(
            f"{where}: {what} is {float(mean[j]):g} in every row of the train split: there is nothing to learn "
            "(is it the label you meant?)"
        )
    return std


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of (N, C, H, W) images in their own units, in chunks of rows."""
    total = np.zeros(x.shape[1])
    squares = np.zeros(x.shape[1])
    step = _chunk_rows(x, 8)
    for start in range(0, len(x), step):
        part = x[start : start + step].astype(np.float64)
        total += part.sum(axis=(0, 2, 3))
        squares += (part**2).sum(axis=(0, 2, 3))
    count = len(x) * x.shape[2] * x.shape[3]
    mean = total / count
    return mean, np.sqrt(np.maximum(squares / count - mean**2, 0.0))


def standardise(x: np.ndarray, norm: Normalization, out: np.ndarray | None = None) -> np.ndarray:
    """(x - mean) / std as float32, along the normalisation's axis, in chunks of rows (into `out`,
    which may be x itself, when given)."""
    mean = np.asarray(norm.mean, np.float32)
    std = np.asarray(norm.std, np.float32)
    if norm.axis == "channel":
        shape = (1, len(mean)) + (1,) * (x.ndim - 2)
        mean, std = mean.reshape(shape), std.reshape(shape)
    out = np.empty(x.shape, np.float32) if out is None else out
    step = _chunk_rows(x, 4)
    for start in range(0, len(x), step):
        with np.errstate(over="ignore"):  # an overflow is Inf, which prepare then refuses by name
            out[start : start + step] = (x[start : start + step] - mean) / std
    return out


def _chunk_rows(x: np.ndarray, itemsize: int) -> int:
    """Rows of `x` whose values take CHUNK_BYTES as `itemsize`-byte floats (at least one)."""
    return max(1, CHUNK_BYTES // max(1, itemsize * math.prod(x.shape[1:])))
