"""Per-step synchronous mode: reduce-scatter through the store, with threads as workers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from smlt.runtime.exchange import BarrierTimeout, Poll, ReduceScatter, delete_prefix, wait_get
from smlt.runtime.keys import sync_prefix


def _run(store, n, numel, steps, *, codec="none", weights=None, timeout=30.0, absent=()):
    prefix = sync_prefix("run", 0)
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((steps, n, numel)).astype(np.float32)
    weights = weights or [1.0] * n
    results: dict[int, list[np.ndarray]] = {}
    errors: dict[int, BaseException] = {}

    def worker(i):
        rs = ReduceScatter(
            store, prefix, n, i, numel, codec=codec, poll=Poll(first=0.001, longest=0.02, timeout=timeout)
        )
        try:
            results[i] = [rs.allreduce(s, grads[s, i], weights[i]) for s in range(steps)]
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n) if i not in absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return grads, results, errors


@pytest.mark.parametrize("n,numel", [(4, 10_007), (3, 2), (1, 100)])
def test_allreduce_averages_exactly_and_everyone_agrees(store, n, numel):
    w = [1.0 + i for i in range(n)]
    grads, results, errors = _run(store, n, numel, 3, weights=w)
    assert not errors, errors
    for s in range(3):
        expect = np.tensordot(np.array(w, np.float64), grads[s].astype(np.float64), axes=1) / sum(w)
        for i in range(n):
            np.testing.assert_allclose(results[i][s], expect, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(results[i][s], results[0][s])  # bit-identical everywhere


def test_allreduce_with_bf16(store):
    grads, results, errors = _run(store, 4, 5000, 2, codec="bf16")
    assert not errors, errors
    expect = grads[1].mean(axis=0)
    rel = np.linalg.norm(results[2][1] - expect) / np.linalg.norm(expect)
    assert rel < 1e-2


def test_old_steps_are_cleaned_up(store):
    _, _, errors = _run(store, 3, 300, 4)
    assert not errors
    left = store.list(sync_prefix("run", 0))
    # only the last step's objects remain (3 gradients + 3 averaged slices)
    assert len(left) == 6 and all("/000003/" in k for k in left)
    assert delete_prefix(store, sync_prefix("run", 0)) == 6
    assert store.list(sync_prefix("run", 0)) == []


def test_missing_worker_times_out_with_a_named_error(store):
    t0 = time.monotonic()
    # 2 s: long enough that a loaded machine has written the present workers' gradients (0.5 s was not)
    _, results, errors = _run(store, 3, 100, 1, timeout=2.0, absent=(2,))
    assert time.monotonic() - t0 < 10
    assert set(errors) == {0, 1} and not results
    assert all(isinstance(e, BarrierTimeout) for e in errors.values())
    assert "grad/00002" in str(errors[0])


def test_wait_get_returns_once_written(store):
    threading.Timer(0.2, lambda: store.put("late", b"here")).start()
    assert wait_get(store, "late", Poll(first=0.01, longest=0.05, timeout=5)) == b"here"
    with pytest.raises(BarrierTimeout):
        wait_get(store, "never", Poll(first=0.01, longest=0.05, timeout=0.2))


def test_duplicate_worker_is_harmless(store):
    """A retried worker writes the same keys again: first writer wins, results unchanged."""
    prefix = sync_prefix("run", 1)
    rng = np.random.default_rng(5)
    g = rng.standard_normal((2, 50)).astype(np.float32)
    out = {}

    def worker(i, tag):
        rs = ReduceScatter(store, prefix, 2, i, 50, poll=Poll(timeout=20), cleanup=False)
        out[(i, tag)] = rs.allreduce(0, g[i])

    ts = [threading.Thread(target=worker, args=a) for a in ((0, "a"), (1, "a"), (1, "dup"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    np.testing.assert_array_equal(out[(1, "dup")], out[(0, "a")])
    np.testing.assert_allclose(out[(0, "a")], g.mean(axis=0), rtol=1e-6)
