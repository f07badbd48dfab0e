"""AWS's write conflicts (which moto never answers), injected on moto the way the local engine
injects them in its handler processes (smlt/local/conflicts.py): the stores and the run table
retry them, and a conflict is never taken for "already exists"."""

from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.exceptions import ClientError

from smlt.local import conflicts
from smlt.local import server as moto_server
from smlt.runtime import retry
from smlt.runtime.items import SealItem, WorkerItem
from smlt.runtime.records import RunTable, create_run_table
from smlt.runtime.store import S3Store


@pytest.fixture
def clients(monkeypatch, tmp_path):
    # moto as a server, as the local engine runs it: in-process mocking (mock_aws) would store a
    # write even when the injected conflict answers it (botocore calls every before-send handler).
    sleeps: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", sleeps.append)  # the backoff, recorded instead of slept
    server = moto_server.acquire()
    try:
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        conflicts.install(session)  # before its clients are made: they carry the injection
        s3 = session.client("s3", endpoint_url=server.endpoint_url)
        ddb = session.client("dynamodb", endpoint_url=server.endpoint_url)
        name = f"smlt-conflicts-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=name)
        create_run_table(ddb, name)
        yield {"s3": s3, "ddb": ddb, "name": name, "sleeps": sleeps, "tally": tmp_path}
    finally:
        conflicts.arm(None)
        moto_server.release()


def inject(clients, **rates):
    conflicts.arm(conflicts.Plan(rates, seed=1, tally=str(clients["tally"])))


def injected(clients):
    return conflicts.tallied(clients["tally"])


def record(worker=0):
    return WorkerItem(worker=worker, samples=10, memory_mb=1024)


def test_s3_409_is_retried_and_only_412_means_already_exists(clients):
    store = S3Store(clients["name"], client=clients["s3"])
    inject(clients, s3_conflict=0.3)
    assert all(store.put(f"k{i}", b"first", if_absent=True) for i in range(20))
    assert [store.get(f"k{i}") for i in range(20)] == [b"first"] * 20  # a 409 never read as "exists"
    assert not any(store.put(f"k{i}", b"second", if_absent=True) for i in range(20))  # 412
    assert store.get("k0") == b"first"
    assert injected(clients)["s3_conflict"] > 5 and clients["sleeps"]


def test_s3_conflicts_are_retried_a_bounded_number_of_times(clients):
    store = S3Store(clients["name"], client=clients["s3"])
    inject(clients, s3_conflict=1.0)
    with pytest.raises(ClientError) as e:
        store.put("k", b"x", if_absent=True)
    assert e.value.response["Error"]["Code"] == "ConditionalRequestConflict"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    assert injected(clients)["s3_conflict"] == retry.ATTEMPTS
    assert not store.exists("k")
    assert store.put("k", b"x")  # an unconditional PUT has nothing to conflict with


def test_record_transaction_conflicts_are_retried_and_duplicate_means_the_record_is_stored(clients):
    table = RunTable(clients["name"], "run", client=clients["ddb"])
    inject(clients, ddb_conflict=0.3)
    answers = [table.put_unless_sealed(f"WORKER#000000#{w:06d}", record(w), "SEAL#000000") for w in range(12)]
    assert answers == ["written"] * 12
    stored = {r.worker for r in table.workers(0)}
    assert stored == set(range(12))  # every worker told "written" has its record: nothing lost
    again = [table.put_unless_sealed(f"WORKER#000000#{w:06d}", record(w), "SEAL#000000") for w in range(12)]
    assert again == ["duplicate"] * 12
    assert table.put_once("SEAL#000000", SealItem(sealed_at=1.0))[0]  # the aggregator's seal, retried too
    late = [table.put_unless_sealed(f"WORKER#000000#{w:06d}", record(w), "SEAL#000000") for w in range(12, 16)]
    assert late == ["sealed"] * 4
    assert {r.worker for r in table.workers(0)} == stored
    assert injected(clients)["ddb_conflict"] > 5


def test_a_record_transaction_that_keeps_conflicting_fails_instead_of_answering_duplicate(clients):
    table = RunTable(clients["name"], "run", client=clients["ddb"])
    inject(clients, ddb_conflict=1.0)
    with pytest.raises(ClientError) as e:
        table.put_unless_sealed("WORKER#000000#000000", record(), "SEAL#000000")
    assert e.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert "TransactionConflict" in {r["Code"] for r in e.value.response["CancellationReasons"]}
    assert injected(clients)["ddb_conflict"] == retry.ATTEMPTS
    conflicts.arm(None)
    assert table.workers(0) == []


def test_put_once_and_update_retry_transaction_conflicts(clients):
    table = RunTable(clients["name"], "run", client=clients["ddb"])
    inject(clients, ddb_conflict=0.3)
    for rnd in range(10):
        written, _ = table.put_once(f"SEAL#{rnd:06d}", SealItem(sealed_at=float(rnd)))
        assert written
        assert not table.put_once(f"SEAL#{rnd:06d}", SealItem(sealed_at=99.0))[0]
        assert table.update(f"SEAL#{rnd:06d}", SealItem, sealed_at=rnd + 0.5)
    conflicts.arm(None)
    assert [table.get(f"SEAL#{rnd:06d}", SealItem).sealed_at for rnd in range(10)] == [r + 0.5 for r in range(10)]
    inject(clients, ddb_conflict=1.0)
    with pytest.raises(ClientError) as e:
        table.update("SEAL#000000", SealItem, sealed_at=7.0)
    assert e.value.response["Error"]["Code"] == "TransactionConflictException"


class NoReasons:
    """The run table's client, except that its first transactions are cancelled without saying
    why (as moto and older SDKs may answer), before reaching the table."""

    def __init__(self, client, cancel: int):
        self._client, self.cancel = client, cancel

    def __getattr__(self, name):
        return getattr(self._client, name)

    def transact_write_items(self, **kw):
        if self.cancel:
            self.cancel -= 1
            raise ClientError({"Error": {"Code": "TransactionCanceledException"}}, "TransactWriteItems")
        return self._client.transact_write_items(**kw)


def test_a_cancellation_without_reasons_is_decided_by_the_stored_keys(clients):
    table = RunTable(clients["name"], "run", client=NoReasons(clients["ddb"], cancel=2))
    # neither the record nor the seal is stored: not a duplicate, not late; tried again
    assert table.put_unless_sealed("WORKER#000000#00000", record(0), "SEAL#000000") == "written"
    assert [r.worker for r in table.workers(0)] == [0]
    table._client.cancel = 1
    assert table.put_unless_sealed("WORKER#000000#00000", record(0), "SEAL#000000") == "duplicate"
    table.put_once("SEAL#000000", SealItem(sealed_at=1.0))
    table._client.cancel = 1
    assert table.put_unless_sealed("WORKER#000000#00001", record(1), "SEAL#000000") == "sealed"
