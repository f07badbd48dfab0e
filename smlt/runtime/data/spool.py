"""A split's shards built in bounded memory: rows are dealt to the shards as they come (the t-th
row of the split to shard t mod n, so shards differ in size by one row at most) and appended to
one spool file per shard; `finish` then reads each shard back alone, shuffles it, transforms it
(imputed fills, standardisation) and writes it as safetensors. A shard holds at most
MAX_SHARD_BYTES, so memory is a shard or two, whatever the dataset's size."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from smlt.runtime.data.manifest import ShardInfo, SplitInfo

# The most bytes of x and y one shard holds: more shards than asked for when a split needs it.
MAX_SHARD_BYTES = 64 << 20
# The fewest train shards of a dataset (`smlt data prepare --shards`; a job's `dataset.uri` and a
# pipeline's upload, one file or in parts, are prepared with it): a run's workers each take whole
# shards, so a dataset of fewer shards than workers has workers training on the same rows.
SHARDS = 16

Writer = Callable[[str, bytes], object]
Transform = Callable[[np.ndarray], np.ndarray]


def shard_count(requested: int, rows: int, row_bytes: int) -> int:
    """`requested` shards, more when one would hold more than MAX_SHARD_BYTES; one per row at most."""
    return max(1, min(rows, max(requested, math.ceil(rows * row_bytes / MAX_SHARD_BYTES))))


def requested(shards: int, split: str) -> int:
    """The fewest shards of a split: `shards` for train, half as many (at least one) for validation."""
    return shards if split == "train" else max(1, shards // 2)


def part_share(shards: int, rows: int, table_rows: int) -> int:
    """A part's share of its table's `shards` (of one split): ceil(shards x rows / table_rows), at
    least 1. The parts' shares add up to `shards` at least, and each depends on the part's rows
    and the table's alone (the same parts, the same shards)."""
    return max(1, -(-shards * rows // table_rows)) if table_rows > 0 else 1


class ShardSpool:
    def __init__(self, folder: Path, split: str, shards: int, part: int | None = None):
        self.folder = folder
        self.split = split
        self.shards = shards
        self.part = part  # a table in many files: this part's shards are named (and shuffled) by it
        self.rows = 0
        self._pieces: list[list[int]] = [[] for _ in range(shards)]  # rows per append, per shard
        self._x: tuple[np.dtype, tuple[int, ...]] | None = None
        self._y: tuple[np.dtype, tuple[int, ...]] | None = None

    def _path(self, j: int) -> Path:
        return self.folder / f"{self.split}-{j:05d}.spool"

    def add(self, x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> None:
        """Rows in the order they are dealt; `rows` numbers each (a file line, a row), for messages."""
        if not len(x):
            return
        self._x = self._x or (x.dtype, x.shape[1:])
        self._y = self._y or (y.dtype, y.shape[1:])
        n = self.shards
        for j in range(n):
            first = (j - self.rows) % n
            if first >= len(x):
                continue
            with self._path(j).open("ab") as f:
                for part in (x[first::n], y[first::n], rows[first::n].astype(np.int64)):
                    np.ascontiguousarray(part).tofile(f)
            self._pieces[j].append(len(range(first, len(x), n)))
        self.rows += len(x)

    def read(self, j: int, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard j's (x, y, row numbers); with `order` (a permutation) row i goes to order[i]."""
        assert self._x is not None and self._y is not None
        total = sum(self._pieces[j])
        (xt, xs), (yt, ys) = self._x, self._y
        x, y = np.empty((total, *xs), xt), np.empty((total, *ys), yt)
        rows = np.empty(total, np.int64)
        at = 0
        with self._path(j).open("rb") as f:
            for count in self._pieces[j]:
                where = slice(at, at + count) if order is None else order[at : at + count]
                for out, dtype, shape in ((x, xt, xs), (y, yt, ys), (rows, np.dtype(np.int64), ())):
                    size = count * math.prod(shape)
                    out[where] = np.fromfile(f, dtype, size).reshape(count, *shape)
                at += count
        return x, y, rows

    def finish(self, out: Writer, transform: Transform, seed: int) -> SplitInfo:
        """Write each shard shuffled (seeded by `seed`, the split and the shard) with its x
        transformed, delete its spool file, and return the split's shards."""
        infos = []
        counts: np.ndarray | None = None
        for j in range(self.shards):
            if not self._pieces[j]:
                continue
            size = sum(self._pieces[j])
            own = [] if self.part is None else [self.part]
            rng = np.random.default_rng([seed, self.split == "validation", j, *own])
            x, y, _ = self.read(j, rng.permutation(size))
            self._path(j).unlink()
            if y.ndim == 1 and y.dtype.kind in "iu":  # class indices
                found = np.bincount(y)
                counts = found if counts is None else add_counts(counts, found)
            blob = save({"x": transform(x), "y": y})
            del x, y
            key = (
                f"{self.split}-{j:05d}.safetensors"
                if self.part is None
                else f"{self.split}-{self.part:05d}-{j:05d}.safetensors"
            )
            out(key, blob)
            infos.append(ShardInfo(key=key, rows=size, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
        return SplitInfo(
            rows=self.rows, shards=infos, class_counts=None if counts is None else [int(c) for c in counts]
        )


def add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two per-class counts added, the shorter padded with zeros."""
    n = max(len(a), len(b))
    return np.pad(a, (0, n - len(a))) + np.pad(b, (0, n - len(b)))
