"""Per-step synchronous mode (training.mode = "sync") end to end: the synthesized state machine
on the local engine, two workers that exchange their gradients at every step (reduce-scatter,
smlt.runtime.exchange.ReduceScatter) through S3 (the artifacts bucket) or through a real
redis-server (SMLT_EXCHANGE_URL)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smlt.datasets import stage_dataset
from smlt.runtime import keys
from smlt.runtime.records import RunTable
from smlt.runtime.store import RedisStore, S3Store
from smlt.runtime.tensors.format import decode
from tests.e2e.test_local_run import digits_job, reconciled, run
from tests.functional.store._fixtures import redis_server  # noqa: F401  (a real redis-server, session-wide)

WORKERS, STEPS, ROUNDS = 2, 10, 3
# Measured: 0.7855 (deterministic: the same seed gives the same model whatever the store).
# Chance is 0.10.
MIN_ACCURACY = 0.65


def sync_job():
    job = digits_job(mode="sync", max_rounds=ROUNDS, target_value=None, local_steps=STEPS)
    job["workers"].update(initial=WORKERS, min=1, max=WORKERS)
    return job


def execute(local, job, run_id):
    """The execution alone, without the CLI's per-round snapshots (`run` / smlt.runner.execute):
    those race with the S3 exchange (see test_snapshot_skips_the_sync_exchange). The final
    metrics."""
    engine, names = local
    job = {
        **job,
        "dataset": {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))},
    }
    desc = engine.wait(engine.start_execution(job, name=run_id), interval=0.5, timeout=300)
    assert desc["status"] == "SUCCEEDED", desc
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    return json.loads(art.get(keys.final_metrics_key(run_id)))


def run_sync(local, out, run_id, cli=False):
    """Run the sync job, tracing every invocation: (final metrics, trace of the Train
    invocations). cli: through smlt.runner.execute, as `smlt run --local` does."""
    engine, names = local
    trace = engine.start_trace()
    try:
        if cli:
            assert run(local, sync_job(), out, run_id) == 0
            metrics = json.loads((out / "metrics.json").read_text())
        else:
            metrics = execute(local, sync_job(), run_id)
    finally:
        engine.stop_trace()
    return metrics, [t for t in trace if t["function"] in names.train_functions]


def s3_calls(trace, op):
    return [t["api"].get(f"s3.{op}", (0, 0.0))[0] for t in trace]


def check_rounds(local, run_id, metrics):
    """ROUNDS training rounds of WORKERS workers, each worker taking all STEPS steps, every update
    accepted; then the final evaluation."""
    engine, names = local
    rounds = metrics["rounds"]
    assert [r["eval_only"] for r in rounds] == [False] * ROUNDS + [True]
    assert metrics["final"]["rounds"] == ROUNDS
    assert reconciled(local, run_id) == []
    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    for r in rounds[:ROUNDS]:
        assert r["workers"] == WORKERS and r["workers_ok"] == WORKERS, r
        assert sorted(a["worker"] for a in r["accepted"]) == list(range(WORKERS))
        records = table.workers(r["round"])
        assert [w.steps for w in records] == [STEPS] * WORKERS, r["round"]
        assert [w.samples for w in records] == [STEPS * 32] * WORKERS


@pytest.fixture(scope="module")
def s3_run(local, tmp_path_factory):
    """The sync job with the default exchange (the artifacts bucket), run once for the tests
    below as `smlt run --local` runs it (per-round snapshots included): (run id, final metrics,
    trace of the Train invocations)."""
    run_id = "sync-s3"
    metrics, trace = run_sync(local, tmp_path_factory.mktemp("sync-s3"), run_id, cli=True)
    return run_id, metrics, trace


def test_sync_mode_through_s3(local, s3_run):
    engine, names = local
    run_id, metrics, trace = s3_run
    check_rounds(local, run_id, metrics)
    acc = metrics["final"]["val_accuracy"]
    print(f"\nsync mode (S3 exchange): {ROUNDS} rounds x {WORKERS} workers x {STEPS} steps, val accuracy {acc:.4f}")
    assert acc >= MIN_ACCURACY

    # The exchange went through S3: per step a worker writes its gradient and its averaged
    # slice (plus its update once a round, and round 0's initial model) and, from step 1 on,
    # deletes its two objects of the step before...
    assert len(trace) == ROUNDS * WORKERS + WORKERS  # + the evaluation round
    train = sorted(trace, key=lambda t: t["start"])[: ROUNDS * WORKERS]
    assert all(n >= 2 * STEPS + 1 for n in s3_calls(train, "PutObject")), s3_calls(train, "PutObject")
    assert all(n >= 2 * (STEPS - 1) for n in s3_calls(train, "DeleteObject")), s3_calls(train, "DeleteObject")
    # ...and the aggregator deletes the last step's: nothing is left under any round's sync prefix.
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    assert any("/updates/" in k for k in art.list(keys.run_prefix(run_id)))  # the listing sees round objects
    for r in range(ROUNDS + 1):
        assert art.list(keys.sync_prefix(run_id, r)) == [], r


def test_sync_workers_end_each_round_with_the_same_model(local, s3_run):
    """The mode really is synchronous: the two workers draw different batches (different training
    losses), yet step with the same averaged gradient from the same model, so they end the round
    with the same model: their updates are bit-identical, and the aggregated model is the
    round's model plus either update."""
    engine, names = local
    run_id, _, _ = s3_run
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    for rnd in range(ROUNDS):
        losses = [w.train_loss for w in table.workers(rnd)]
        assert len(set(losses)) == WORKERS, losses  # different data on each worker
        ups = [decode(art.get(keys.update_key(run_id, rnd, w))) for w in range(WORKERS)]
        before = decode(art.get(keys.model_key(run_id, rnd)))
        after = decode(art.get(keys.model_key(run_id, rnd + 1)))
        assert ups[0].keys() == after.keys()
        for name in ups[0]:
            for u in ups[1:]:
                np.testing.assert_array_equal(u[name], ups[0][name], err_msg=f"round {rnd} {name}")
            np.testing.assert_allclose(after[name], before[name] + ups[0][name], rtol=0, atol=1e-6)


