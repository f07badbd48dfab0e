"""The ledger's rules (smlt.runtime.ledger, smlt.runtime.bill): what a request is billed at, the corrections of
the ATTEMPT items' write estimates, estimated crashes, transitions of retries, the worst case."""

from __future__ import annotations

import pytest

from smlt.runtime import bill, ledger
from smlt.runtime.prices import Prices


def attempt(**kw):
    base = dict(function="f", memory_mb=1024, duration_s=1.0)
    return ledger.AttemptItem(**{**base, **kw})


def test_s3_operations_are_billed_at_their_tier():
    assert [bill.s3_tier(op) for op in ("PutObject", "CopyObject", "ListObjectsV2", "PutObjectTagging")] == ["put"] * 4
    assert [bill.s3_tier(op) for op in ("GetObject", "HeadObject")] == ["get"] * 2
    assert bill.s3_tier("DeleteObjects") == "free"


def test_dynamodb_units_by_size_and_transactions_twice():
    assert bill.dynamodb_units("PutItem", 300, 1, 0) == (1.0, 0.0)
    assert bill.dynamodb_units("PutItem", 2100, 1, 0) == (3.0, 0.0)  # per KB, rounded up
    assert bill.dynamodb_units("TransactWriteItems", 1500, 2, 0) == (4.0, 0.0)  # 2 items, twice
    assert bill.dynamodb_units("BatchGetItem", 0, 3, 5000) == (0.0, 3.0)  # one per item at least
    assert bill.dynamodb_units("Query", 0, 2, 9000) == (0.0, 3.0)  # per 4 KB read
    assert bill.dynamodb_units("DescribeTable", 100, 0, 100) == (0.0, 0.0)


def test_an_attempt_is_billed_to_the_ms_with_its_init():
    a = attempt(memory_mb=2048, init_s=0.5, duration_s=0.1234)
    assert a.billed_s == pytest.approx(0.624)
    assert a.gb_s == pytest.approx(2 * 0.624)


def test_the_next_item_of_a_process_corrects_the_write_estimate():
    raw = [
        {**attempt(request_id="a", duration_s=1.0).model_dump(), "sk": "ATTEMPT#000000#a#1"},
        {
            **attempt(request_id="b", duration_s=2.0, corrects="ATTEMPT#000000#a#1", correction_s=0.25).model_dump(),
            "sk": "ATTEMPT#000001#b#1",
        },
    ]
    a, b = ledger.from_items(raw)
    assert (a.duration_s, b.duration_s) == (1.25, 2.0)
    assert a.key == "ATTEMPT#000000#a#1"


def test_one_slow_write_does_not_become_the_next_estimate(monkeypatch):
    monkeypatch.setattr(ledger, "_WRITES", ledger.deque(maxlen=ledger.WRITE_WINDOW))
    assert ledger.write_estimate() == ledger.WRITE_PRIOR_S  # before the process measured one
    for i, took in enumerate([0.004, 0.006, 0.005, 0.250]):  # the last one on a starved host
        ledger._written("run", f"k{i}", took, ledger.write_estimate())
    assert ledger.write_estimate() == pytest.approx(0.0055)  # the median, not the 250 ms outlier
    assert ledger._LAST.error_s == pytest.approx(0.250 - 0.005)  # its own item is still corrected exactly


def test_a_worker_that_left_no_item_is_estimated():
    seen = [attempt(worker=0, duration_s=3.0), attempt(worker=2, duration_s=1.0)]
    outcomes = [{"worker": 1, "ok": False, "error": "Sandbox.Timedout"}, {"worker": 3, "ok": False, "error": "X"}]
    est = {e.worker: e for e in ledger.estimate_missing(4, 1769, 5, seen, outcomes, timeout_s=900)}
    assert sorted(est) == [1, 3]
    assert est[1].duration_s == 900  # a time-out is billed its timeout
    assert est[3].duration_s == 3.0  # a crash: the longest attempt of the round
    assert all(e.estimated and e.round == 5 and e.memory_mb == 1769 for e in est.values())


