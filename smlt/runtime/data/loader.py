"""A worker's shards, streamed: read one after another with the next one prefetched by a
background thread (Cirrus's iterator), so memory holds the shard in use and the next one, never
the worker's whole slice.

The training order is deterministic, seeded by (job seed, round, worker): each pass over the
slice takes its shards in a seeded order and each shard's rows in a seeded order, so a retried
worker computes the same update and every sample of the slice is used once per pass. A batch may
span two shards. Evaluation reads its slice in order, in fixed batches.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from time import perf_counter
from typing import Literal

import numpy as np
from botocore.exceptions import BotoCoreError, ClientError

from smlt.runtime.data.arrays import non_finite
from smlt.runtime.data.manifest import Manifest, ShardInfo
from smlt.runtime.data.shards import ShardCache, load_shard, warm
from smlt.runtime.data.tabular import feature_names
from smlt.runtime.errors import CorruptShard, DataError, InvalidDataset, SmltError

log = logging.getLogger(__name__)

Split = Literal["train", "validation"]
Key = tuple[Split, int]  # (split, shard index)
Arrays = tuple[np.ndarray, np.ndarray]
EVAL_BATCH = 512  # rows per evaluation forward pass


class ShardReader:
    """Reads one shard of the dataset: checks it against the manifest's sample shape and names
    the split and index of a shard it cannot read."""

    def __init__(self, uri: str, manifest: Manifest, cache: ShardCache):
        self.uri, self.manifest, self.cache = uri, manifest, cache

    def shard(self, key: Key) -> ShardInfo:
        split, index = key
        return (self.manifest.train if split == "train" else self.manifest.validation).shards[index]

    def __call__(self, key: Key) -> Arrays:
        split, index = key
        shard = self.shard(key)
        try:
            x, y = load_shard(self.uri, shard, self.cache)
        except CorruptShard as e:
            raise CorruptShard(str(e), key=e.key, reason=e.reason, split=split, index=index) from None
        want = self.manifest.x.shape
        if list(x.shape[1:]) != want:
            raise InvalidDataset(
                f"shard {shard.key} has {math.prod(x.shape[1:])} features, the manifest says "
                f"{self.manifest.features} (samples of shape {list(x.shape[1:])}, not {want})"
            )
        if len(y) != len(x):
            raise InvalidDataset(f"shard {shard.key} has {len(x)} rows of x but {len(y)} of y")
        # Inputs that are not finite make the loss NaN, which would read as a diverged round: the
        # shard matches its manifest, so the data itself is the cause, on any worker.
        problem = non_finite(x, feature_names(self.manifest.columns) if self.manifest.columns else None)
        if problem is not None:
            raise DataError(
                f"{split} shard {shard.key} holds inputs that are not finite numbers: {problem}; the data, "
                "not training.learning_rate, is the cause: prepare the dataset again (`smlt data prepare "
                "SOURCE --out FOLDER` refuses such values, naming their column and lines), then start the run again"
            )
        return x, y

    def warm(self, keys: Sequence[Key]) -> None:
        """Download into the cache (up to its cap) the shards not cached yet, for the rounds to
        come: a shard this round did not need is not read into memory, nor is its error this
        round's (the round that reads it reports it)."""
        for key in keys:
            try:
                warm(self.uri, self.shard(key), self.cache)
            except (SmltError, BotoCoreError, ClientError, OSError) as e:
                log.warning("shard cache: %s not cached (%s)", self.shard(key).key, e)


class Prefetcher:
    """Shards by key, with at most one read ahead in a background thread: `get` returns a shard
    (waiting for it if it is the one ahead), `prefetch` starts reading the next. `wait_s` is the
    time callers spent waiting for reads, the part of loading that did not overlap compute.

    An error of a read ahead is raised by the `get` of that shard, never for a shard not used."""

    def __init__(self, read: Callable[[Key], Arrays]):
        self._read = read
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smlt-prefetch")
        self._ahead: tuple[Key, Future[Arrays]] | None = None
        self.wait_s = 0.0

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, key: Key) -> Arrays:
        t = perf_counter()
        try:
            if self._ahead is not None and self._ahead[0] == key:
                future, self._ahead = self._ahead[1], None
                return future.result()
            self._drop()
            return self._read(key)
        finally:
            self.wait_s += perf_counter() - t

    def prefetch(self, key: Key) -> None:
        if self._ahead is None:
            self._ahead = (key, self._pool.submit(self._read, key))

    def background(self, fn: Callable[[], None]) -> None:
        """Run `fn` in the prefetch thread (after any read ahead); `close` waits for it."""
        self._pool.submit(fn)

    def close(self) -> None:
        """Wait for a read in flight (a frozen Lambda must not hold half a download) and stop."""
        self._drop()
        self._pool.shutdown(wait=True)

    def _drop(self) -> None:
        if self._ahead is not None:
            future, self._ahead = self._ahead[1], None
            if not future.cancel():
                future.exception()  # wait; the shard was not needed, nor is its error


def shard_order(n_shards: int, seed: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(pass, position in the slice) for ever: each pass a seeded permutation of the shards."""
    p = 0
    while True:
        for i in np.random.default_rng([*seed, p]).permutation(n_shards):
            yield p, int(i)
        p += 1


def train_batches(
    shards: Prefetcher, indices: Sequence[int], batch: int, steps: int, seed: Sequence[int]
) -> Iterator[Arrays]:
    """`steps` batches of exactly `batch` rows from the train shards `indices`, in the seeded
    order; the next shard is read ahead only when the rows in hand cannot finish the batches."""
    need = batch * steps
    if need == 0 or not indices:
        return
    order = shard_order(len(indices), seed)
    p, i = next(order)
    held: list[Arrays] = []  # rows left over from the last shard, fewer than a batch
    n_held = empty = 0
    while need:
        x, y = shards.get(("train", indices[i]))
        empty = empty + 1 if len(x) == 0 else 0
        if empty == len(indices):
            raise InvalidDataset(f"the train shards {list(indices)} hold no rows")
        rows = np.random.default_rng([*seed, p, i]).permutation(len(x))
        p, i = next(order)
        if n_held + len(x) < need:
            shards.prefetch(("train", indices[i]))
        start = 0
        while need and n_held + len(x) - start >= batch:
            take = rows[start : start + batch - n_held]
            start += len(take)
            parts = [*held, (x[take], y[take])]
            held, n_held = [], 0
            yield np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
            need -= batch
        if need and start < len(x):
            held.append((x[rows[start:]], y[rows[start:]]))
            n_held += len(x) - start
        del x, y  # the next shard is the only one left in memory


def eval_batches(
    shards: Prefetcher, indices: Sequence[int], then: Key | None = None, batch: int = EVAL_BATCH
) -> Iterator[Arrays]:
    """The validation shards `indices` in order, in batches of at most `batch` rows; `then` (the
    first train shard) is read ahead while the last one is evaluated."""
    keys: list[Key] = [("validation", i) for i in indices]
    for j, key in enumerate(keys):
        x, y = shards.get(key)
        if j + 1 < len(keys):
            shards.prefetch(keys[j + 1])
        elif then is not None:
            shards.prefetch(then)
        for s in range(0, len(x), batch):
            yield x[s : s + batch].copy(), y[s : s + batch].copy()  # writable, as torch wants
        del x, y


def first_train_key(indices: Sequence[int], seed: Sequence[int]) -> Key | None:
    """The train shard `train_batches` reads first (to read it ahead during evaluation)."""
    if not indices:
        return None
    return "train", indices[next(shard_order(len(indices), seed))[1]]
