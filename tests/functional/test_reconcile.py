"""The reconciliation (smlt.reconcile) on runs the real handlers made on moto: a clean run has no
finding, single and sharded, plain and bf16 with a server learning rate; each kind of tampering
with what is stored (an applied update deleted, a report lost, a model value changed, a ledger
naming a worker twice) is reported."""

import hashlib
import json

import boto3
import numpy as np
import pytest
import safetensors.numpy

from lambdas.train_step.handler import handler as train_step
from smlt.reconcile import reconcile
from smlt.runtime import keys
from smlt.runtime.errors import StaleInvocation
from smlt.runtime.items import Accepted, RoundItem, SealItem, WorkerItem
from smlt.runtime.records import RunTable, to_item
from tests.functional.handlers import conftest as handlers
from tests.functional.handlers import test_buffers as buffers
from tests.functional.handlers.conftest import job
from tests.functional.handlers.test_sharded import aggregate_like_the_state_machine, drive, plan

aws, digits, images = handlers.aws, handlers.digits, buffers.images  # the handlers' moto fixtures
ART, TABLE = "smlt-artifacts", "smlt-runs"


def check(run_id):
    return reconcile(boto3.client("s3"), boto3.client("dynamodb"), ART, TABLE, run_id)


def two_rounds(uri, run_id, **training):
    drive({**job(uri, max_rounds=2, target_value=None, local_steps=5, **training), "run_id": run_id}, run_id)
    found = check(run_id)
    assert found.findings == [], found.findings
    assert [r.round for r in found.rounds if r.trained] == [0, 1] and not found.pending
    assert all(len(r.applied) == 4 for r in found.rounds if r.trained)
    return found


def rewrite_round(run_id, rnd, accepted):
    table = RunTable(TABLE, run_id)
    item = table.get(keys.round_sk(rnd), RoundItem)
    assert item is not None
    item.accepted = accepted
    raw = {"pk": keys.pk(run_id), "sk": keys.round_sk(rnd), **item.attrs()}
    table.client.put_item(TableName=TABLE, Item=to_item(raw))
    return item


def kinds(found, rnd):
    return {(f.kind, f.worker) for f in found.findings if f.round == rnd}


def test_a_clean_run_reconciles(digits, aws):
    found = two_rounds(digits, "clean")
    assert [r.excused for r in found.rounds] == [{}, {}, {}]
    # the final model is model 2, which the evaluation-only round 2 carried over as model 3 (the
    # newest stored model it equals): rounds 0 and 1 trained it, as the run says
    final = json.loads(aws.get_object(Bucket=ART, Key=keys.final_metrics_key("clean"))["Body"].read())["final"]
    assert (found.final_model, found.final_rounds) == (3, 2) == (3, final["rounds"])
    assert found.said == "3 rounds (2 trained into the final model)"


def test_a_final_round_count_that_is_not_the_models_is_reported(digits, aws):
    two_rounds(digits, "count")
    table = RunTable(TABLE, "count")
    meta = table.meta()
    assert meta is not None and meta.final is not None
    meta.final.rounds = 3  # the evaluation round counted as a training round
    raw = {"pk": keys.pk("count"), "sk": keys.META, **meta.attrs()}
    table.client.put_item(TableName=TABLE, Item=to_item(raw))
    (finding,) = check("count").findings
    assert (finding.round, finding.kind) == (2, "rounds")
    assert finding.detail == "META's final says 3 rounds, but the final model is model 3, which 2 rounds trained"


def test_sharded_bf16_with_server_lr_reconciles(digits, aws, monkeypatch):
    """Model 2 is stored as 8 slices of bf16-averaged updates scaled by server_lr 0.5."""
    monkeypatch.setenv("SMLT_AGGREGATOR_READ_BYTES", "1")
    monkeypatch.setenv("SMLT_MIN_SLICE_BYTES", "8192")
    two_rounds(digits, "sliced", compression="bf16", server_lr=0.5)
    listed = aws.list_objects_v2(Bucket=ART, Prefix="runs/sliced/rounds/000002/")["Contents"]
    assert any(o["Key"].endswith("model.slices.json") for o in listed)
    head = aws.get_object(Bucket=ART, Key=keys.update_key("sliced", 1, 0), Range="bytes=0-65535")["Body"].read()
    assert b'"BF16"' in head
    # the list the 8 aggregators averaged must be the ledger
    aws.put_object(Bucket=ART, Key=keys.accepted_key("sliced", 1), Body=b'[{"worker": 0, "samples": 100}]')
    assert {f.kind for f in check("sliced").findings} == {"committed"}