def test_a_stragglers_late_item_replaces_its_estimate():
    """A worker the Map abandoned (`States.Timeout`) is estimated at the function's timeout when its
    round is priced; the item it writes when it ends replaces that estimate (seen with
    `--faults ddb_throttle=0.6,seed=2`: a 65 s straggler billed as 900 s + 65 s)."""
    seen = [attempt(worker=0, round=3, duration_s=6.0)]
    outcomes = [{"worker": 1, "ok": False, "error": "States.Timeout"}]
    [est] = ledger.estimate_missing(2, 1769, 3, seen, outcomes, timeout_s=900)
    raw = [{**a.model_dump(), "sk": f"ATTEMPT#000003#{a.request_id or 'w0'}"} for a in [*seen, est]]
    assert [a.duration_s for a in ledger.from_items(raw)] == [6.0, 900.0]  # before the straggler ends
    late = attempt(
        worker=1, round=3, duration_s=65.0, request_id="late", outcome="ProvisionedThroughputExceededException"
    )
    raw.append({**late.model_dump(), "sk": "ATTEMPT#000003#late#1"})
    assert [a.duration_s for a in ledger.from_items(raw)] == [6.0, 65.0]
    other_round = {**est.model_dump(), "round": 4, "sk": "ATTEMPT#000004#estimated-4-1"}
    assert [a.estimated for a in ledger.from_items([*raw, other_round])] == [False, False, True]


def shape(n):
    return bill.RoundShape(workers=n, worker_gb_s=0.0, planner_memory_mb=1024, aggregate_memory_mb=3008)


def test_a_retry_bills_a_transition_a_duplicate_does_not():
    base = float(bill.requests(shape(2)).transitions)
    plan = attempt(op="plan")
    once = [plan, attempt(worker=0, request_id="r0"), attempt(worker=1, request_id="r1")]
    assert ledger.round_transitions(once, shape(2)) == base
    duplicate = [*once, attempt(worker=1, request_id="r1")]
    assert ledger.round_transitions(duplicate, shape(2)) == base
    retried = [*once, attempt(worker=1, request_id="r1-again")]
    assert ledger.round_transitions(retried, shape(2)) == base + 1
    # a quorum retry: the round planned and run twice
    again = [*retried, plan, attempt(worker=0, request_id="s0"), attempt(worker=1, request_id="s1")]
    assert ledger.round_transitions(again, shape(2)) == 2 * base + 1


def test_the_breakdown_adds_up_and_counts_requests_by_tier():
    prices = Prices()
    a = attempt(
        init_s=0.2,
        requests={"s3.PutObject": 2, "s3.GetObject": 3, "s3.DeleteObjects": 1, "dynamodb.PutItem": 1},
        dynamodb_write_units=1.0,
    )
    bd = ledger.breakdown([a, attempt()], 7.0, prices, "x86_64")
    assert (bd.lambda_invocations, bd.s3_puts, bd.s3_gets, bd.dynamodb_requests) == (2, 2, 3, 1)
    assert bd.lambda_gb_s == pytest.approx(2.2) and bd.lambda_init_gb_s == pytest.approx(0.2)
    parts = bd.lambda_usd + bd.sfn_usd + bd.s3_usd + bd.dynamodb_usd + bd.logs_usd + bd.xray_usd
    assert bd.total_usd == pytest.approx(parts)
    assert bd.xray_usd == pytest.approx(2 * prices.xray_trace) and bd.logs_usd > 0


def test_the_worst_case_bills_retries_and_the_exchange():
    prices, plain = Prices(), dict(workers=8, worker_gb_s=10.0, planner_memory_mb=1024, aggregate_memory_mb=3008)
    base = bill.price(bill.RoundShape(**plain), prices, "x86_64")
    retried = bill.price(bill.RoundShape(**plain, retries=2), prices, "x86_64")
    assert retried.requests.lambda_invocations == base.requests.lambda_invocations + 2
    assert retried.usd > base.usd
    sync = bill.price(bill.RoundShape(**plain, exchange_steps=100), prices, "x86_64")
    # 2 PUTs and 2n GETs per worker per step, and the polls: over $0.013 at 8 workers, 100 steps
    assert sync.requests.s3_puts - base.requests.s3_puts == 8 * 100 * 2 + 1
    assert sync.requests.s3_gets - base.requests.s3_gets >= 8 * 100 * 2 * 8
    assert sync.usd - base.usd > 0.013
    assert float(bill.retry_allowance(8)) == 2 and float(bill.retry_allowance(1)) == 1


