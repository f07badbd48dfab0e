"""The workers' /tmp shard cache through the handlers: warm after the first round, and kept
under its cap (`SMLT_SHARD_CACHE_MB`). On moto."""

from pathlib import Path

import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.records import RunTable
from tests.functional.handlers.test_worker_shapes import image_job, quadrants  # noqa: F401  (a fixture)


def two_rounds(run):
    j = image_job(target_value=None, max_rounds=3)
    for rnd in range(2):
        p = planner({"op": "plan", "job": j, "execution": run}, None)
        assert p["round"] == rnd
        for w in p["workers"]:
            train_step({"run_id": run, "round": rnd, "worker": w}, None)
        aggregate({"run_id": run, "round": rnd}, None)
    table = RunTable("smlt-runs", run)
    return [[r.cache_miss for r in table.workers(rnd)] for rnd in range(2)]


@pytest.mark.parametrize("cap_mb, cached, misses", [(None, 6, [True, False]), ("0", 0, [True, True])])
def test_the_cache_warms_in_the_first_round_and_keeps_under_its_cap(
    quadrants,  # noqa: F811
    monkeypatch,
    tmp_path,
    cap_mb,
    cached,
    misses,
):
    cache = tmp_path / "shards"
    monkeypatch.setenv("SMLT_CACHE_DIR", str(cache))
    if cap_mb is not None:
        monkeypatch.setenv("SMLT_SHARD_CACHE_MB", cap_mb)
    rounds = two_rounds(f"cache-{cap_mb}")
    assert rounds == [[m] * 4 for m in misses]  # each worker, each round
    files = list(cache.glob("*.safetensors")) if cache.exists() else []
    assert len(files) == cached and not list(Path(cache).glob("*.tmp"))


def test_a_cached_shard_changed_on_disk_is_read_from_s3_again(quadrants, monkeypatch, tmp_path, caplog):  # noqa: F811
    """Issue #38: cached train shards with their labels shifted were trained on. Each read of
    a cached shard is checked against its sha256: the changed copies are evicted, the workers
    read the shards from S3 again and the cache holds the right bytes. (The worker record's
    `cache_miss` says whether the shards were cached when the worker started, so it stays False.)"""
    import hashlib

    import numpy as np
    from safetensors.numpy import load, save

    cache = tmp_path / "shards"
    monkeypatch.setenv("SMLT_CACHE_DIR", str(cache))
    run = "cache-poisoned"
    j = image_job(target_value=None, max_rounds=3)
    p = planner({"op": "plan", "job": j, "execution": run}, None)
    for w in p["workers"]:
        train_step({"run_id": run, "round": 0, "worker": w}, None)
    aggregate({"run_id": run, "round": 0}, None)
    files = sorted(cache.glob("*.safetensors"))
    assert files
    for path in files:  # labels shifted by one class, as the run had them
        arrays = load(path.read_bytes())
        arrays["y"] = ((arrays["y"] + 1) % 4).astype(arrays["y"].dtype)
        path.write_bytes(save(arrays))
        assert hashlib.sha256(path.read_bytes()).hexdigest() != path.stem
    p = planner({"op": "plan", "job": j, "execution": run}, None)
    assert p["round"] == 1
    for w in p["workers"]:
        train_step({"run_id": run, "round": 1, "worker": w}, None)
    aggregate({"run_id": run, "round": 1}, None)
    evicted = {r.getMessage().split()[2] for r in caplog.records if "does not match its sha256" in r.getMessage()}
    assert evicted == {str(p) for p in files}  # every changed copy, each read from S3 again
    for path in sorted(cache.glob("*.safetensors")):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.stem  # the right bytes again
    assert np.isfinite(RunTable("smlt-runs", run).rounds()[-1].train_loss)
