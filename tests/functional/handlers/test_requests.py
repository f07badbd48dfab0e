"""The AWS requests a round makes, counted on moto: each one is a billed request on AWS and most
of a short round's time on the local engine, so the counts are kept from creeping back up."""

from collections import Counter

import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import clients, keys
from smlt.runtime.records import RunTable, dynamodb_client
from smlt.runtime.store.s3 import s3_client
from tests.functional.handlers.conftest import job


@pytest.fixture
def calls(aws):
    """A Counter of the requests made through smlt's clients ("s3.GetObject", ...)."""
    seen: Counter = Counter()

    def count(model, **_):
        seen[f"{model.service_model.endpoint_prefix}.{model.name}"] += 1

    # the ledger's ATTEMPT writes go through their own client (smlt.runtime.ledger)
    for client in (s3_client(), dynamodb_client(), clients.unretried("dynamodb")):
        client.meta.events.register("before-call.*.*", count)
    return seen


def steps(calls, fn, *events):
    """Run fn on each event; the requests it made, all together."""
    calls.clear()
    for e in events:
        fn(e, None)
    out = Counter(calls)
    calls.clear()
    return out


def test_requests_per_round(digits, calls):
    j = job(digits, max_rounds=4, target_value=None, local_steps=2)
    run = "req"
    p = planner({"op": "plan", "job": j, "execution": run}, None)
    for rnd in range(3):
        assert p["round"] == rnd and p["action"] == "train"
        n = len(p["workers"])
        workers = steps(calls, train_step, *({"run_id": run, "round": rnd, "worker": w} for w in p["workers"]))
        agg = steps(calls, aggregate, {"run_id": run, "round": rnd})
        calls.clear()
        p = planner({"op": "plan", "job": j, "execution": run}, None)
        plan = Counter(calls)
        if rnd == 0:
            continue  # round 0 also writes the initial model and warms the caches
        # Each worker: one BatchGetItem (seal, own record, plan), its update, its record, its
        # ATTEMPT item (smlt.runtime.ledger); the global model is read once per process for the whole round.
        assert workers == Counter(
            {
                "dynamodb.BatchGetItem": n,
                "s3.PutObject": n,
                "dynamodb.TransactWriteItems": n,
                "dynamodb.PutItem": n,
                "s3.GetObject": 1,
            }
        ), workers
        # The aggregator: one BatchGetItem, the records, the seal, model r, each (small) update
        # whole in one GET, model r+1, the ROUND item; the ledger's Query of this round's and the
        # last round's ATTEMPT items, and its own ATTEMPT item.
        assert agg == Counter(
            {
                "dynamodb.BatchGetItem": 1,
                "dynamodb.Query": 3,
                "dynamodb.PutItem": 3,
                "s3.GetObject": 1 + n,
                "s3.PutObject": 1,
            }
        ), agg
        # The planner: the new ROUND items only, then META and two PLAN items at once, its plan,
        # its ATTEMPT item.
        assert plan == Counter({"dynamodb.Query": 1, "dynamodb.BatchGetItem": 1, "dynamodb.PutItem": 2}), plan


def test_planner_reads_only_new_rounds_and_forgets_a_recreated_run(digits, aws):
    from smlt.runtime.steps import plan as control

    j = job(digits, max_rounds=5, target_value=None, local_steps=2)

    def one_round(execution):
        p = planner({"op": "plan", "job": j, "execution": execution}, None)
        for w in p["workers"]:
            train_step({"run_id": p["run_id"], "round": p["round"], "worker": w}, None)
        aggregate({"run_id": p["run_id"], "round": p["round"]}, None)
        return p

    one_round("again"), one_round("again")
    assert planner({"op": "plan", "job": j, "execution": "again"}, None)["round"] == 2
    seen = control._rounds_seen[("smlt-runs", "again")]
    assert [r.round for r in seen.rounds] == [r.round for r in seen.records] == [0, 1]
    # The run is deleted and started again under the same id: the cached rounds are not its.
    table = RunTable("smlt-runs", "again")
    for item in table.query(""):
        table.client.delete_item(TableName="smlt-runs", Key={"pk": {"S": item["pk"]}, "sk": {"S": item["sk"]}})
    assert planner({"op": "plan", "job": j, "execution": "again"}, None)["round"] == 0
    again = control._rounds_seen.get(("smlt-runs", "again"))
    assert again is None or again.created != seen.created


