"""Stored models and updates carry the sha256 they were written with, and every read checks it: a
damaged model is a named error naming its key and both digests, a damaged update is refused with
that reason and never averaged, and the reconciliation names a stored object whose digest is wrong.
On moto, with the real digits data."""

import hashlib

import boto3
import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.reconcile import reconcile
from smlt.runtime import keys
from smlt.runtime.errors import DigestMismatch
from smlt.runtime.items import MetaItem, RoundItem, WorkerItem
from smlt.runtime.records import RunTable
from tests.functional.handlers import conftest as handlers
from tests.functional.handlers.conftest import job
from tests.functional.handlers.test_sharded import aggregate_like_the_state_machine, drive, plan

aws, digits = handlers.aws, handlers.digits  # the handlers' moto fixtures
ART, TABLE = "smlt-artifacts", "smlt-runs"


def sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def get(key: str) -> bytes:
    return boto3.client("s3").get_object(Bucket=ART, Key=key)["Body"].read()


def put(key: str, blob: bytes) -> None:
    boto3.client("s3").put_object(Bucket=ART, Key=key, Body=blob)


def flip(key: str, at: int = -5) -> None:
    """One byte of the object flipped (in its data section: it still parses)."""
    blob = bytearray(get(key))
    blob[at] ^= 0x01
    put(key, bytes(blob))


def check(run_id):
    return reconcile(boto3.client("s3"), boto3.client("dynamodb"), ART, TABLE, run_id)


def round_item(run_id, rnd) -> RoundItem:
    item = RunTable(TABLE, run_id).get(keys.round_sk(rnd), RoundItem)
    assert item is not None
    return item


def train_round(j, run_id):
    p = plan(j, run_id)
    for w in p["workers"]:
        train_step({"run_id": run_id, "round": p["round"], "worker": w}, None)
    return p


def test_every_stored_model_and_update_has_the_digest_of_its_item(digits, aws):
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=3), "run_id": "dig"}
    drive(j, "dig")
    table = RunTable(TABLE, "dig")
    meta = table.meta()  # finalized
    assert meta is not None and meta.model0_sha256 == sha(get(keys.model_key("dig", 0)))
    for rnd in (0, 1):
        assert round_item("dig", rnd).model_sha256 == sha(get(keys.model_key("dig", rnd + 1)))
        records = table.workers(rnd)
        assert len(records) == 4
        for r in records:
            assert r.update_sha256 == sha(get(keys.update_key("dig", rnd, r.worker)))
    assert meta.final is not None and meta.final.model_sha256 == sha(get(keys.final_model_key("dig")))
    assert check("dig").ok
    flip(keys.final_model_key("dig"))
    (finding,) = check("dig").findings
    assert finding.kind == "digest" and keys.final_model_key("dig") in finding.detail


def test_a_flipped_byte_in_an_update_is_refused_never_averaged(digits, aws):
    j = job(digits, max_rounds=2, target_value=None, local_steps=3)
    train_round(j, "upd")
    key = keys.update_key("upd", 0, 1)
    recorded = RunTable(TABLE, "upd").get(keys.worker_sk(0, 1), WorkerItem).update_sha256  # type: ignore[union-attr]
    flip(key)
    aggregate({"run_id": "upd", "round": 0}, None)
    item = round_item("upd", 0)
    assert [a.worker for a in item.accepted] == [0, 2, 3]
    (rejected,) = item.rejected
    assert rejected.worker == 1 and key in rejected.reason
    assert recorded in rejected.reason and sha(get(key)) in rejected.reason  # both digests
    found = check("upd")  # model 1 is the mean of the other three, and the refusal holds
    assert found.ok, found.findings
    assert found.rounds[0].excused[1].startswith("rejected: ")


def test_a_flipped_byte_in_model_r_is_a_named_error_for_its_workers(digits, aws):
    j = job(digits, max_rounds=3, target_value=None, local_steps=3)
    train_round(j, "mdl")
    aggregate({"run_id": "mdl", "round": 0}, None)
    key = keys.model_key("mdl", 1)
    recorded = round_item("mdl", 0).model_sha256
    flip(key)
    p = plan(j, "mdl")
    with pytest.raises(DigestMismatch) as e:
        train_step({"run_id": "mdl", "round": 1, "worker": p["workers"][0]}, None)
    assert key in str(e.value) and recorded in str(e.value) and sha(get(key)) in str(e.value)
    assert e.value.key == key and e.value.expected == recorded
    # the worker left the reason where the aggregator reads it: the run fails with it by name
    with pytest.raises(DigestMismatch, match=f"worker 0: model 1 {key} has sha256"):
        aggregate({"run_id": "mdl", "round": 1}, None)


def test_the_aggregator_checks_model_r_itself(digits, aws):
    """Model 1 damaged after its workers read it: the aggregator refuses to build model 2 on it."""
    j = job(digits, max_rounds=3, target_value=None, local_steps=3)
    train_round(j, "agg")
    aggregate({"run_id": "agg", "round": 0}, None)
    train_round(j, "agg")
    flip(keys.model_key("agg", 1))
    with pytest.raises(DigestMismatch, match=keys.model_key("agg", 1)):
        aggregate({"run_id": "agg", "round": 1}, None)
    assert keys.model_key("agg", 2) not in {
        o["Key"] for o in aws.list_objects_v2(Bucket=ART, Prefix="runs/agg/")["Contents"]
    }