def test_integer_buffers_follow_the_rounded_mean(images, aws):
    """A batch-norm model with fp16 updates: the counters are checked exactly, so one off is found."""
    j = {
        "name": "bn",
        "run_id": "bn",
        "dataset": {"uri": images},
        "model": {"name": "tests.functional.handlers.test_buffers:bn_cnn"},
        "training": {"local_steps": 7, "batch_size": 16, "max_rounds": 2, "compression": "fp16"},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    drive(j, "bn")
    assert check("bn").findings == []
    key = keys.model_key("bn", 2)
    state = safetensors.numpy.load(aws.get_object(Bucket=ART, Key=key)["Body"].read())
    assert int(state["3.num_batches_tracked"]) == 14
    state["3.num_batches_tracked"] += 1
    aws.put_object(Bucket=ART, Key=key, Body=safetensors.numpy.save(state))
    found = check("bn").findings  # the changed object is not the one ROUND 1 recorded, either
    assert [(f.round, f.kind) for f in found] == [(1, "digest"), (1, "model"), (2, "model")]
    assert "model 2 3.num_batches_tracked: 1 of 1 values differ" in found[1].detail


def test_a_deleted_update_is_reported(digits, aws):
    two_rounds(digits, "deleted")
    aws.delete_object(Bucket=ART, Key=keys.update_key("deleted", 1, 2))
    assert kinds(check("deleted"), 1) == {("missing_update", 2)}


def test_a_lost_report_is_reported(digits, aws):
    """Worker 3's record gone and the ledger without it, as when a conflict was answered
    'duplicate' with no record stored: its update (uploaded before the seal) is unexplained, and
    model 2 is not what the remaining ledger makes of model 1."""
    two_rounds(digits, "lost")
    aws_ddb = boto3.client("dynamodb")
    aws_ddb.delete_item(TableName=TABLE, Key=to_item({"pk": keys.pk("lost"), "sk": keys.worker_sk(1, 3)}))
    item = RunTable(TABLE, "lost").get(keys.round_sk(1), RoundItem)
    assert item is not None
    rewrite_round("lost", 1, [a for a in item.accepted if a.worker != 3])
    assert kinds(check("lost"), 1) == {("unexplained_update", 3), ("model", None)}


def test_an_update_stored_after_the_seal_is_excused_as_late(digits, aws):
    """S3 times objects to the second: an upload counts as late from the second after the seal on
    (the seal is moved 2 s back here, as if the upload came 2 s after it)."""
    two_rounds(digits, "late")
    table = RunTable(TABLE, "late")
    seal = table.get(keys.seal_sk(1), SealItem)
    assert seal is not None
    raw = {"pk": keys.pk("late"), "sk": keys.seal_sk(1), "sealed_at": seal.sealed_at - 2}
    table.client.put_item(TableName=TABLE, Item=to_item(raw))
    blob = aws.get_object(Bucket=ART, Key=keys.update_key("late", 1, 0))["Body"].read()
    aws.put_object(Bucket=ART, Key=keys.update_key("late", 1, 7), Body=blob)
    found = check("late")
    assert found.findings == []
    assert found.rounds[1].excused == {7: "late: uploaded after the round was sealed"}


def test_a_straggler_whose_record_the_seal_refused_is_excused(digits, aws, monkeypatch):
    """A real straggler: the round is aggregated (sealed) while its last worker, its update
    uploaded, reports; the seal refuses its record. Its update is in the bucket, stored before or
    in the second of the seal, and its own ATTEMPT item says why it is not applied."""
    j = {**job(digits, max_rounds=2, target_value=None, local_steps=5), "run_id": "straggler"}
    p = plan(j, "straggler")
    *first, last = p["workers"]
    for w in first:
        train_step({"run_id": "straggler", "round": 0, "worker": w}, None)
    reporting = RunTable.put_unless_sealed

    def sealed_first(self, sk, item, seal_sk):
        aggregate_like_the_state_machine(p)  # the round closes before the straggler's record lands
        return reporting(self, sk, item, seal_sk)

    with monkeypatch.context() as m, pytest.raises(StaleInvocation, match="closed before worker"):
        m.setattr(RunTable, "put_unless_sealed", sealed_first)
        train_step({"run_id": "straggler", "round": 0, "worker": last}, None)
    found = check("straggler")
    assert found.findings == [], found.findings
    (r0,) = found.rounds
    assert r0.applied == first and list(r0.excused) == [last]
    assert r0.excused[last].startswith("late: its record was refused by the seal")
    # without the attempt's own word, an update of no record stored before the seal is unexplained
    table = RunTable(TABLE, "straggler")
    for a in table.query("ATTEMPT#000000#"):
        if a.get("worker") == last:
            table.client.delete_item(TableName=TABLE, Key=to_item({"pk": a["pk"], "sk": a["sk"]}))
    assert kinds(check("straggler"), 0) == {("unexplained_update", last)}


def test_a_changed_model_value_is_reported(digits, aws):
    two_rounds(digits, "changed")
    key = keys.model_key("changed", 2)
    state = safetensors.numpy.load(aws.get_object(Bucket=ART, Key=key)["Body"].read())
    name = sorted(state)[0]
    state[name].flat[5] += np.float32(1e-3)
    aws.put_object(Bucket=ART, Key=key, Body=safetensors.numpy.save(state))
    found = check("changed")
    assert kinds(found, 1) == {("model", None), ("digest", None)}  # nor is it the object ROUND 1 recorded
    # model 2 is also what the evaluation round 2 carries over: model 3 no longer equals it
    assert kinds(found, 2) == {("model", None)}
    assert f"model 2 {name}: 1 of" in next(f.detail for f in found.findings if f.kind == "model")


def test_a_ledger_naming_a_worker_twice_is_reported(digits, aws):
    two_rounds(digits, "twice")
    item = RunTable(TABLE, "twice").get(keys.round_sk(0), RoundItem)
    assert item is not None
    rewrite_round("twice", 0, [*item.accepted, Accepted(worker=1, samples=item.accepted[1].samples)])
    found = check("twice")
    # worker 1 weighs twice in the recomputed mean, so model 1 differs as well
    assert kinds(found, 0) == {("applied_twice", 1), ("model", None)}
    assert json.loads(found.model_dump_json())["run_id"] == "twice"


def test_a_truncated_update_is_reported_not_raised(digits, aws):
    two_rounds(digits, "cut")
    key = keys.update_key("cut", 1, 1)
    blob = aws.get_object(Bucket=ART, Key=key)["Body"].read()
    aws.put_object(Bucket=ART, Key=key, Body=blob[:-100])
    found = check("cut")
    assert [(f.round, f.kind) for f in found.findings] == [(1, "digest"), (1, "unreadable")]
    assert key in found.findings[0].detail and "cannot be read" in found.findings[1].detail


def test_a_diverged_round_excuses_its_updates_and_keeps_the_model(digits, aws):
    """Worker 2's update turned NaN in storage: round 1 diverges, applies nothing, model 2 = model 1."""
    from tests.functional.handlers.test_sharded import aggregate_like_the_state_machine, plan

    j = job(digits, target_value=None, local_steps=5)
    for rnd in (0, 1):
        p = plan(j, "nan")
        for w in p["workers"]:
            train_step({"run_id": "nan", "round": rnd, "worker": w}, None)
        if rnd == 1:
            key = keys.update_key("nan", 1, 2)
            state = safetensors.numpy.load(aws.get_object(Bucket=ART, Key=key)["Body"].read())
            state[sorted(state)[0]].flat[0] = np.nan
            head = aws.get_object(Bucket=ART, Key=key, Range="bytes=0-65535")["Body"].read()
            meta = json.loads(head[8 : 8 + int.from_bytes(head[:8], "little")])
            blob = safetensors.numpy.save(state, metadata=meta["__metadata__"])
            aws.put_object(Bucket=ART, Key=key, Body=blob)
            # as if the worker itself had made it (its record's digest is of this object): a
            # damaged object is refused by its digest instead (tests/functional/test_integrity.py)
            RunTable("smlt-runs", "nan").update(
                keys.worker_sk(1, 2), WorkerItem, update_sha256=hashlib.sha256(blob).hexdigest()
            )
        aggregate_like_the_state_machine(p)
    found = check("nan")
    assert found.findings == [] and not found.rounds[1].trained and found.rounds[1].applied == []
    assert set(found.rounds[1].excused) == {0, 1, 2, 3}
    assert all(r.startswith("round diverged: ") for r in found.rounds[1].excused.values())
    # and a changed model 2 is still found: a diverged round must carry model 1 over exactly
    key = keys.model_key("nan", 2)
    state = safetensors.numpy.load(aws.get_object(Bucket=ART, Key=key)["Body"].read())
    state[sorted(state)[0]].flat[3] += np.float32(1e-6)
    aws.put_object(Bucket=ART, Key=key, Body=safetensors.numpy.save(state))
    assert [(f.round, f.kind) for f in check("nan").findings] == [(1, "digest"), (1, "model")]


def test_a_round_whose_attempts_are_all_gone_is_unbilled_not_skipped(digits, aws):
    """A run that records ATTEMPT items: a round without any (its workers' and its aggregation's
    deleted) is a finding; before, such a round was taken for one run before invocations recorded
    them, and its bill's absence passed as nothing to check."""
    two_rounds(digits, "nobill")
    table = RunTable(TABLE, "nobill")
    for a in table.query("ATTEMPT#000001#"):
        table.client.delete_item(TableName=TABLE, Key=to_item({"pk": a["pk"], "sk": a["sk"]}))
    found = check("nobill")
    assert {(f.kind, f.worker) for f in found.findings} == {("unbilled", None)}
    assert [f.round for f in found.findings] == [1]
