"""Sharded aggregation through a store: long headers, ranged-GET slice reduce, sliced models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import save as np_save
from safetensors.torch import save as torch_save

from smlt.runtime import keys
from smlt.runtime.aggregate.reduce import (
    aggregate_slice,
    apply_update,
    commit_accepted,
    reduce_slice,
    reduce_updates,
    weighted_average,
)
from smlt.runtime.fanout import INLINE_MAX, plan_slices
from smlt.runtime.model_store import (
    read_model,
    read_model_blob,
    read_model_range,
    sliced_manifest,
    sliced_model_complete,
    write_manifest,
    write_slice,
)
from smlt.runtime.store import NotFound
from smlt.runtime.tensors.format import decode, encode
from smlt.runtime.tensors.layout import HEADER_PROBE, flatten, layout_of_state, read_flat, read_layout, slice_bounds
from smlt.runtime.tensors.torch_state import compress_torch_state

RUN = "r1"


def _state(rng, scale=1.0):
    return {
        "0.weight": (rng.standard_normal((64, 33)) * scale).astype(np.float32),
        "0.bias": (rng.standard_normal(64) * scale).astype(np.float32),
        "2.weight": (rng.standard_normal((10, 64)) * scale).astype(np.float32),
        "2.bias": (rng.standard_normal(10) * scale).astype(np.float32),
    }


def _put_round(store, rnd, n, rng, *, meta=True, codec="none"):
    """Model rnd + n worker updates written the way the worker writes them (torch safetensors)."""
    glob = _state(rng)
    store.put(keys.model_key(RUN, rnd), encode(glob))
    updates, weights = [], []
    for w in range(n):
        u = _state(rng, 0.01)
        samples = 32 * (w + 1)
        tu = compress_torch_state({k: torch.from_numpy(v) for k, v in u.items()}, codec)
        md = {"samples": str(samples), "train_loss": repr(0.1 * w), "worker": str(w)} if meta else None
        store.put(keys.update_key(RUN, rnd, w), torch_save(tu, metadata=md))
        updates.append(decode(torch_save(tu)))
        weights.append(samples)
    return glob, updates, weights


def test_read_layout_with_long_header_takes_a_second_get(store):
    st = {f"t{i:04d}": np.full(3, i, np.float32) for i in range(3000)}  # header ~ 200 KB
    blob = np_save(st)
    store.put("long", blob)
    lay = read_layout(store, "long", probe=4096)
    assert len(lay.tensors) == 3000 and lay.numel == 9000
    np.testing.assert_array_equal(
        read_flat(store, "long", lay, 2997, 3003), np.array([999, 999, 999, 1000, 1000, 1000], np.float32)
    )


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_reduce_slice_is_bit_identical_to_the_single_reduce(store, k):
    rng = np.random.default_rng(1)
    _, updates, weights = _put_round(store, 0, 5, rng)
    ukeys = [keys.update_key(RUN, 0, w) for w in range(5)]
    single = flatten(weighted_average(updates, weights))
    parts = [reduce_slice(store, ukeys, weights, s, e) for s, e in slice_bounds(single.size, k)]
    np.testing.assert_array_equal(np.concatenate(parts), single)


def test_reduce_slice_equal_weights_and_compressed_updates(store):
    rng = np.random.default_rng(2)
    _, updates, _ = _put_round(store, 0, 4, rng, codec="bf16")
    ukeys = [keys.update_key(RUN, 0, w) for w in range(4)]
    single = flatten(weighted_average(updates, [1.0] * 4))
    got = reduce_slice(store, ukeys, [1.0] * 4, 100, 1500)
    np.testing.assert_array_equal(got, single[100:1500])


def test_reduce_slice_rejects_mismatched_updates(store):
    store.put("a", np_save({"w": np.zeros(4, np.float32)}))
    store.put("b", np_save({"w": np.zeros(5, np.float32)}))
    with pytest.raises(ValueError, match="does not have the tensors"):
        reduce_slice(store, ["a", "b"], [1, 1], 0, 4)
    with pytest.raises(NotFound):
        reduce_slice(store, ["a", "missing"], [1, 1], 0, 4)


def test_reduce_slice_reads_only_its_bytes(store):
    rng = np.random.default_rng(3)
    _put_round(store, 0, 3, rng)
    ukeys = [keys.update_key(RUN, 0, w) for w in range(3)]
    seen = []
    real = store.get_range

    def spy(key, s, e):
        seen.append((key, s, e))
        return real(key, s, e)

    store.get_range = spy
    get = store.get
    store.get = lambda key: pytest.fail(f"whole-object GET of {key}")
    try:
        reduce_slice(store, ukeys, [1, 2, 3], 500, 900)
    finally:
        store.get_range, store.get = real, get
    data_reads = [(k, s, e) for k, s, e in seen if e - s != HEADER_PROBE]
    assert len(seen) == 6 and len(data_reads) == 3  # one header probe + one data range per update
    assert all(e - s == 400 * 4 for _, s, e in data_reads)


@pytest.mark.parametrize("k", [1, 3])
def test_aggregate_slices_make_the_same_model_as_the_single_aggregator(store, k):
    rng = np.random.default_rng(4)
    glob, updates, weights = _put_round(store, 0, 4, rng)
    accepted = commit_accepted(store, RUN, 0, [{"worker": w, "samples": s} for w, s in enumerate(weights)])
    for j in range(k):
        info = aggregate_slice(store, RUN, 0, j, k, accepted, server_lr=0.7)
        assert not info["skipped"]
    assert sliced_model_complete(store, RUN, 1)
    expect = apply_update(glob, weighted_average(updates, weights), 0.7)
    got = read_model(store, RUN, 1)
    for name in expect:
        np.testing.assert_array_equal(got[name], expect[name])
    # retried aggregator: a no-op that reports it
    assert aggregate_slice(store, RUN, 0, 0, k, accepted, server_lr=0.7)["skipped"]
    # the assembled blob loads with torch's safetensors
    from safetensors.torch import load as torch_load

    t = torch_load(read_model_blob(store, RUN, 1))
    np.testing.assert_array_equal(t["0.weight"].numpy(), expect["0.weight"])


def test_round_after_a_sliced_round_reads_the_sliced_model(store):
    """Model r+1 is sliced (k=3); round r+1 aggregates with k=2 from those slices."""
    rng = np.random.default_rng(5)
    glob, updates, weights = _put_round(store, 0, 3, rng)
    acc = [{"worker": w, "samples": s} for w, s in enumerate(weights)]
    for j in range(3):
        aggregate_slice(store, RUN, 0, j, 3, acc)
    m1 = apply_update(glob, weighted_average(updates, weights), 1.0)
    upd2 = [_state(rng, 0.01) for _ in range(2)]
    for w, u in enumerate(upd2):
        store.put(keys.update_key(RUN, 1, w), np_save(u))
    for j in range(2):
        aggregate_slice(store, RUN, 1, j, 2, [{"worker": 0, "samples": 1}, {"worker": 1, "samples": 3}])
    expect = apply_update(m1, weighted_average(upd2, [1, 3]), 1.0)
    got = read_model(store, RUN, 2)
    for name in expect:
        np.testing.assert_array_equal(got[name], expect[name])


def test_commit_accepted_first_writer_wins(store):
    a = commit_accepted(store, RUN, 3, [{"worker": 0, "samples": 10}])
    b = commit_accepted(store, RUN, 3, [{"worker": 0, "samples": 10}, {"worker": 1, "samples": 5}])
    assert a == b == [{"worker": 0, "samples": 10.0}]


def test_nan_slice_raises_and_writes_nothing(store):
    rng = np.random.default_rng(6)
    _put_round(store, 0, 1, rng)
    bad = _state(rng)
    bad["2.bias"][3] = np.nan
    store.put(keys.update_key(RUN, 0, 1), np_save(bad))
    acc = [{"worker": 0, "samples": 1}, {"worker": 1, "samples": 1}]
    k = 2
    bounds = slice_bounds(sum(v.size for v in bad.values()), k)
    outcomes = []
    for j in range(k):
        try:
            aggregate_slice(store, RUN, 0, j, k, acc)
            outcomes.append("ok")
        except FloatingPointError:
            outcomes.append("nan")
    assert outcomes.count("nan") == 1  # the NaN lives in exactly one slice
    assert not sliced_model_complete(store, RUN, 1)
    assert bounds


def test_non_float_buffers_travel_in_rest(store):
    rng = np.random.default_rng(7)
    glob = _state(rng)
    glob["bn.num_batches_tracked"] = np.array(5, np.int64)
    store.put(keys.model_key(RUN, 0), np_save(glob))
    u = {k: v for k, v in _state(rng, 0.01).items()}
    store.put(keys.update_key(RUN, 0, 0), np_save(u))
    for j in range(2):
        aggregate_slice(store, RUN, 0, j, 2, [{"worker": 0, "samples": 8}])
    got = read_model(store, RUN, 1)
    assert int(got["bn.num_batches_tracked"]) == 5
    np.testing.assert_array_equal(got["0.weight"], glob["0.weight"] + u["0.weight"])


def _write_sliced_model(store, rnd, state, k):
    """Model rnd as k slices + manifest, written as sharded aggregators write them."""
    layout = layout_of_state(state)
    manifest = sliced_manifest(RUN, rnd, layout, k, has_rest=False)
    flat = flatten(state, layout)
    for j, (s, e) in enumerate(manifest.bounds):
        write_slice(store, manifest, j, flat[s:e])
    write_manifest(store, RUN, rnd, manifest)
    return manifest


def test_write_and_read_sliced_model(store):
    rng = np.random.default_rng(8)
    st = _state(rng)
    m = _write_sliced_model(store, 0, st, 4)
    assert len(m.keys) == 4
    got = read_model(store, RUN, 0)
    for k in st:
        np.testing.assert_array_equal(got[k], st[k])
    np.testing.assert_array_equal(read_model_range(store, RUN, 0, 10, 2800), flatten(st)[10:2800])
    with pytest.raises(ValueError):
        read_model_range(store, RUN, 0, 10, 3000)
    with pytest.raises(NotFound):
        read_model(store, RUN, 9)


@pytest.mark.parametrize(
    "param_bytes,n,expect",
    [
        (4 << 20, 8, 1),  # 1M float32 x 8 workers: one aggregator
        (4 << 20, 32, 1),  # slices would be < 4 MiB
        (44 << 20, 8, 2),
        (44 << 20, 32, 6),  # 32 x 11M: 1.4 GB to read
        (44 << 20, 64, 11),
        (400 << 20, 200, INLINE_MAX),  # capped: the slices' Map runs at most 40 at once
        (1000, 1000, 1),
    ],
)
def test_plan_slices(param_bytes, n, expect):
    assert plan_slices(param_bytes, n) == expect


def test_plan_slices_keeps_traffic_per_aggregator_flat():
    p = 44 << 20
    per = [n * p / plan_slices(p, n) for n in (8, 16, 32, 64)]
    assert max(per) <= 256 << 20


def test_reduce_updates_is_the_single_aggregators_average(store):
    rng = np.random.default_rng(9)
    _, updates, weights = _put_round(store, 0, 5, rng, codec="fp16")
    got = reduce_updates(store, [keys.update_key(RUN, 0, w) for w in range(5)], weights)
    expect = weighted_average(updates, weights)
    assert set(got) == set(expect)
    for name in expect:
        np.testing.assert_array_equal(got[name], expect[name])


class _Died(BaseException):
    """The aggregator's process died here (nothing in the step catches a BaseException)."""


