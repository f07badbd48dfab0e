"""The workers' /tmp shard cache (smlt.runtime.data.shards.ShardCache): a size cap, least recently used
evicted first, never a shard in use."""

import numpy as np
from safetensors.numpy import save

from smlt.runtime.data.shards import ShardCache

KB = 1024


def blob(i: int) -> bytes:
    return save({"x": np.full((KB // 4, 1), i, np.float32), "y": np.zeros(1, np.int64)})


def cached(cache: ShardCache) -> set[str]:
    return {p.name.removesuffix(".safetensors") for p in cache.root.iterdir()}


def test_least_recently_used_shards_are_evicted_to_stay_under_the_cap(tmp_path):
    size = len(blob(0))
    cache = ShardCache(tmp_path, cap_bytes=3 * size)
    for name in "abc":
        assert cache.put(name, blob(ord(name)))
    assert cache.get("a") is not None  # a is now the most recent; b the least
    assert cache.put("d", blob(4))
    assert cached(cache) == {"a", "c", "d"}
    assert cache.get("b") is None
    assert cache.put("e", blob(5)) and cached(cache) == {"a", "d", "e"}  # then c
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3 * size
    assert float(cache.get("e")["x"][0, 0]) == 5.0


def test_a_shard_in_use_is_never_evicted(tmp_path):
    size = len(blob(0))
    cache = ShardCache(tmp_path, cap_bytes=2 * size)
    cache.put("a", blob(1)), cache.put("b", blob(2))
    with cache.in_use(["a", "b"]):
        assert not cache.put("c", blob(3))  # no room without evicting what this round reads
        assert cached(cache) == {"a", "b"}
    with cache.in_use(["a"]):
        assert cache.put("c", blob(3)) and cached(cache) == {"a", "c"}
    assert cache.put("d", blob(4)) and cached(cache) == {"c", "d"}  # out of use: a goes first


def test_a_shard_larger_than_the_cap_is_not_cached(tmp_path):
    cache = ShardCache(tmp_path, cap_bytes=len(blob(0)) - 1)
    assert not cache.put("a", blob(1))
    assert not cache.has("a") and cache.get("a") is None


def test_a_file_another_process_evicted_is_a_miss(tmp_path):
    cache = ShardCache(tmp_path, cap_bytes=10 * KB * KB)
    cache.put("a", blob(1))
    ShardCache(tmp_path).path("a").unlink()  # the other process
    assert cache.get("a") is None and cache.put("b", blob(2))