def test_planner_converts_each_round_once(digits, aws, monkeypatch):
    """The planner's view of a round is made once per process, not at every plan: converting the
    whole history each time made a 1,000-round run's plans grow ~10 ms slower (bench/long_run.py)."""
    from smlt.runtime.steps import plan as control

    converted: Counter = Counter()
    to_record = control._record

    def counted(r):
        converted[r.round] += 1
        return to_record(r)

    monkeypatch.setattr(control, "_record", counted)
    j = job(digits, max_rounds=6, target_value=None, local_steps=1)
    for _ in range(4):
        p = planner({"op": "plan", "job": j, "execution": "once"}, None)
        for w in p["workers"]:
            train_step({"run_id": p["run_id"], "round": p["round"], "worker": w}, None)
        aggregate({"run_id": p["run_id"], "round": p["round"]}, None)
    assert planner({"op": "plan", "job": j, "execution": "once"}, None)["round"] == 4
    assert converted == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    seen = control._rounds_seen[("smlt-runs", "once")]
    assert seen.records == [to_record(r) for r in seen.rounds]  # the same view as a fresh conversion


def test_get_many_reads_several_items_at_once(aws):
    table = RunTable("smlt-runs", "many")
    table.put_once("A", {"v": 1})
    table.put_once("B", {"v": 2})
    got = table.get_many("A", "missing", "B", "A")
    assert list(got) == ["A", "missing", "B"]
    assert got["A"]["v"] == 1 and got["B"]["v"] == 2 and got["missing"] is None


def test_get_many_takes_more_than_a_batch(aws):
    table = RunTable("smlt-runs", "lots")
    for i in range(0, 230, 3):
        table.put_once(f"K#{i:04d}", {"i": i})
    got = table.get_many(*(f"K#{i:04d}" for i in range(230)))  # three BatchGetItem calls
    assert [k for k, v in got.items() if v is not None] == [f"K#{i:04d}" for i in range(0, 230, 3)]


def test_planner_keeps_the_rounds_of_recent_runs_only(digits, monkeypatch):
    from smlt.runtime.steps import plan as control

    monkeypatch.setattr(control, "MAX_RUNS_SEEN", 1)
    monkeypatch.setattr(control, "_rounds_seen", {})
    j = job(digits, max_rounds=5, target_value=None, local_steps=1)
    for run in ("first", "second"):
        p = planner({"op": "plan", "job": j, "execution": run}, None)
        for w in p["workers"]:
            train_step({"run_id": run, "round": 0, "worker": w}, None)
        aggregate({"run_id": run, "round": 0}, None)
        assert planner({"op": "plan", "job": j, "execution": run}, None)["round"] == 1
    assert list(control._rounds_seen) == [("smlt-runs", "second")]


def test_item_sizes_behind_the_dynamodb_price_estimate(digits):
    """smlt.runtime.bill.requests assumes a worker record of <= 1 KB, a ROUND item of <= 1 KB +
    0.3 KB per worker and a PLAN item of <= 4 KB; the items a round writes keep to that
    (measured as plain JSON: names and values, as DynamoDB sizes an item)."""
    import json

    j = job(digits, max_rounds=2, target_value=None, local_steps=1)
    p = planner({"op": "plan", "job": j, "execution": "sizes"}, None)
    for w in p["workers"]:
        train_step({"run_id": "sizes", "round": 0, "worker": w}, None)
    aggregate({"run_id": "sizes", "round": 0}, None)
    table, n = RunTable("smlt-runs", "sizes"), len(p["workers"])
    kb = lambda item: len(json.dumps(item, default=float)) / 1024  # noqa: E731
    stored = table.get_many(keys.round_sk(0), keys.plan_sk(0))  # as stored, keys included
    assert max(kb(r) for r in table.query(keys.worker_prefix(0))) <= 1.0
    assert kb(stored[keys.round_sk(0)]) <= 1.0 + 0.3 * n  # smlt.runtime.bill.requests: 1 + 0.3 r write units
    assert kb(stored[keys.plan_sk(0)]) <= 4.0
