"""A worker whose update is finite but 1000x too large (a bad worker, not a damaged object: its
record's digest is of that update) is refused by the norm guard with its reason, the run reaches
its target as the fault-free run does, and the reconciliation excuses the refusal only when it
holds. On moto, with the real digits data."""

import hashlib
import json

import boto3
import numpy as np
import safetensors.numpy

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.reconcile import reconcile
from smlt.runtime import keys
from smlt.runtime.items import Rejected, RoundItem, WorkerItem
from smlt.runtime.records import RunTable, to_item
from tests.functional.handlers import conftest as handlers
from tests.functional.handlers.conftest import job
from tests.functional.handlers.test_sharded import plan

aws, digits = handlers.aws, handlers.digits  # the handlers' moto fixtures
ART, TABLE = "smlt-artifacts", "smlt-runs"
BAD = 2  # the worker whose update is scaled


def scale_update(run_id: str, rnd: int, worker: int, factor: float) -> None:
    """Worker `worker`'s update times `factor`, as if the worker had sent it (its record's digest too)."""
    s3 = boto3.client("s3")
    key = keys.update_key(run_id, rnd, worker)
    blob = s3.get_object(Bucket=ART, Key=key)["Body"].read()
    head = blob[8 : 8 + int.from_bytes(blob[:8], "little")]
    metadata = json.loads(head).get("__metadata__")
    state = {
        k: (v * np.float32(factor) if v.dtype == np.float32 else v) for k, v in safetensors.numpy.load(blob).items()
    }
    scaled = safetensors.numpy.save(state, metadata=metadata)
    s3.put_object(Bucket=ART, Key=key, Body=scaled)
    RunTable(TABLE, run_id).update(
        keys.worker_sk(rnd, worker), WorkerItem, update_sha256=hashlib.sha256(scaled).hexdigest()
    )


def drive(j, run_id, factor=None):
    for _ in range(40):
        p = plan(j, run_id)
        if p["action"] == "stop":
            break
        for w in p["workers"]:
            train_step({"run_id": run_id, "round": p["round"], "worker": w}, None)
        if factor is not None and BAD in p["workers"] and not RunTable(TABLE, run_id).plan(p["round"]).spec.eval_only:
            scale_update(run_id, p["round"], BAD, factor)
        if aggregate({"run_id": run_id, "round": p["round"]}, None)["stop"]:
            break
    return planner({"op": "finalize", "run_id": run_id}, None)


def check(run_id):
    return reconcile(boto3.client("s3"), boto3.client("dynamodb"), ART, TABLE, run_id)


def test_a_1000x_update_is_refused_and_the_run_reaches_its_target(digits, aws):
    j = job(digits, target_value=0.95, max_rounds=30)
    clean = drive(j, "clean")
    faulty = drive(j, "x1000", factor=1000.0)
    assert clean["val_accuracy"] >= 0.95 and faulty["val_accuracy"] >= 0.95
    assert abs(faulty["val_accuracy"] - clean["val_accuracy"]) <= 0.03
    rounds = [r for r in RunTable(TABLE, "x1000").rounds() if not r.eval_only]
    assert rounds and all([x.worker for x in r.rejected] == [BAD] for r in rounds)
    assert all(BAD not in [a.worker for a in r.accepted] for r in rounds)
    assert "more than 10x the round's median update norm" in rounds[0].rejected[0].reason
    found = check("x1000")
    assert found.ok, found.findings
    assert all(c.excused[BAD].startswith("rejected: update norm") for c in found.rounds if c.trained)


def test_the_reconciliation_finds_an_honest_update_refused(digits, aws):
    j = job(digits, target_value=None, max_rounds=2, local_steps=5)
    drive(j, "honest")
    assert check("honest").ok
    # a ROUND item that says it refused worker 1, whose update is intact and ordinary
    table = RunTable(TABLE, "honest")
    item = table.get(keys.round_sk(1), RoundItem)
    assert item is not None
    item.accepted = [a for a in item.accepted if a.worker != 1]
    item.rejected = [Rejected(worker=1, reason="update norm 1e9 is more than 10x the median")]
    raw = {"pk": keys.pk("honest"), "sk": keys.round_sk(1), **RoundItem.model_validate(item.model_dump()).attrs()}
    table.client.put_item(TableName=TABLE, Item=to_item(raw))
    kinds = {(f.kind, f.worker) for f in check("honest").findings if f.round == 1}
    assert ("rejected", 1) in kinds


def test_a_sharded_round_refuses_a_1000x_update(digits, aws, monkeypatch):
    from tests.functional.handlers.test_sharded import aggregate_like_the_state_machine

    monkeypatch.setenv("SMLT_AGGREGATOR_READ_BYTES", "1")
    monkeypatch.setenv("SMLT_MIN_SLICE_BYTES", "8192")
    j = {**job(digits, target_value=None, max_rounds=2, local_steps=5), "run_id": "shx"}
    for rnd in (0, 1):
        p = plan(j, "shx")
        for w in p["workers"]:
            train_step({"run_id": "shx", "round": rnd, "worker": w}, None)
        if rnd == 1:
            assert p["aggregators"] > 1
            scale_update("shx", 1, BAD, 1000.0)
        aggregate_like_the_state_machine(p)
    item = RunTable(TABLE, "shx").get(keys.round_sk(1), RoundItem)
    assert item is not None and [r.worker for r in item.rejected] == [BAD]
    assert "more than 10x the round's median update norm" in item.rejected[0].reason
    assert BAD not in [a.worker for a in item.accepted] and len(item.accepted) == 3
    found = check("shx")
    assert found.ok, found.findings
