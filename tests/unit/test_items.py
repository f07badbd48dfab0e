"""The DynamoDB item models (smlt/runtime/items.py) as RunTable stores and reads them: the attribute
names stay, None is not stored, numbers come back as int or float, the round spec is JSON text."""

import pytest

from smlt.runtime import keys
from smlt.runtime.items import MetaItem, PlanItem, RoundItem, RoundTiming, WorkerItem
from smlt.runtime.job import parse_job
from smlt.runtime.records import RunTable, from_item, to_item
from smlt.runtime.roundspec import RoundSpec


def stored(item, sk="X"):
    """What a read returns after the item was written (RunTable.put_once's attributes)."""
    return from_item(to_item({"pk": "RUN#r", "sk": sk, **item.attrs()}))


def job():
    return parse_job({"name": "t", "dataset": {"uri": "s3://data/d/"}})


def worker(**kw):
    fields = dict(worker=1, samples=64, train_loss=0.5, memory_mb=1769, load_s=0.2, eval_s=7.31e-7, total_s=1.5)
    return WorkerItem(**{**fields, **kw})


def test_an_item_reads_back_as_it_was_written():
    w = worker()
    raw = stored(w, keys.worker_sk(0, 1))
    assert raw["eval_s"] == 7.31e-7 and type(raw["memory_mb"]) is int  # exponent form, as a number
    assert WorkerItem.model_validate(raw) == w


def test_none_is_not_stored_and_reads_back_as_none():
    raw = stored(worker(train_loss=None, finite=False))
    assert "train_loss" not in raw and raw["finite"] is False
    assert WorkerItem.model_validate(raw).train_loss is None


def test_numbers_validate_as_dynamodb_returns_them():
    # An integral number may come back as a float ("1769.0", "1E+3") and a float as an int.
    raw = {
        "pk": "RUN#r",
        "sk": keys.round_sk(2),
        "round": 2.0,
        "workers": 4,
        "memory_mb": 1e3,
        "local_steps": 5,
        "batch_size": 32,
        "round_s": 3,
        "cost_usd": 0,
        "accepted": [{"worker": 0.0, "samples": 64}],
    }
    r = RoundItem.model_validate(raw)
    assert (r.round, r.memory_mb, r.accepted[0].worker) == (2, 1000, 0)
    assert type(r.round_s) is float and r.round_s == 3.0
    with pytest.raises(ValueError, match="workers"):
        RoundItem.model_validate({**raw, "workers": 2.5})


def test_the_plans_spec_is_stored_as_its_json_text():
    spec = RoundSpec(
        run_id="r",
        round=0,
        workers=2,
        memory_mb=1769,
        local_steps=5,
        function_name="f",
        planned_at=1.0,
        learning_rate=0.1,
        job=job(),
    )
    plan = PlanItem(run_id="r", round=0, action="train", reason="", planned_at=1.0, execution="e", spec=spec)
    raw = stored(plan, keys.plan_sk(0))
    assert isinstance(raw["spec"], str) and RoundSpec.model_validate_json(raw["spec"]) == spec
    assert PlanItem.model_validate(raw).spec == spec
    stop = stored(PlanItem(run_id="r", round=1, action="stop", reason="done", planned_at=1.0, execution="e"))
    assert not {"spec", "workers", "function_name", "stop_reason"} & set(stop)  # a stop plan has none


def meta_item():
    return MetaItem(
        run_id="r",
        execution="e",
        job=job(),
        status="RUNNING",
        created_at=1.0,
        train_rows=10,
        train_shards=2,
        features=4,
        outputs=3,
        task="classification",
    )


def test_meta_stores_the_whole_job():
    raw = stored(meta_item(), keys.META)
    assert raw["job"] == job().model_dump(mode="json")  # None fields included: chain restarts from it
    assert MetaItem.model_validate(raw).job == job()


def test_a_round_keeps_the_timing_fields_of_each_record():
    w = worker(cold=True, cache_miss=True, finished_at=5.0, update_bytes=100)
    t = RoundTiming.of(w)
    assert t.model_dump() == {k: getattr(w, k, None) for k in RoundTiming.model_fields}
    assert t.error is None  # a worker that reported (only a failed one without a record has an error)
    assert (t.cold, t.cache_miss, t.eval_s) == (True, True, 7.31e-7)


def test_update_takes_fields_of_the_model_only():
    table = RunTable("t", "r", client=object())  # refused before any request
    with pytest.raises(TypeError, match="MetaItem has no field lr_scal"):
        table.update(keys.META, MetaItem, lr_scal=0.5)
    with pytest.raises(ValueError, match="lr_scale"):
        table.update(keys.META, MetaItem, lr_scale="half")


def test_a_forecast_of_never_is_stored_as_unknown():
    # The adaptive planner's ETA is infinite when the curve saturates below the target; the PLAN
    # write failed on it ("Out of range float values are not JSON compliant: inf") and ended the run.
    p = PlanItem(
        run_id="r", round=5, action="train", reason="r", planned_at=1.0, execution="e",
        eta_rounds=float("inf"), eta_s=float("nan"), eta_cost_usd=0.25,
    )  # fmt: skip
    raw = stored(p, keys.plan_sk(5))
    assert "eta_rounds" not in raw and "eta_s" not in raw and raw["eta_cost_usd"] == 0.25
    assert PlanItem.model_validate(raw).eta_rounds is None


def test_a_plan_keeps_the_planner_s_rule_and_an_older_plan_reads_without_it():
    p = PlanItem(
        run_id="r", round=3, action="train", reason="r", planned_at=1.0, execution="e",
        rule="feasible", notes=["averaging_stalled"], stop_rule="max_rounds",
    )  # fmt: skip
    raw = stored(p, keys.plan_sk(3))
    assert (raw["rule"], raw["notes"], raw["stop_rule"]) == ("feasible", ["averaging_stalled"], "max_rounds")
    assert PlanItem.model_validate(raw) == p
    old = stored(PlanItem(run_id="r", round=3, action="stop", reason="done", planned_at=1.0, execution="e"))
    for field in ("rule", "notes", "stop_rule"):
        old.pop(field, None)  # written before the planner recorded its rule
    back = PlanItem.model_validate(old)
    assert (back.rule, back.notes, back.stop_rule) == (None, [], None)
