"""Sharded aggregation through the real state machine on the local engine: HowToAggregate →
AggregatePrepare → AggregateSlices (inline Map) → AggregateFinish, and the run still converges."""

import json
import statistics

from tests.e2e.test_local_run import digits_job, reconciled, run


def test_sharded_aggregation_converges_on_digits(local, tmp_path, monkeypatch):
    engine, names = local
    # Handler processes get the engine's base environment: lower plan_slices' thresholds so the
    # 51k-parameter MLP (203 KB) is reduced by several aggregators (one per 32 KB slice).
    monkeypatch.setitem(engine._base_env, "SMLT_AGGREGATOR_READ_BYTES", "1")
    monkeypatch.setitem(engine._base_env, "SMLT_MIN_SLICE_BYTES", "32768")
    job = digits_job(target_value=0.95)
    job["model"] = {"name": "mlp", "params": {"hidden": [256, 128]}}
    assert run(local, job, tmp_path / "sharded", "sharded") == 0

    metrics = json.loads((tmp_path / "sharded" / "metrics.json").read_text())
    final = metrics["final"]
    assert final["val_accuracy"] >= 0.95
    assert reconciled(local, "sharded") == []
    history = json.loads((tmp_path / "sharded" / "history.json").read_text())
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    assert {"HowToAggregate", "AggregatePrepare", "AggregateSlices", "AggregateSlice", "AggregateFinish"} <= set(
        entered
    )
    trained = [r for r in metrics["rounds"] if not r["eval_only"]]
    assert len(trained) >= 2  # round 0 (size unknown) single, then sharded
    slices = entered.count("AggregateSlice")
    assert slices == 6 * entered.count("AggregatePrepare")  # 203 KB / 32 KB → 6 aggregators a round

    # The same job with the single aggregator, for the record (aggregation seconds per round).
    monkeypatch.delitem(engine._base_env, "SMLT_AGGREGATOR_READ_BYTES")
    monkeypatch.delitem(engine._base_env, "SMLT_MIN_SLICE_BYTES")
    assert run(local, job, tmp_path / "single", "sharded-baseline") == 0
    base = json.loads((tmp_path / "single" / "metrics.json").read_text())
    base_history = json.loads((tmp_path / "single" / "history.json").read_text())
    assert not any(e.get("stateEnteredEventDetails", {}).get("name") == "AggregatePrepare" for e in base_history)
    sharded_s = statistics.median(r["aggregate_s"] for r in trained[1:])
    single_s = statistics.median(r["aggregate_s"] for r in base["rounds"][1:] if not r["eval_only"])
    print(
        f"\naggregate_s per round (median, rounds >= 1): single {single_s:.3f} s, "
        f"sharded x6 {sharded_s:.3f} s; rounds {len(trained)} vs "
        f"{sum(not r['eval_only'] for r in base['rounds'])}; "
        f"accuracy {final['val_accuracy']:.4f} vs {base['final']['val_accuracy']:.4f}"
    )
    assert base["final"]["val_accuracy"] >= 0.95
