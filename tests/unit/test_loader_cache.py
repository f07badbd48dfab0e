"""The workers' /tmp shard cache (smlt.runtime.data.shards.ShardCache): a size cap, least recently used
evicted first, never a shard in use, every read checked against the shard's sha256.

Shards are named here by a letter; the cache keys them by the sha256 of their bytes (`sha`)."""

import hashlib

import numpy as np
from safetensors.numpy import save

from smlt.runtime.data.shards import ShardCache

KB = 1024
NAMES: dict[str, str] = {}  # sha256 -> letter


def blob(i: int) -> bytes:
    return save({"x": np.full((KB // 4, 1), i, np.float32), "y": np.zeros(1, np.int64)})


def shard(name: str) -> tuple[str, bytes]:
    """(sha256, bytes) of the shard called `name`."""
    data = blob(ord(name))
    digest = hashlib.sha256(data).hexdigest()
    NAMES[digest] = name
    return digest, data


def sha(name: str) -> str:
    return shard(name)[0]


def put(cache: ShardCache, name: str) -> bool:
    return cache.put(*shard(name))


def cached(cache: ShardCache) -> set[str]:
    return {NAMES[p.name.removesuffix(".safetensors")] for p in cache.root.iterdir()}


def test_least_recently_used_shards_are_evicted_to_stay_under_the_cap(tmp_path):
    size = len(blob(0))
    cache = ShardCache(tmp_path, cap_bytes=3 * size)
    for name in "abc":
        assert put(cache, name)
    assert cache.get(sha("a")) is not None  # a is now the most recent; b the least
    assert put(cache, "d")
    assert cached(cache) == {"a", "c", "d"}
    assert cache.get(sha("b")) is None
    assert put(cache, "e") and cached(cache) == {"a", "d", "e"}  # then c
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3 * size
    assert float(cache.get(sha("e"))["x"][0, 0]) == ord("e")


def test_a_shard_in_use_is_never_evicted(tmp_path):
    size = len(blob(0))
    cache = ShardCache(tmp_path, cap_bytes=2 * size)
    put(cache, "a"), put(cache, "b")
    with cache.in_use([sha("a"), sha("b")]):
        assert not put(cache, "c")  # no room without evicting what this round reads
        assert cached(cache) == {"a", "b"}
    with cache.in_use([sha("a")]):
        assert put(cache, "c") and cached(cache) == {"a", "c"}
    assert put(cache, "d") and cached(cache) == {"c", "d"}  # out of use: a goes first


def test_a_shard_larger_than_the_cap_is_not_cached(tmp_path):
    cache = ShardCache(tmp_path, cap_bytes=len(blob(0)) - 1)
    assert not put(cache, "a")
    assert not cache.has(sha("a")) and cache.get(sha("a")) is None


def test_a_file_another_process_evicted_is_a_miss(tmp_path):
    cache = ShardCache(tmp_path, cap_bytes=10 * KB * KB)
    put(cache, "a")
    ShardCache(tmp_path).path(sha("a")).unlink()  # the other process
    assert cache.get(sha("a")) is None and put(cache, "b")


def test_a_cached_copy_that_no_longer_matches_its_sha256_is_evicted_on_read(tmp_path, caplog):
    """The cache folder is shared by every local run and outlives them: a copy changed on disk
    (issue #38: train shards with their labels shifted) is never trained on; the caller reads the
    shard from S3 again (`load_shard`, which checks the download)."""
    cache = ShardCache(tmp_path, cap_bytes=10 * KB * KB)
    put(cache, "a")
    path = cache.path(sha("a"))
    other = blob(ord("z"))  # a well-formed shard, other values: only its digest tells
    assert len(other) == path.stat().st_size
    path.write_bytes(other)
    assert cache.get(sha("a")) is None
    assert not path.exists()  # evicted
    assert f"shard cache: {path} does not match its sha256: evicted, read from S3 again" in caplog.text
    assert put(cache, "a") and float(cache.get(sha("a"))["x"][0, 0]) == ord("a")
