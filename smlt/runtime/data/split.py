"""The train/validation split: seeded, reproducible, and decided block by block, so that a source
of any size is split as it streams past without knowing how many rows it has.

Rows are taken in file order in blocks of SPLIT_ROWS (the last block holds what is left); one
generator seeded with `seed` shuffles each block in turn, and the first max(1, round(n *
fraction)) rows of a shuffled block of n are validation rows, the others train rows. A source
of at most SPLIT_ROWS rows is thus split by one permutation of all its rows
(`default_rng(seed).permutation(n)`). Each split's rows come back in their shuffled order, the
order in which they are dealt to shards.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from smlt.runtime.data.table_reader import Block

SPLIT_ROWS = 8192


class Split:
    def __init__(self, fraction: float, seed: int | Sequence[int]):
        self.fraction = fraction
        self._rng = np.random.default_rng(seed)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(validation, train) positions among the next `n` rows, each in shuffled order. `n` is a
        multiple of SPLIT_ROWS except for the source's last rows (`aligned` cuts blocks so)."""
        val, train = [], []
        for start in range(0, n, SPLIT_ROWS):
            size = min(SPLIT_ROWS, n - start)
            order = start + self._rng.permutation(size)
            k = max(1, int(round(size * self.fraction)))
            val.append(order[:k])
            train.append(order[k:])
        empty = np.zeros(0, np.int64)
        return np.concatenate(val or [empty]), np.concatenate(train or [empty])


def aligned(blocks: Iterable[Block]) -> Iterator[Block]:
    """The same rows in blocks of SPLIT_ROWS rows, but for the last: what `take` needs, and what
    makes every statistic merged block by block the same whatever the size of the file's blocks."""
    carry: Block | None = None
    for block in blocks:
        if carry is not None:
            head = block.slice(0, SPLIT_ROWS - len(carry))
            carry = carry.concat(head)
            block = block.slice(len(head), len(block))
            if len(carry) < SPLIT_ROWS:
                continue
            yield carry
            carry = None
        full = len(block) - len(block) % SPLIT_ROWS
        for start in range(0, full, SPLIT_ROWS):
            yield block.slice(start, start + SPLIT_ROWS)
        if full < len(block):
            carry = block.slice(full, len(block))
    if carry is not None:
        yield carry