def test_round_0s_model_is_checked_against_the_first_workers_digest(digits, aws):
    """Round 0's model is written first-writer-wins by its workers; the first to hold it records its
    digest in META and a later worker reading a different object fails by name."""
    j = job(digits, max_rounds=2, target_value=None, local_steps=3)
    p = plan(j, "zero")
    train_step({"run_id": "zero", "round": 0, "worker": 0}, None)
    meta = RunTable(TABLE, "zero").meta()
    assert meta is not None and meta.model0_sha256 == sha(get(keys.model_key("zero", 0)))
    flip(keys.model_key("zero", 0))
    from smlt.runtime.steps import train

    train._MODEL_CACHE.clear()  # as another process would: read model 0 from the store
    with pytest.raises(DigestMismatch, match=keys.model_key("zero", 0)):
        train_step({"run_id": "zero", "round": 0, "worker": p["workers"][1]}, None)


def test_finalize_refuses_a_damaged_final_model(digits, aws):
    j = job(digits, max_rounds=1, target_value=None, local_steps=3)
    for _ in range(2):  # round 0, then the evaluation round of model 1
        p = train_round(j, "fin")
        aggregate_like_the_state_machine(p)
    assert plan(j, "fin")["action"] == "stop"
    flip(keys.model_key("fin", 1))
    with pytest.raises(DigestMismatch, match=keys.model_key("fin", 1)):
        planner({"op": "finalize", "run_id": "fin"}, None)
    listed = {o["Key"] for o in aws.list_objects_v2(Bucket=ART, Prefix="runs/fin/")["Contents"]}
    assert keys.final_model_key("fin") not in listed


def test_the_reconciliation_names_an_object_whose_digest_is_wrong(digits, aws):
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=3), "run_id": "rec"}
    drive(j, "rec")
    assert check("rec").ok
    # an applied update replaced after its round, and a model whose ROUND item recorded another digest
    key = keys.update_key("rec", 1, 2)
    flip(key)
    found = check("rec")
    assert [(f.round, f.kind, f.worker) for f in found.findings if f.kind == "digest"] == [(1, "digest", 2)]
    assert key in next(f.detail for f in found.findings if f.kind == "digest")
    table = RunTable(TABLE, "rec")
    table.update(keys.round_sk(0), RoundItem, model_sha256="0" * 64)
    table.update(keys.META, MetaItem, model0_sha256="1" * 64)
    details = [f.detail for f in check("rec").findings if f.kind == "digest" and f.round == 0]
    assert any(keys.model_key("rec", 1) in d and "0" * 64 in d for d in details)
    assert any(keys.model_key("rec", 0) in d and "1" * 64 in d for d in details)


def test_sharded_rounds_record_and_check_the_digest_of_their_slices(digits, aws, monkeypatch):
    monkeypatch.setenv("SMLT_AGGREGATOR_READ_BYTES", "1")
    monkeypatch.setenv("SMLT_MIN_SLICE_BYTES", "8192")
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=3), "run_id": "slc"}
    drive(j, "slc")
    listed = {o["Key"] for o in aws.list_objects_v2(Bucket=ART, Prefix="runs/slc/")["Contents"]}
    assert keys.slices_manifest_key("slc", 2) in listed and keys.model_key("slc", 2) not in listed
    assert round_item("slc", 1).model_sha256 is not None and check("slc").ok
    flip(keys.slice_key("slc", 2, 0, round_item("slc", 1).aggregators))
    found = check("slc")
    assert any(f.kind == "digest" and keys.slices_manifest_key("slc", 2) in f.detail for f in found.findings)
    with pytest.raises(DigestMismatch, match=keys.slices_manifest_key("slc", 2)):
        planner({"op": "finalize", "run_id": "slc"}, None)


def test_a_worker_whose_update_was_stored_first_records_the_stored_ones_digest(digits, aws):
    """Another invocation of the worker stored its update first: the record describes that one."""
    from smlt.runtime.tensors.format import decode, encode

    j = job(digits, max_rounds=2, target_value=None, local_steps=3)
    train_round(j, "first")  # the updates of run "first", round 0
    theirs = get(keys.update_key("first", 0, 1))
    p = plan(j, "second")
    other = encode({k: v * 0 for k, v in decode(theirs).items()}, {"samples": "7", "train_loss": "0.5"})
    put(keys.update_key("second", 0, 1), other)
    train_step({"run_id": "second", "round": 0, "worker": p["workers"][1]}, None)
    record = RunTable(TABLE, "second").get(keys.worker_sk(0, 1), WorkerItem)
    assert record is not None and record.samples == 7 and record.update_sha256 == sha(other) != sha(theirs)


def test_a_sharded_round_refuses_a_damaged_update_and_makes_model_r1_without_it(digits, aws, monkeypatch):
    monkeypatch.setenv("SMLT_AGGREGATOR_READ_BYTES", "1")
    monkeypatch.setenv("SMLT_MIN_SLICE_BYTES", "8192")
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=3), "run_id": "shd"}
    p = train_round(j, "shd")
    aggregate_like_the_state_machine(p)
    p = train_round(j, "shd")
    assert p["aggregators"] > 1
    key = keys.update_key("shd", 1, 3)
    flip(key)
    aggregate_like_the_state_machine(p)
    item = round_item("shd", 1)
    assert [a.worker for a in item.accepted] == [0, 1, 2]
    assert [r.worker for r in item.rejected] == [3] and key in item.rejected[0].reason
    assert item.model_sha256 == sha(get(keys.model_key("shd", 2)))  # one object: it wins over the slices
    found = check("shd")  # model 2 is the mean of the other three
    assert found.ok, found.findings
