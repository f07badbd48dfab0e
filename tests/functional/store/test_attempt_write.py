"""The ATTEMPT item's write (smlt.runtime.ledger.Meter) outlasts a throttle longer than botocore's
8 attempts, on moto as a server (as the local engine runs it): an attempt whose item is lost is
priced at the function's timeout (`ledger.estimate_missing`)."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from smlt.local import conflicts
from smlt.local import server as moto_server
from smlt.runtime import clients, ledger
from smlt.runtime.records import RunTable, create_run_table


@pytest.fixture
def table(monkeypatch):
    server = moto_server.acquire()
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint_url)
        clients.reset()
        name = f"smlt-attempts-{uuid.uuid4().hex[:8]}"
        create_run_table(clients.client("dynamodb"), name)
        yield name
    finally:
        clients.reset()
        moto_server.release()


def throttle_first(n: int) -> list[int]:
    """Answer the ATTEMPT client's next `n` PutItems with DynamoDB's throttle (nothing stored)."""
    seen = [0]

    def answer(request, **_):
        seen[0] += 1
        return conflicts._dynamodb_throttled(request) if seen[0] <= n else None

    ledger._write_client().meta.events.register_first("before-send.dynamodb.PutItem", answer, unique_id="t")
    return seen


def context(remaining_s: float = 900.0):
    deadline = time.time() + remaining_s
    return SimpleNamespace(
        function_name="smlt-train-1769",
        memory_limit_in_mb="1769",
        aws_request_id=uuid.uuid4().hex,
        get_remaining_time_in_millis=lambda: int((deadline - time.time()) * 1000),
    )


def worker(event, ctx):
    return {"ok": True}


def test_the_attempt_item_outlasts_a_throttle_longer_than_botocores_attempts(table, monkeypatch):
    monkeypatch.setattr(ledger, "WRITE_BACKOFF_CAP_S", 0.05)  # fast; the loop is what is tested
    meter = ledger.Meter(time.time(), lambda: table)
    seen = throttle_first(12)  # botocore's adaptive mode gives up after 8
    t0 = time.time()
    assert meter(worker)({"run_id": "r", "round": 3, "worker": 1}, context()) == {"ok": True}
    spent = time.time() - t0
    assert seen[0] == 13  # 12 throttled, the 13th stored
    [item] = ledger.from_items(RunTable(table, "r").query(ledger.round_prefix(3)))
    assert (item.round, item.worker, item.estimated) == (3, 1, False)
    assert item.requests == {"dynamodb.PutItem": 1}  # the throttled tries are not billed
    assert 0 < item.duration_s <= spent + 0.1  # the throttled time is billed time


def test_a_throttle_that_does_not_let_up_is_given_up_within_the_patience(table, monkeypatch):
    monkeypatch.setattr(ledger, "WRITE_BACKOFF_CAP_S", 0.05)
    meter = ledger.Meter(time.time(), lambda: table)
    seen = throttle_first(10**6)
    t0 = time.time()
    # half the remaining 1 s: the invocation is never held to its timeout by its own ledger
    assert meter(worker)({"run_id": "r", "round": 4, "worker": 0}, context(remaining_s=1.0)) == {"ok": True}
    assert time.time() - t0 < 0.5 + 0.3
    assert seen[0] > 3
    assert RunTable(table, "r").query(ledger.round_prefix(4)) == []
    assert ledger._patience_s(context(remaining_s=3600)) == ledger.WRITE_PATIENCE_S
    assert ledger._patience_s(SimpleNamespace()) == ledger.WRITE_PATIENCE_S