def test_the_planners_worst_case_includes_them():
    from smlt.runtime.planner.timing import JobShape, TimingModel
    from smlt.runtime.planner.types import RunHistory

    def ub(mode):
        shape = JobShape.of(RunHistory(), 32, mode=mode)
        tm = TimingModel(shape, Prices(), "x86_64")
        return float(tm.forecast([8], [1769], [100], RunHistory()).cost_ub[0])

    assert ub("sync") > ub("local_sgd") + 0.013


def test_a_throttled_request_is_taken_back_and_its_retry_counted(monkeypatch):
    """AWS bills no S3 5xx (503 SlowDown) and no DynamoDB throttle; every other answer, a 4xx
    of S3 (409, 412) or a DynamoDB condition failure included, is billed."""
    import json
    from types import SimpleNamespace

    tally = ledger._Tally()
    monkeypatch.setattr(ledger, "_TALLY", tally)
    put = SimpleNamespace(body=json.dumps({"TableName": "t", "Item": {"pk": {"S": "x"}}}).encode())
    throttled = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"})
    refused = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"})
    for status, body in ((400, throttled), (400, refused), (200, "{}")):
        ledger._on_send(put, event_name="before-send.dynamodb.PutItem")
        ledger._on_answer({"status_code": status, "body": body.encode()}, event_name="before-parse.dynamodb.PutItem")
    assert tally.requests == {"dynamodb.PutItem": 2} and tally.write_units == 2.0
    for status in (503, 409, 200):
        ledger._on_send(SimpleNamespace(body=b""), event_name="before-send.s3.PutObject")
        ledger._on_answer({"status_code": status, "body": b"<Error/>"}, event_name="before-parse.s3.PutObject")
    assert tally.requests["s3.PutObject"] == 2
    # an answer with nothing sent on this thread takes nothing back
    ledger._on_answer({"status_code": 503, "body": b""}, event_name="before-parse.s3.GetObject")
    assert tally.requests["s3.PutObject"] == 2


def test_the_rounds_trained_into_a_model_are_the_rounds_before_it_that_applied_updates():
    from types import SimpleNamespace as R

    one = [ledger.trained(R(round=0, eval_only=False, diverged=False, accepted=[]))]  # every update failed
    rounds = [
        R(round=0, eval_only=False, diverged=False, accepted=["w0"]),
        R(round=1, eval_only=False, diverged=True, accepted=[]),  # model 1 carried over as model 2
        R(round=2, eval_only=False, diverged=False, accepted=["w0", "w1"]),
        R(round=3, eval_only=False, diverged=False, accepted=["w0"]),  # trains model 4, never measured
        R(round=4, eval_only=True, diverged=False, accepted=[]),
    ]
    assert one == [False]
    assert [ledger.rounds_in_model(rounds, m) for m in (None, 0, 1, 3, 4, 5)] == [0, 0, 1, 2, 3, 3]
    assert ledger.rounds_said(5, 3) == "5 rounds (3 trained into the final model)"
    assert ledger.rounds_said(1, 1) == "1 round"


def test_a_rounds_estimate_is_shown_as_one_and_as_settled_once_its_workers_item_replaces_it():
    prices = Prices()
    done = {"sk": "ATTEMPT#000003#a#1", "function": "f", "memory_mb": 1769, "round": 3, "worker": 0, "duration_s": 7.0}
    outcomes = [{"worker": 1, "ok": False, "error": "States.Timeout"}]
    (estimate,) = ledger.estimate_missing(2, 1769, 3, [ledger.AttemptItem(**done)], outcomes, 900)
    abandoned = {"sk": "ATTEMPT#000003#estimated-3-1", **estimate.attrs()}
    note = ledger.estimate_note([done, abandoned], prices, "x86_64")
    usd = ledger.breakdown([estimate], 0, prices, "x86_64").total_usd
    assert usd > 0.025 and note == (
        f"of it ${usd:.5f} estimated (worker 1 abandoned at its time limit, priced at the function's 900 s timeout "
        "until its own item replaces it)"
    )
    # the straggler's own item, when it ends, replaces the estimate: a line printed after says so
    late = {**done, "sk": "ATTEMPT#000003#b#1", "worker": 1, "duration_s": 65.0, "outcome": "StaleInvocation"}
    assert [a.worker for a in ledger.from_items([done, abandoned, late]) if a.estimated] == []
    assert ledger.estimate_note([done, abandoned, late], prices, "x86_64").endswith(
        "900 s timeout: its own item has replaced the estimate since, the next round's total corrects it)"
    )
    assert ledger.estimate_note([done], prices, "x86_64") == ""