def test_slice_zero_dying_between_its_slice_and_the_rest_writes_the_rest_on_retry(s3_store):
    """Aggregator 0 writes its slice, then model r+1's non-floating tensors (`rest`): dying
    between the two, its retry must still write the rest, or model r+1 is never complete (finish
    would take the missing part for a NaN slice and call the round diverged)."""
    store = s3_store
    rng = np.random.default_rng(9)
    glob = _state(rng)
    glob["bn.num_batches_tracked"] = np.array(5, np.int64)
    store.put(keys.model_key(RUN, 0), np_save(glob))
    u = _state(rng, 0.01)
    store.put(keys.update_key(RUN, 0, 0), np_save(u))
    accepted = [{"worker": 0, "samples": 8}]
    real = type(store).put

    def put(self, key, *a, **kw):
        out = real(self, key, *a, **kw)
        if "model.slices" in key and "rest" not in key and "manifest" not in key:
            raise _Died(key)  # right after slice 0's write
        return out

    type(store).put = put
    try:
        with pytest.raises(_Died):
            aggregate_slice(store, RUN, 0, 0, 2, accepted)
    finally:
        type(store).put = real
    aggregate_slice(store, RUN, 0, 0, 2, accepted)  # the retry
    aggregate_slice(store, RUN, 0, 1, 2, accepted)
    assert sliced_model_complete(store, RUN, 1)
    got = read_model(store, RUN, 1)
    assert int(got["bn.num_batches_tracked"]) == 5
    np.testing.assert_array_equal(got["0.weight"], glob["0.weight"] + u["0.weight"])
