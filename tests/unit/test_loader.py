"""The worker's streaming loader (smlt.runtime.data.loader): seeded order, prefetching, batched evaluation."""

import threading

import numpy as np
import pytest

from smlt.runtime.data.loader import Prefetcher, eval_batches, first_train_key, train_batches
from smlt.runtime.errors import CorruptShard

ROWS = {3: 5, 7: 7, 8: 3, 11: 9}  # train shard index -> rows: 24 rows in all
SEED = (0, 4, 1)  # job seed, round, worker


class Shards:
    """Shards whose x is each row's id (shard * 100 + row); records the reads, and in which thread."""

    def __init__(self, rows=ROWS, split="train", fail=()):
        self.rows, self.split, self.fail = rows, split, set(fail)
        self.reads: list[tuple[str, int]] = []
        self.threads: dict[int, str] = {}
        self.requested = {i: threading.Event() for i in rows}

    def __call__(self, key):
        split, i = key
        assert split == self.split
        self.reads.append(key)
        self.threads[i] = threading.current_thread().name
        self.requested[i].set()
        if i in self.fail:
            raise CorruptShard(f"shard {i} is corrupt", key=str(i), reason="digest")
        ids = i * 100 + np.arange(self.rows[i])
        x, y = ids.reshape(-1, 1).astype(np.float32), ids % 10
        x.setflags(write=False), y.setflags(write=False)  # as safetensors gives them
        return x, y


def stream(reader, batch, steps, seed=SEED, indices=tuple(ROWS)):
    with Prefetcher(reader) as shards:
        return list(train_batches(shards, list(indices), batch, steps, seed))


def ids(batches):
    return [int(v) for x, _ in batches for v in x[:, 0]]


def test_order_is_seeded_and_every_sample_of_the_slice_is_used_once_per_pass():
    every = sorted(i * 100 + r for i, n in ROWS.items() for r in range(n))
    batches = stream(Shards(), batch=4, steps=15)  # 60 rows: two passes and a half
    assert [len(x) for x, _ in batches] == [4] * 15  # batches span shards
    got = ids(batches)
    assert sorted(got[:24]) == every and sorted(got[24:48]) == every  # each pass: every row once
    shards_in = [list(dict.fromkeys(v // 100 for v in got[a : a + 24])) for a in (0, 24)]
    assert shards_in[0] != shards_in[1]  # each pass takes the shards in a new order
    big = [v for v in got[:24] if v // 100 == 11]
    assert big != sorted(big)  # and a shard's rows in a seeded order
    assert all(int(y) == v % 10 for x, ys in batches for v, y in zip(x[:, 0], ys))  # x and y stay paired
    assert ids(stream(Shards(), batch=4, steps=15)) == got  # a retried worker: the same order
    assert ids(stream(Shards(), batch=4, steps=15, seed=(0, 4, 2))) != got  # another worker: its own
    assert ids(stream(Shards(), batch=4, steps=15, seed=(0, 5, 1))) != got  # another round: another


class Recording(Prefetcher):
    def __init__(self, read):
        super().__init__(read)
        self.ahead = []

    def prefetch(self, key):
        self.ahead.append(key)
        super().prefetch(key)


def test_less_than_a_pass_reads_only_the_shards_it_needs():
    order = [k for _, k in _pass_order()]
    for rows, ahead in ((3, []), (ROWS[order[0]] + 1, [("train", order[1])])):
        reader = Shards()
        with Recording(reader) as shards:
            assert len(list(train_batches(shards, list(ROWS), 1, rows, SEED))) == rows
        assert reader.reads[0] == ("train", order[0]) == first_train_key(list(ROWS), SEED)
        assert shards.ahead == ahead  # the next shard is read ahead only when it will be needed


def test_the_next_shard_is_read_while_the_current_one_trains():
    order = [k for _, k in _pass_order()]
    reader = Shards()
    with Prefetcher(reader) as shards:
        batches = train_batches(shards, list(ROWS), 1, 24, SEED)
        x, _ = next(batches)  # one row of the first shard used, the others not yet
        assert int(x[0, 0]) // 100 == order[0] and reader.reads[0] == ("train", order[0])
        assert reader.requested[order[1]].wait(5), "the next shard was not requested before the current one was used"
        assert reader.threads[order[1]].startswith("smlt-prefetch") and reader.threads[order[0]] == "MainThread"
        rest = list(batches)
    assert len(rest) == 23 and sorted(reader.reads) == sorted(("train", i) for i in ROWS)


def test_a_read_ahead_error_is_raised_by_the_batch_that_needs_the_shard():
    order = [k for _, k in _pass_order()]
    bad = order[1]
    reader = Shards(fail=[bad])
    with Prefetcher(reader) as shards:
        batches = train_batches(shards, list(ROWS), 1, 24, SEED)
        got = [next(batches) for _ in range(ROWS[order[0]])]  # the first shard's rows all arrive
        assert len(got) == ROWS[order[0]]
        with pytest.raises(CorruptShard, match=f"shard {bad} is corrupt"):
            next(batches)


def test_an_error_of_a_shard_not_needed_is_not_raised():
    order = [k for _, k in _pass_order()]
    reader = Shards(fail=order[1:])
    assert len(stream(reader, batch=1, steps=ROWS[order[0]])) == ROWS[order[0]]


def _pass_order():
    reader = Shards()
    stream(reader, 1, 24)
    return reader.reads


def test_evaluation_reads_its_shards_in_order_in_fixed_batches_and_reads_the_first_train_shard_ahead():
    val = Shards({0: 1100, 1: 30}, split="validation")
    train = Shards()

    def read(key):
        return (val if key[0] == "validation" else train)(key)

    with Prefetcher(read) as shards:
        batches = eval_batches(shards, [0, 1], then=("train", 8), batch=512)
        sizes = []
        for x, y in batches:
            sizes.append(len(x))
            assert x.flags.writeable and y.flags.writeable  # as torch.from_numpy wants them
        assert sizes == [512, 512, 76, 30]
        assert train.requested[8].wait(5)  # read ahead during the last validation shard
        assert shards.get(("train", 8))[0][0, 0] == 800
    assert val.reads == [("validation", 0), ("validation", 1)] and train.reads == [("train", 8)]


def test_an_empty_validation_slice_yields_nothing():
    with Prefetcher(Shards()) as shards:
        assert list(eval_batches(shards, [])) == []
