"""The ObjectStore contract, checked on moto S3 and on a real redis-server, plain and over TLS, alike."""

from __future__ import annotations

import threading
from urllib.parse import urlparse

import pytest

from smlt.runtime.store import NotFound, RedisStore, S3Store, open_store


def test_put_get_exists_delete(store):
    assert not store.exists("a/b.bin")
    with pytest.raises(NotFound):
        store.get("a/b.bin")
    assert store.put("a/b.bin", b"\x00\x01hello") is True
    assert store.exists("a/b.bin")
    assert store.get("a/b.bin") == b"\x00\x01hello"
    store.put("a/b.bin", b"again")
    assert store.get("a/b.bin") == b"again"
    store.delete("a/b.bin")
    assert not store.exists("a/b.bin")
    store.delete("a/b.bin")  # deleting a missing key is not an error


def test_get_range(store):
    data = bytes(range(256)) * 10
    store.put("blob", data)
    assert store.get_range("blob", 0, 8) == data[:8]
    assert store.get_range("blob", 100, 1000) == data[100:1000]
    assert store.get_range("blob", 2550, 2560) == data[2550:]
    # a range running past the end returns what there is (the header probe relies on it)
    assert store.get_range("blob", 2500, 100_000) == data[2500:]
    with pytest.raises(NotFound):
        store.get_range("nope", 0, 8)


def test_empty_object_is_not_missing(store):
    store.put("empty", b"")
    assert store.exists("empty")
    assert store.get("empty") == b""


def test_if_absent_first_writer_wins(store):
    assert store.put("k", b"first", if_absent=True) is True
    assert store.put("k", b"second", if_absent=True) is False
    assert store.get("k") == b"first"


def test_if_absent_race_has_exactly_one_winner(store):
    wins = []
    barrier = threading.Barrier(8)

    def write(i):
        barrier.wait()
        wins.append((i, store.put("race", str(i).encode(), if_absent=True)))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, ok in wins if ok]
    assert len(winners) == 1
    assert store.get("race") == str(winners[0]).encode()


def test_list_by_prefix_sorted(store):
    for k in ["r/1/b", "r/1/a", "r/10/x", "r/2/c", "other/z"]:
        store.put(k, b"x")
    assert store.list("r/1/") == ["r/1/a", "r/1/b"]
    assert store.list("r/1") == ["r/1/a", "r/1/b", "r/10/x"]
    assert store.list("r/") == ["r/1/a", "r/1/b", "r/10/x", "r/2/c"]
    assert store.list("missing/") == []


def test_list_treats_glob_characters_literally(store):
    store.put("a*b/[x]?/1", b"1")
    store.put("aXb/y/2", b"2")
    assert store.list("a*b/") == ["a*b/[x]?/1"]
    assert store.list("a*b/[x]?/") == ["a*b/[x]?/1"]


def test_list_many_keys(store):
    # Redis: many SCAN pages. S3 (paged by 1,000) is kept small: moto takes ~7 ms a PUT.
    n = 1050 if isinstance(store, RedisStore) else 60
    for i in range(n):
        store.put(f"many/{i:05d}", b"")
    keys = store.list("many/")
    assert len(keys) == n and keys == sorted(keys)


def test_large_value_roundtrip(store):
    data = bytes(range(256)) * (40_000)  # ~10 MB
    store.put("big", data)
    assert store.get("big") == data
    assert store.get_range("big", 5_000_000, 5_000_100) == data[5_000_000:5_000_100]


def test_redis_prefix_isolation(each_redis_server):
    url = each_redis_server.url
    a, b = RedisStore(url, prefix="iso-a/"), RedisStore(url, prefix="iso-b/")
    a.put("k", b"1")
    assert not b.exists("k")
    assert b.list("") == [] or "k" not in b.list("")
    assert a.list("") == ["k"]


def test_redis_url_selects_database(each_redis_server):
    url = urlparse(each_redis_server.url)  # a TLS server's URL carries ?ssl_ca_certs=
    db0 = RedisStore(url._replace(path="/0").geturl(), prefix="dbtest/")
    db3 = RedisStore(url._replace(path="/3").geturl(), prefix="dbtest/")
    db3.put("only-in-3", b"x")
    # get goes through the raw reader, exists through redis-py: both must be on database 3
    assert db3.get("only-in-3") == b"x" and db3.exists("only-in-3")
    assert not db0.exists("only-in-3")
    with pytest.raises(NotFound):
        db0.get("only-in-3")
    db3.delete("only-in-3")


def test_open_store_dispatches_on_scheme(each_redis_server):
    assert isinstance(open_store(each_redis_server.url), RedisStore)
    s3 = open_store("s3://bucket/some/prefix")
    assert isinstance(s3, S3Store) and s3.bucket == "bucket" and s3.prefix == "some/prefix/"
    with pytest.raises(ValueError):
        open_store("ftp://x")
    with pytest.raises(ValueError):
        RedisStore("http://localhost:6379")


def test_values_are_bytes_that_safetensors_accepts(store):
    import numpy as np
    from safetensors.numpy import load, save

    blob = save({"w": np.arange(300_000, dtype=np.float32)})
    store.put("st", blob)
    got = store.get("st")
    assert type(got) is bytes
    assert load(got)["w"][-1] == 299_999
    assert type(store.get_range("st", 0, 8)) is bytes