def test_sync_mode_through_redis(local, s3_run, tmp_path, monkeypatch, redis_server):  # noqa: F811
    engine, names = local
    run_id = "sync-redis"
    redis = RedisStore(redis_server.url)
    redis.client.flushdb()
    before = redis.client.info("commandstats").get("cmdstat_set", {}).get("calls", 0)
    # Handler processes get the engine's base environment (smlt.local.engine.runtime_env).
    monkeypatch.setitem(engine._base_env, "SMLT_EXCHANGE_URL", redis_server.url)
    metrics, trace = run_sync(local, tmp_path, run_id, cli=True)
    check_rounds(local, run_id, metrics)
    acc = metrics["final"]["val_accuracy"]
    print(f"\nsync mode (Redis exchange): val accuracy {acc:.4f}")
    assert acc >= MIN_ACCURACY

    # The exchange went through Redis: 2 SETs per worker per step...
    sets = redis.client.info("commandstats").get("cmdstat_set", {}).get("calls", 0) - before
    assert sets >= ROUNDS * WORKERS * 2 * STEPS, sets
    # ...all deleted after each round...
    assert redis.list(keys.run_prefix(run_id)) == []
    # ...and none of it went to S3: a worker writes only its update (and round 0's model).
    assert max(s3_calls(trace, "PutObject")) <= 2
    assert sum(s3_calls(trace, "DeleteObject")) == 0
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    assert not any("/sync/" in k for k in art.list(keys.run_prefix(run_id)))
    # The store changes nothing in the arithmetic: the same final model as through S3, bit for bit.
    via_s3 = decode(art.get(keys.final_model_key(s3_run[0])))
    via_redis = decode(art.get(keys.final_model_key(run_id)))
    assert via_s3.keys() == via_redis.keys()
    for name in via_s3:
        np.testing.assert_array_equal(via_redis[name], via_s3[name], err_msg=name)


def test_snapshot_skips_the_sync_exchange(local, tmp_path, monkeypatch):
    """The per-round snapshot of `smlt run --local` (smlt.runner.Follower.poll) while a sync round
    runs: a worker deletes its previous step's exchange objects between the snapshot's listing
    and its copy. Seen in a real run: NotFound for
    runs/sync-s3/rounds/000001/sync/000002/avg/00000.safetensors."""
    from smlt.snapshot import Snapshot

    engine, names = local
    run_id = "sync-snapshot"
    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    table.put_once(keys.META, {"run_id": run_id, "job": {"dataset": {"uri": f"s3://{names.data_bucket}/none/"}}})
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    art.put(keys.job_key(run_id), b"{}")
    old = keys.sync_prefix(run_id, 0) + "000001/grad/00000.safetensors"
    new = keys.sync_prefix(run_id, 0) + "000002/grad/00000.safetensors"
    for key in (old, new):
        art.put(key, b"gradient")

    class CleanedUpMeanwhile(S3Store):
        def list(self, prefix, start_after=None):
            listed = super().list(prefix, start_after)
            if self.bucket == names.artifacts_bucket and self.exists(old):
                self.delete(old)  # the worker finished step 2: step 1's objects go
            return listed

    monkeypatch.setattr("smlt.snapshot.S3Store", CleanedUpMeanwhile)
    Snapshot(engine, names, run_id, tmp_path).save()
    folder = tmp_path / "s3" / names.artifacts_bucket
    copied = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert copied == [keys.job_key(run_id)]  # the exchange is transient: not part of a snapshot
